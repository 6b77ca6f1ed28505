"""Job states, the legal transitions between them, and the record a shell keeps per job.

The transition table is data: ``JobRecord.transition`` refuses any move it does not list, and
keeps every move with its time and reason so ``status`` can explain a job's history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["JobState", "TRANSITIONS", "TERMINAL", "IllegalTransition", "JobRecord"]


class JobState(str, Enum):
    ESTIMATING = "estimating"  # accepted; its memory estimate is being made where its code lives
    QUEUED = "queued"  # waiting (first run, OOM recovery, or requeued after a checkpoint)
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"  # got the checkpoint signal, saving before its slot ends
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.ESTIMATING: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.QUEUED, JobState.CHECKPOINTING, JobState.CANCELLED}
    ),
    JobState.CHECKPOINTING: frozenset({JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


class IllegalTransition(RuntimeError):
    pass


@dataclass(slots=True)
class JobRecord:
    """Everything ``hier-sched status`` reports about one job."""

    job_id: str
    name: str
    submit_time: float
    gpus: int = 1
    state: JobState = JobState.QUEUED
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    attempts: int = 0  # runs started (first run + recoveries + resumptions)
    oom_crashes: int = 0
    checkpoints: int = 0
    estimate_mib: float | None = None
    estimate_source: str = ""  # which estimator (or declaration, or measurement) the reservation came from
    estimates: tuple[tuple[str, float], ...] = ()  # the need per GPU type, where it depends on the type
    observed_peak_mib: float | None = None
    exit_code: int | None = None  # of the last attempt that ended (negative: killed by that signal)
    start_time: float | None = None  # first start
    end_time: float | None = None
    nodes: tuple[str, ...] = ()  # of the current (or last) run; a gang has several
    reason: str = ""
    history: list[tuple[float, str, str, str]] = field(default_factory=list)  # (t, from, to, reason)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def transition(self, to: JobState, now: float, reason: str = "") -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"job {self.job_id}: {self.state.value} -> {to.value} is not allowed")
        self.history.append((now, self.state.value, to.value, reason))
        self.state = to
        self.reason = reason
        if to is JobState.RUNNING:
            self.attempts += 1
            if self.start_time is None:
                self.start_time = now
        if to in TERMINAL:
            self.end_time = now

    def observe_peak(self, mib: float) -> None:
        if self.observed_peak_mib is None or mib > self.observed_peak_mib:
            self.observed_peak_mib = mib

    def to_dict(self) -> dict[str, Any]:
        """The public status object (field names are part of the CLI contract)."""
        return {
            "job_id": self.job_id,
            "name": self.name,
            "state": self.state.value,
            "node": self.node,
            "gpus": list(self.gpu_indices) if self.gpu_indices else self.gpus,
            "attempts": self.attempts,
            "oom_crashes": self.oom_crashes,
            "checkpoints": self.checkpoints,
            "estimate_mib": self.estimate_mib,
            "estimate_source": self.estimate_source,
            "estimates": dict(self.estimates),
            "observed_peak_mib": self.observed_peak_mib,
            "exit_code": self.exit_code,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "nodes": list(self.nodes),
            "reason": self.reason,
        }
