"""What the scheduler believes about a trace job's memory, per ``--estimator`` choice.

``oracle`` is the measured peak (the thesis' oracle runs); ``horus``, ``faketensor`` and
``gpumemnet`` are the values the trace recorded for those estimators (an estimate at or above
a GPU's size sends the job to idle GPUs only, as a failed estimate did in the thesis);
``none`` gives no estimate (fixed 5 GiB gate); ``ours`` asks the project's own estimators,
which never read the trace's oracle column (a pod that declared a GPU share, as in openb, is
taken at its word, like a spec's ``memory_mib``), and — like ``auto`` on a live cluster — learns:
once a job of the same workload has succeeded, later ones are believed to need its measured
peak (the core's ``PeakLearner``, the same rule the live queue uses; here its memory lives only
as long as the replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keeps `hier-sched --help` from importing the trace loaders
    from traces.schema import TraceJob

__all__ = ["ESTIMATOR_CHOICES", "TraceEstimator", "estimator_for"]

ESTIMATOR_CHOICES = ("oracle", "none", "horus", "faketensor", "gpumemnet", "ours")


class TraceEstimator:
    """``estimate(job) -> (need MiB per GPU or None, solo SMACT estimate or None)``; ``learns(job)``
    says whether a measured peak of the same job replaces that estimate."""

    def __init__(self, name: str, gpu: str = "A100-40GB"):
        if name not in ESTIMATOR_CHOICES:
            raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATOR_CHOICES)}")
        self.name = name
        self.gpu = gpu

    def estimate(self, tj: TraceJob) -> tuple[float | None, float | None]:
        if self.name == "oracle":
            return tj.peak_mib, tj.smact
        if self.name == "none":
            return None, None
        if self.name != "ours":
            return getattr(tj, f"{self.name}_mib"), None
        if tj.gpu_milli is not None:  # openb: the pod declared its share of a GPU; that is its request
            return tj.peak_mib, None
        from estimators import estimate_for_workload

        recorded = {"horus": tj.horus_mib, "faketensor": tj.faketensor_mib, "gpumemnet": tj.gpumemnet_mib}
        return estimate_for_workload(tj.workload, tj.batch_size, recorded, gpu=self.gpu).peak_mib, None

    def learns(self, tj: TraceJob) -> bool:
        return self.name == "ours" and tj.gpu_milli is None


def estimator_for(name: str, gpu: str = "A100-40GB") -> TraceEstimator:
    return TraceEstimator(name, gpu)
