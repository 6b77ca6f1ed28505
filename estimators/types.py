"""The values every estimator returns, and the one error type they raise."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryEstimate", "MemoryParts", "UtilEstimate", "EstimatorError", "parts_sum", "LABEL_GPU",
           "LABEL_BASELINE_MIB"]

# Where GPUMemNet measured its labels (the thesis' DGX Station A100): what the ML models and the
# transformer closed form predict for; other GPU types and stacks are shifted by their process baseline.
LABEL_GPU = "A100-40GB"
# The process baseline of GPUMemNet's measurement set-up, read off its own data: the smallest
# networks of mlp_step1.csv / mlp_step2.csv peak at 1,443 MiB, of which ~30 MiB are what such a
# network's allocator holds (a 2 MiB small-pool segment, a 20 MiB segment for its input batch, the
# 8 MiB cuBLAS workspace), rounded up to a 2 MiB page; the zero-parameter rows of cnn_partial.csv
# peak at 1,451 MiB.
LABEL_BASELINE_MIB = 1414


class EstimatorError(ValueError):
    """Input an estimator cannot work with; the message names the problem (column, shape, ...)."""


def parts_sum(parts: Mapping[str, Any]) -> str:
    """An estimate's parts as a sum, ``tensors 24 + allocator 18 + ... MiB``: the numeric parts
    (``*_mib`` or bare names, as ``MemoryParts.as_dict`` and an LLM estimate's parts name them),
    zeros left out."""
    return " + ".join(f"{name.removesuffix('_mib').replace('_', ' ')} {mib:.0f}" for name, mib in parts.items()
                      if isinstance(mib, (int, float)) and mib) + " MiB"


@dataclass(frozen=True, slots=True)
class MemoryParts:
    """What a trace-based ``peak_mib`` is made of, in MiB; the parts add up to it."""

    tensors_mib: float  # live tensors at their peak, rounded as the caching allocator rounds them (traced)
    allocator_mib: float  # reserved segments beyond the live tensors: block splitting, cached free blocks
    workspaces_mib: float  # the cuBLAS workspace and what cuDNN's convolution workspaces add to the reserved peak
    baseline_mib: float  # the process baseline: CUDA context and library handles (``estimators.baseline``)
    baseline_source: str  # probe / learned / configured / default, with the GPU type and stack
    margin_mib: float = 0.0  # what ``auto`` reserves beyond the best estimate (``AUTO_MARGIN``)

    def total_mib(self) -> float:
        return self.tensors_mib + self.allocator_mib + self.workspaces_mib + self.baseline_mib + self.margin_mib

    def as_dict(self) -> dict[str, float | str]:
        return {"tensors_mib": round(self.tensors_mib, 1), "allocator_mib": round(self.allocator_mib, 1),
                "workspaces_mib": round(self.workspaces_mib, 1), "baseline_mib": round(self.baseline_mib, 1),
                "baseline_source": self.baseline_source, "margin_mib": round(self.margin_mib, 1)}


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
    parts: MemoryParts | None = None  # the trace path's breakdown of ``peak_mib``

    def __post_init__(self) -> None:
        values = (self.peak_mib, self.low_mib, self.high_mib)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise EstimatorError(f"{self.method}: estimate must be positive and finite, got {values}")
        if not self.low_mib <= self.peak_mib <= self.high_mib:
            raise EstimatorError(
                f"{self.method}: need low <= peak <= high, got {self.low_mib:.0f} / {self.peak_mib:.0f}"
                f" / {self.high_mib:.0f} MiB"
            )
        if self.parts is not None and abs(self.parts.total_mib() - self.peak_mib) > 0.5:
            raise EstimatorError(f"{self.method}: parts add up to {self.parts.total_mib():.1f} MiB, "
                                 f"not the estimate {self.peak_mib:.1f} MiB")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "peak_mib": round(self.peak_mib, 1),
            "low_mib": round(self.low_mib, 1),
            "high_mib": round(self.high_mib, 1),
            "method": self.method,
            "seconds": round(self.seconds, 4),
            "notes": self.notes,
        }
        if self.parts is not None:
            out["parts"] = self.parts.as_dict()
        return out


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
