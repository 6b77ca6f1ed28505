"""How long a job is expected to run, learned from earlier runs of the same job.

The scheduler is not told run times; it remembers them. When a job of some signature
(workload, batch size, GPU count — whatever the shell uses as "the same job") succeeds, the
time it executed is recorded; a later job of that signature is then expected to take about as
long. While jobs run, ``expected_end`` says when each one with a known run time should finish:
the queue uses it only to guess which GPUs drain first when it holds GPUs for a starving head
(``queueing``). An unknown run time is simply unknown, never a guess. Both shells (simulator,
live global queue) report runs through the same three calls, so they learn by one rule.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["RuntimeHistory"]


class RuntimeHistory:
    """Per signature, the mean of the last ``keep`` observed run times (seconds)."""

    def __init__(self, keep: int = 5):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        self.keep = keep
        self._seen: dict[Hashable, list[float]] = {}
        self.expected_end: dict[str, float] = {}  # running job -> when it should finish

    def observe(self, signature: Hashable, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a run time must be positive (got {seconds})")
        runs = self._seen.setdefault(signature, [])
        runs.append(float(seconds))
        del runs[: -self.keep]

    def expected(self, signature: Hashable) -> float | None:
        runs = self._seen.get(signature)
        return sum(runs) / len(runs) if runs else None

    def run_started(self, job_id: str, signature: Hashable, now_s: float, executed_before_s: float = 0.0) -> None:
        """A run began (``executed_before_s``: time of earlier runs, e.g. before a checkpoint)."""
        seconds = self.expected(signature)
        if seconds is not None:
            self.expected_end[job_id] = now_s + max(seconds - executed_before_s, 0.0)

    def run_ended(self, job_id: str) -> None:
        self.expected_end.pop(job_id, None)

    def job_succeeded(self, signature: Hashable, executed_s: float, oom_crashes: int) -> None:
        """Learn from a success: all its runs together are its run time — unless an OOM crash made
        it start over, when the executed time also counts the lost work."""
        if not oom_crashes and executed_s > 0:
            self.observe(signature, executed_s)
