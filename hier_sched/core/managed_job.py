"""One job as the scheduler keeps it (``ManagedJob``): its ticket, public record, queue entry and run.

Every part of the scheduler works on these; shells read them only through ``views.JobView``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hier_sched.core.events import JobTicket, RunEnded
from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobRecord, JobState
from hier_sched.core.queueing import QueuedJob
from hier_sched.core.quotas import Charge

__all__ = ["ManagedJob", "RUN_STATES", "UNSAVED_PREEMPTIONS_LIMIT", "held", "where"]

RUN_STATES = (JobState.RUNNING, JobState.CHECKPOINTING)  # the states of a job with a run
# Preemptions in a row (slot ends, reclaims) whose runs were stopped before they checkpointed: a
# job at this many runs to its end, without a slot and never reclaimed. Without it, a job that
# never checkpoints in its grace (none written, a save slower than the grace, the signal landing
# in its start-up) restarts from scratch at every slot's end, for ever. Two: one can be bad luck.
UNSAVED_PREEMPTIONS_LIMIT = 2


@dataclass(slots=True)
class ManagedJob:
    """One job as the scheduler keeps it: the public record, the queue entry and the run."""

    ticket: JobTicket
    record: JobRecord
    queued: QueuedJob
    placements: tuple[Placement, ...] = ()  # of the current run
    run_started_s: float | None = None
    executed_s: float = 0.0  # run time of the runs that ended
    other_failures: int = 0
    cancel_requested: bool = False
    # runs that ended without a checkpoint (slot end, node lost or drained): redone from the last one
    lost_runs: int = 0
    nodes_ran: list[str] = field(default_factory=list)  # every node a run went to, first time first (logs)
    ranks_running: set[str] = field(default_factory=set)  # a gang's nodes whose rank has not ended yet
    ranks_requeue: bool = False  # a rank of this gang run exited to be requeued (checkpointed)
    preemptions: int = 0  # checkpoint signals at the end of a time slot or to reclaim a queue's quota
    unsaved_preemptions: int = 0  # of them, those in a row whose run was stopped before it checkpointed
    reclaimed_for: str | None = None  # the queue its run was signalled to make room for (``quotas``)
    drained_from: str | None = None  # the node whose drain signalled its run (``drains``)
    # Why a drain's deadline stopped its run (``RunEvicted``): the job is requeued once the run has
    # ended, never before -- requeued at the stop, it could start elsewhere while this run exits.
    evicted_for: str | None = None
    gang_failed: RunEnded | None = None  # the first rank of this gang run that failed: the gang's end
    declined_for: str | None = None  # why a node declined its part of this gang: taken back once the started ranks exit

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placements)

    @property
    def may_resume(self) -> bool:
        """An earlier run may have left a checkpoint: it checkpointed, or lost a run (slot end, node
        lost) after which the job resumes from its last checkpoint, if any."""
        return self.record.checkpoints > 0 or self.lost_runs > 0

    @property
    def runs_to_end(self) -> bool:
        """Its runs are no longer preempted (``UNSAVED_PREEMPTIONS_LIMIT``): no slot, no reclaim."""
        return self.unsaved_preemptions >= UNSAVED_PREEMPTIONS_LIMIT

    def live_ranks(self) -> Iterator[Placement]:
        """The placements of its run that still hold their GPUs: every one, except a gang's ranks
        that have ended."""
        gang = len(self.placements) > 1
        return (p for p in self.placements if not gang or p.node in self.ranks_running)


def held(placements: Sequence[Placement]) -> Charge:
    """What a run holds: its GPUs and the memory reserved on them."""
    return Charge(sum(len(p.gpus) for p in placements), sum(p.reserved_mib * len(p.gpus) for p in placements))


def where(placements: Sequence[Placement]) -> str:
    return " + ".join(f"{p.node} GPU(s) {list(p.gpus)}" for p in placements)
