"""What the scheduler believes about a trace job's memory, per ``--estimator`` choice.

Which answer counts is the core's rule (``hier_sched.core.estimate_rules.believe``), the same as
on a live cluster: a pod that declared a GPU share (openb) is taken at its word, like a spec's
``memory_mib``; ``oracle`` is the measured peak (the thesis' oracle runs); ``none`` gives no
estimate (fixed 5 GiB gate). This module is how the replay *asks* a model estimator:
``horus``, ``faketensor`` and ``gpumemnet`` are the values the trace recorded for those
estimators (an estimate at or above a GPU's size sends the job to idle GPUs only, as a failed
estimate did in the thesis); ``ours`` (the core's ``auto``) asks the project's own estimators,
which never read the trace's oracle column, and learns: once a job of the same workload has
succeeded, later ones are believed to need its measured peak (the core's ``PeakLearner``; here
its memory lives only as long as the replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hier_sched.core.estimate_rules import ALIASES, RULES, Belief, EstimatorRule, believe

if TYPE_CHECKING:  # keeps `hier-sched --help` from importing the trace loaders
    from traces.schema import TraceJob

__all__ = ["ESTIMATOR_CHOICES", "TraceEstimator", "estimator_for"]

# What a trace can answer: the estimators it recorded, the oracle, none, and ours (asked live).
ESTIMATOR_CHOICES = (*(n for n, r in RULES.items() if r.kind != "model" or r.recorded_in_traces),
                     *(alias for alias, name in ALIASES.items() if RULES[name].learns))


class TraceEstimator:
    """``belief(job)``: what the scheduler believes of a trace job at its submission."""

    def __init__(self, name: str, gpu: str = "A100-40GB"):
        if name not in ESTIMATOR_CHOICES:
            raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATOR_CHOICES)}")
        self.name = name
        self.gpu = gpu

    def belief(self, tj: TraceJob) -> Belief:
        declared = tj.peak_mib if tj.gpu_milli is not None else None  # openb: the pod's request
        return believe(self.name, declared_mib=declared, true_mib=tj.peak_mib, true_smact=tj.smact,
                       ask=lambda r: self._ask(r, tj))

    def _ask(self, r: EstimatorRule, tj: TraceJob) -> tuple[float | None, str]:
        if r.recorded_in_traces:
            return getattr(tj, f"{r.name}_mib"), f"{r.name} (recorded in the trace)"
        from estimators import estimate_for_workload

        recorded = {"horus": tj.horus_mib, "faketensor": tj.faketensor_mib, "gpumemnet": tj.gpumemnet_mib}
        est = estimate_for_workload(tj.workload, tj.batch_size, recorded, gpu=self.gpu)
        return est.peak_mib, f"estimator {r.name} for workload {tj.workload}"


def estimator_for(name: str, gpu: str = "A100-40GB") -> TraceEstimator:
    return TraceEstimator(name, gpu)
