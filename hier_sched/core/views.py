"""What a shell may read of the scheduler's jobs: read-only views, never the jobs themselves.

``JobView`` is a proxy over one job as the scheduler keeps it (``managed_job.ManagedJob``), not a
copy: handing one out costs nothing (the replay asks for one per job) and it is always current.
It has no setters; the sequences it returns (``history``) are the scheduler's own and are only
to be read. ``SchedulerCounts`` are the queue's numbers at one moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobState
from hier_sched.core.managed_job import ManagedJob

__all__ = ["JobView", "SchedulerCounts"]


class JobView:
    __slots__ = ("_job",)

    def __init__(self, job: ManagedJob):
        self._job = job

    def __repr__(self) -> str:
        return f"JobView({self.job_id!r}, {self.state.value})"

    @property
    def job_id(self) -> str:
        return self._job.ticket.job_id

    @property
    def state(self) -> JobState:
        return self._job.record.state

    @property
    def done(self) -> bool:
        return self._job.record.done

    @property
    def attempts(self) -> int:
        return self._job.record.attempts

    @property
    def oom_crashes(self) -> int:
        return self._job.record.oom_crashes

    @property
    def checkpoints(self) -> int:
        return self._job.record.checkpoints

    @property
    def preemptions(self) -> int:
        return self._job.preemptions

    @property
    def lost_runs(self) -> int:
        return self._job.lost_runs

    @property
    def submit_time(self) -> float:
        return self._job.record.submit_time

    @property
    def start_time(self) -> float | None:
        return self._job.record.start_time

    @property
    def end_time(self) -> float | None:
        return self._job.record.end_time

    @property
    def executed_s(self) -> float:
        return self._job.executed_s

    @property
    def estimate_mib(self) -> float | None:
        return self._job.record.estimate_mib

    @property
    def estimate_source(self) -> str:
        return self._job.record.estimate_source

    @property
    def observed_peak_mib(self) -> float | None:
        return self._job.record.observed_peak_mib

    @property
    def reason(self) -> str:
        """The last transition's reason (``Scheduler.reason`` also explains why a queued job waits)."""
        return self._job.record.reason

    @property
    def history(self) -> Sequence[tuple[float, str, str, str]]:
        """(t, from, to, reason) of every transition, in order."""
        return self._job.record.history

    @property
    def shape(self) -> tuple[int, int]:
        """(nodes, GPUs on each): what the job needs at once (a gang: all its nodes)."""
        ticket = self._job.ticket
        return ticket.nodes, ticket.gpus_per_node or ticket.gpus

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Of the current (or last) run; a gang's list order is its node rank."""
        return self._job.placements

    @property
    def nodes_ran(self) -> tuple[str, ...]:
        """Every node a run went to, first time first (where its logs are)."""
        return tuple(self._job.nodes_ran)

    @property
    def recovering(self) -> bool:
        return self._job.queued.recovering

    def to_dict(self) -> dict[str, Any]:
        """The public status object of the job record (``JobRecord.to_dict``), scheduler clock."""
        return self._job.record.to_dict()


@dataclass(frozen=True, slots=True)
class SchedulerCounts:
    jobs: int  # known, ended ones included (until a log compaction drops them)
    queued: int
    recovering: int  # queued after an OOM crash, with a recovery step's margin
    cycles: int  # plans made
    ended: int  # jobs in a terminal state
