"""A gang's run, rank by rank (``gang_rank_ended``): the nodes report each rank's end, and the
gang ends as one job -- once its last rank has exited."""

from __future__ import annotations

from dataclasses import replace

from hier_sched.core.events import Command, RunEnded, Stop
from hier_sched.core.failures import Failure
from hier_sched.core.managed_job import ManagedJob

__all__ = ["gang_rank_ended"]


def gang_rank_ended(job: ManagedJob, e: RunEnded, out: list[Command]) -> RunEnded | None:
    """A gang is one job: its run ends when its last rank has ended -- well, with the requeue
    code after a checkpoint, or failed: the first rank that fails stops the others, and its
    failure is the gang's. Until the last rank has exited the gang is not requeued: a new run
    would meet the old ranks still on their GPUs. Returns the event that ends the whole run,
    or None while ranks still run."""
    if e.node not in job.ranks_running:
        return None  # a repeated report
    job.ranks_running.discard(e.node)
    if e.peak_mib:
        job.record.observe_peak(e.peak_mib)
    failure = e.failure
    if failure is None or failure.kind == "checkpoint_requeue":
        job.ranks_requeue |= failure is not None
    elif job.gang_failed is None:
        job.gang_failed = e
        if job.ranks_running:
            out.append(Stop(e.job_id, e.attempt, f"gang rank on {e.node} failed: {failure.reason}",
                            nodes=tuple(n for n in job.nodes if n in job.ranks_running)))
    if job.ranks_running:
        return None
    if job.gang_failed is not None:
        return replace(job.gang_failed, node=None)
    if job.ranks_requeue:
        return replace(e, failure=Failure("checkpoint_requeue", "every rank checkpointed"), node=None)
    return replace(e, node=None)
