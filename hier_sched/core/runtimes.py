"""How long a job is expected to run, learned from earlier runs of the same job.

The scheduler is not told run times; it remembers them. When a job of some signature
(workload, batch size, GPU count — whatever the shell uses as "the same job") finishes, its
wall-clock run time is recorded; a later job of that signature is then expected to take about
as long. The queue uses this only to guess which GPUs drain first when it holds GPUs for a
starving head (``queueing``); an unknown run time is simply unknown, never a guess.
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

    def observe(self, signature: Hashable, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a run time must be positive (got {seconds})")
        runs = self._seen.setdefault(signature, [])
        runs.append(float(seconds))
        del runs[: -self.keep]

    def expected(self, signature: Hashable) -> float | None:
        runs = self._seen.get(signature)
        return sum(runs) / len(runs) if runs else None

    def expected_end(self, signature: Hashable, run_start_s: float, executed_before_s: float = 0.0) -> float | None:
        """When a run that started at ``run_start_s`` (after ``executed_before_s`` of earlier
        runs, e.g. before a checkpoint) should end; None when the run time is unknown."""
        seconds = self.expected(signature)
        return None if seconds is None else run_start_s + max(seconds - executed_before_s, 0.0)
