"""Estimators: a training job's peak GPU memory (and solo SM activity) before it runs.

Paths: ``trace`` (fake-tensor trace of 2 iterations + caching-allocator simulation), ``ml``
(xgboost on model features, trained on the GPUMemNet data), and the baselines the thesis used
(``horus``, ``faketensor``, ``gpumemnet``). ``auto`` picks and returns a safe value to reserve.

Attributes load lazily so ``import estimators.cli`` (and ``hier-sched --help``) does not import torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "METHODS": "estimators.api",
    "estimate_memory": "estimators.api",
    "estimate_step": "estimators.api",
    "UserStep": "estimators.user_step",
    "estimate_utilization": "estimators.api",
    "estimate_for_workload": "estimators.workloads",
    "job_signature": "estimators.feedback",
    "record_observed_peak": "estimators.feedback",
    "MemoryEstimate": "estimators.types",
    "UtilEstimate": "estimators.types",
    "EstimatorError": "estimators.types",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'estimators' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
