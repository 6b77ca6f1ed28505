"""The job ticket, built once for both shells: what the scheduler knows of a job at submission.

The live queue builds one from a validated ``JobSpec`` (``spec.ticket_for_spec``), the replay from
a trace job; both give the same inputs here, so the signature ("the same job", for learned peaks
and run times) is computed alike, and the slot defaults are ``slots``'. The signature leaves the
GPU type out: the type is where a run ran, and peaks are learned per (signature, type).
"""

from __future__ import annotations

from hier_sched.core.estimate_rules import Belief
from hier_sched.core.events import JobTicket
from hier_sched.core.learning import job_signature
from hier_sched.core.slots import Slot

__all__ = ["make_ticket"]


def make_ticket(job_id: str, name: str, *, workload: str, batch_size: int | None, gpus: int,
                gpus_per_node: int | None, belief: Belief, priority: int = 0,
                slot: Slot | None = None, max_attempts: int | None = None, max_retries: int | None = None,
                retry_exit_codes: tuple[int, ...] | None = None, queue: str | None = None,
                checkpoints: bool = False, user: str = "default", gpu_types: tuple[str, ...] = (),
                priority_class: str | None = None, preemptible: bool | None = None) -> JobTicket:
    return JobTicket(
        job_id, name, gpus=gpus, gpus_per_node=gpus_per_node, need_mib=belief.need_mib,
        estimate_source=belief.source, smact=belief.smact, priority=priority,
        signature=job_signature(workload, batch_size, gpus), learn_peak=belief.learns,
        max_attempts=max_attempts, max_retries=max_retries, retry_exit_codes=retry_exit_codes,
        queue=queue, checkpoints=checkpoints, user=user, needs=belief.needs, gpu_types=gpu_types,
        priority_class=priority_class, preemptible=preemptible,
        **({} if slot is None else {"slot_s": slot.length_s, "slot_grace_s": slot.grace_s,
                                     "kill_after_s": slot.kill_after_s, "slot_extends": slot.extends}),
    )
