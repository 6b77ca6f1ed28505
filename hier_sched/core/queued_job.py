"""A job waiting for GPUs as the queue sees it (``QueuedJob``), the queue's settings, and its order.

The order (``queue_key``): the recovery queue (jobs that crashed with OOM) first, then by
priority, then (with ``gangs_first``) multi-GPU jobs before single-GPU ones, then by submission
time. A job's key does not change while it waits, so the queue (``job_queue.JobQueue``) keeps its
jobs sorted by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hier_sched.core.quotas import DEFAULT_QUEUE, Charge
from hier_sched.core.recovery import RecoveryPolicy

__all__ = ["QueuedJob", "QueueConfig", "queue_key", "queue_order"]


@dataclass(slots=True)
class QueuedJob:
    """A job waiting for GPUs, as the scheduler sees it."""

    job_id: str
    submit_s: float  # ordering time (a requeued job goes to the back: its requeue time)
    gpus: int = 1
    gpus_per_node: int | None = None
    need_mib: float | None = None  # memory estimate per GPU (None: no estimate)
    smact: float | None = None  # utilization estimate
    priority: int = 0
    seq: int = 0  # tie-break, assigned by the queue owner
    oom_count: int = 0
    observed_peak_mib: float | None = None
    exclusive: bool = False  # asks for idle GPUs regardless of policy
    waiting_since_s: float | None = None  # set by the owner when the job first blocks the head
    held: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (node, GPUs) kept free for it; set by the owner
    queue: str = DEFAULT_QUEUE  # its team queue (``quotas``)
    # Its need on GPU types where it differs from ``need_mib`` ((type, MiB); ``JobTicket.needs`` and
    # the peaks learned per type), and the types it may run on (globs; (): any).
    needs: tuple[tuple[str, float], ...] = ()
    gpu_types: tuple[str, ...] = ()

    def need_on(self, gpu_type: str) -> float | None:
        """The need per GPU on a GPU of ``gpu_type``."""
        for name, mib in self.needs:
            if name == gpu_type:
                return mib
        return self.need_mib

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node if self.gpus_per_node else 1

    @property
    def per_node(self) -> int:
        return self.gpus_per_node or self.gpus

    def charge(self, no_estimate_mib: float) -> Charge:
        """What it would charge its team queue (``quotas``): its GPUs, a gang's whole, and the
        memory it asks for on them (on the GPU type that asks most; none: the no-estimate gate's)."""
        needs = [mib for mib in (self.need_mib, *(mib for _, mib in self.needs)) if mib is not None]
        return Charge(self.gpus, (max(needs) if needs else no_estimate_mib) * self.gpus)

    @property
    def recovering(self) -> bool:
        return self.oom_count > 0


@dataclass(frozen=True, slots=True)
class QueueConfig:
    strict_fifo: bool = True  # the thesis: only the head may start
    head_wait_limit_s: float = 3600.0  # a head blocked this long gets GPUs held for it
    backfill_depth: int = 256  # jobs looked at past a blocked head per cycle
    nodes_tried: int = 64  # candidate nodes tried per job per cycle, best first
    # Multi-GPU jobs before single-GPU ones of the same priority: they need several GPUs with room
    # at once, so backfilling around them starves them; first in line, they get the first pick
    # when GPUs free up (largest-job-first), and while they wait the others still backfill.
    gangs_first: bool = False
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    # The most jobs one cycle starts (None: no limit; Slurm's ``sched_max_job_start``). A live tick
    # carries out what it decided before the next one: thousands of starts in one tick would hold
    # the queue's lock, and every submission behind it, for seconds. The rest start next cycle.
    starts_per_cycle: int | None = None


def queue_key(job: QueuedJob, gangs_first: bool = False) -> tuple[bool, int, int, float, int]:
    """The job's place in the queue (smallest first). It depends only on fields that do not
    change while the job waits, so a queue owner may keep its jobs sorted by it."""
    return (not job.recovering, -job.priority, -job.gpus if gangs_first else 0, job.submit_s, job.seq)


def queue_order(jobs: Iterable[QueuedJob], gangs_first: bool = False) -> list[QueuedJob]:
    return sorted(jobs, key=lambda j: queue_key(j, gangs_first))
