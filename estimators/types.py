"""The values every estimator returns, and the one error type they raise."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MemoryEstimate", "UtilEstimate", "EstimatorError", "LABEL_GPU"]

# Where GPUMemNet measured its labels (the thesis' DGX Station A100): what the ML models and the
# transformer closed form predict for; other GPU types are shifted by their CUDA context.
LABEL_GPU = "A100-40GB"


class EstimatorError(ValueError):
    """Input an estimator cannot work with; the message names the problem (column, shape, ...)."""


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Peak GPU memory of one training job on one GPU, in MiB as nvidia-smi would show it.

    ``peak_mib`` is what a scheduler should reserve; ``low_mib``/``high_mib`` bound the truth
    (the ML path's are conformal bounds, the trace path's come from the allocator simulation).
    ``method`` names the path that produced the number, including any fallback taken
    (e.g. ``"ml (trace failed: timeout)"``), so a fallback is never silent.
    """

    peak_mib: float
    low_mib: float
    high_mib: float
    method: str
    seconds: float
    notes: str = ""

    def __post_init__(self) -> None:
        values = (self.peak_mib, self.low_mib, self.high_mib)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise EstimatorError(f"{self.method}: estimate must be positive and finite, got {values}")
        if not self.low_mib <= self.peak_mib <= self.high_mib:
            raise EstimatorError(
                f"{self.method}: need low <= peak <= high, got {self.low_mib:.0f} / {self.peak_mib:.0f}"
                f" / {self.high_mib:.0f} MiB"
            )

    def as_dict(self) -> dict[str, float | str]:
        return {
            "peak_mib": round(self.peak_mib, 1),
            "low_mib": round(self.low_mib, 1),
            "high_mib": round(self.high_mib, 1),
            "method": self.method,
            "seconds": round(self.seconds, 4),
            "notes": self.notes,
        }


@dataclass(frozen=True, slots=True)
class UtilEstimate:
    """Solo mean SM activity (DCGM field 1002, 0..1) of a job, with a stated band."""

    smact: float
    low: float
    high: float
    method: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.smact <= self.high <= 1.0:
            raise EstimatorError(
                f"{self.method}: need 0 <= low <= smact <= high <= 1, got {self.low}, {self.smact}, {self.high}"
            )
