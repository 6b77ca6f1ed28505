"""What the scheduler believes about a trace job's memory, per ``--estimator`` choice.

``oracle`` is the measured peak (the thesis' oracle runs); ``horus``, ``faketensor`` and
``gpumemnet`` are the values the trace recorded for those estimators (an estimate at or above
a GPU's size sends the job to idle GPUs only, as a failed estimate did in the thesis);
``none`` gives no estimate (fixed 5 GiB gate); ``ours`` asks the project's own estimators,
which never read the trace's oracle column.
"""

from __future__ import annotations

from traces.schema import TraceJob

__all__ = ["ESTIMATOR_CHOICES", "estimator_for"]

ESTIMATOR_CHOICES = ("oracle", "none", "horus", "faketensor", "gpumemnet", "ours")


def estimator_for(name: str, gpu: str = "A100-40GB"):
    """A function ``TraceJob -> (need MiB per GPU or None, solo SMACT estimate or None)``."""
    if name == "oracle":
        return lambda tj: (tj.peak_mib, tj.smact)
    if name == "none":
        return lambda tj: (None, None)
    if name in ("horus", "faketensor", "gpumemnet"):
        field = f"{name}_mib"
        return lambda tj: (getattr(tj, field), None)
    if name == "ours":
        from estimators import estimate_for_workload

        def ours(tj: TraceJob):
            recorded = {"horus": tj.horus_mib, "faketensor": tj.faketensor_mib, "gpumemnet": tj.gpumemnet_mib}
            est = estimate_for_workload(tj.workload, tj.batch_size, recorded, gpu=gpu)
            return est.peak_mib, None

        return ours
    raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATOR_CHOICES)}")
