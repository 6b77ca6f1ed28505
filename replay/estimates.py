"""What the scheduler believes about a trace job's memory, per ``--estimator`` choice.

``oracle`` is the measured peak (the thesis' oracle runs); ``horus``, ``faketensor`` and
``gpumemnet`` are the values the trace recorded for those estimators (an estimate at or above
a GPU's size sends the job to idle GPUs only, as a failed estimate did in the thesis);
``none`` gives no estimate (fixed 5 GiB gate); ``ours`` asks the project's own estimators,
which never read the trace's oracle column (a pod that declared a GPU share, as in openb, is
taken at its word, like a spec's ``memory_mib``), and — like ``auto`` on a live cluster — learns:
once a job of the same workload has reached its peak, later ones are estimated from that
measurement (the live node feeds ``estimators.record_observed_peak`` the same way; here the
memory lives only as long as the replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keeps `hier-sched --help` from importing the trace loaders
    from traces.schema import TraceJob

__all__ = ["ESTIMATOR_CHOICES", "TraceEstimator", "estimator_for", "job_signature"]

ESTIMATOR_CHOICES = ("oracle", "none", "horus", "faketensor", "gpumemnet", "ours")


class TraceEstimator:
    """``estimate(job) -> (need MiB per GPU or None, solo SMACT estimate or None)``; ``observe``
    hears of each measured peak."""

    def __init__(self, name: str, gpu: str = "A100-40GB"):
        if name not in ESTIMATOR_CHOICES:
            raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATOR_CHOICES)}")
        self.name = name
        self.gpu = gpu
        self._learned: dict[tuple[str, int | None, int], float] = {}

    def estimate(self, tj: TraceJob) -> tuple[float | None, float | None]:
        if self.name == "oracle":
            return tj.peak_mib, tj.smact
        if self.name == "none":
            return None, None
        if self.name != "ours":
            return getattr(tj, f"{self.name}_mib"), None
        if tj.gpu_milli is not None:  # openb: the pod declared its share of a GPU; that is its request
            return tj.peak_mib, None
        learned = self._learned.get(job_signature(tj))
        if learned is not None:
            return learned, None
        from estimators import estimate_for_workload

        recorded = {"horus": tj.horus_mib, "faketensor": tj.faketensor_mib, "gpumemnet": tj.gpumemnet_mib}
        return estimate_for_workload(tj.workload, tj.batch_size, recorded, gpu=self.gpu).peak_mib, None

    def observe(self, tj: TraceJob, peak_mib: float) -> None:
        if self.name == "ours":
            key = job_signature(tj)
            self._learned[key] = max(self._learned.get(key, 0.0), peak_mib)


def estimator_for(name: str, gpu: str = "A100-40GB") -> TraceEstimator:
    return TraceEstimator(name, gpu)


def job_signature(tj: TraceJob) -> tuple[str, int | None, int]:
    """What makes two trace jobs "the same job" (workload, batch, GPUs) for learning from runs."""
    return tj.workload, tj.batch_size, tj.gpus
