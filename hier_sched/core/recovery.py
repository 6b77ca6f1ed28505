"""OOM recovery with stepwise memory margins (thesis Ch. 7.2), and the retry rule for other failures.

The thesis re-ran a crashed job once, on an idle GPU only. We escalate instead: attempt k after
k OOM crashes needs ``max(estimate, observed peak) + k * step`` free memory; once that exceeds
what a GPU can offer, or the steps are used up, the job waits for idle GPUs. After
``max_attempts`` runs in all it fails with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from hier_sched.core.failures import Failure

__all__ = ["RecoveryPolicy", "RecoveryDecision", "decide_after_failure", "recovery_requirement"]


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    step_mib: float = 5120.0
    max_steps: int = 2  # escalated attempts before falling back to an idle GPU
    max_attempts: int = 4  # runs in all, the first included (a spec may override)
    max_retries_other: int = 0  # non-OOM failures: re-runs allowed (a spec may override)

    def __post_init__(self) -> None:
        if self.step_mib <= 0 or self.max_steps < 0 or self.max_attempts < 1 or self.max_retries_other < 0:
            raise ValueError(f"invalid recovery policy {self}")


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    requeue: bool
    reason: str


def recovery_requirement(
    oom_count: int, estimate_mib: float | None, observed_peak_mib: float | None, gpu_total_mib: float, policy: RecoveryPolicy
) -> tuple[float | None, bool]:
    """(free memory the next attempt needs, whether it must have an idle GPU)."""
    if oom_count <= 0:
        return None, False
    base = max(estimate_mib or 0.0, observed_peak_mib or 0.0)
    need = base + oom_count * policy.step_mib
    if oom_count > policy.max_steps or need >= gpu_total_mib:
        return None, True
    return need, False


def decide_after_failure(
    failure: Failure, *, attempts: int, oom_count: int, other_failures: int, policy: RecoveryPolicy
) -> RecoveryDecision:
    """Requeue the job (recovery queue) or fail it for good, with the reason either way."""
    if failure.kind == "oom":
        if attempts >= policy.max_attempts:
            return RecoveryDecision(False, f"out of memory on all {attempts} attempts: {failure.reason}")
        return RecoveryDecision(True, f"out of memory (crash {oom_count}), recovering with a larger margin: {failure.reason}")
    if failure.kind == "checkpoint_requeue":
        return RecoveryDecision(True, "checkpointed at the end of its time slot; requeued")
    if other_failures <= policy.max_retries_other:
        return RecoveryDecision(True, f"failed ({failure.reason}); retry {other_failures} of {policy.max_retries_other}")
    return RecoveryDecision(False, failure.reason)
