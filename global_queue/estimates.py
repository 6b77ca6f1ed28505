"""What the scheduler believes a submitted job needs per GPU (MiB), decided once at submit.

Order: a declared ``memory_mib`` wins; ``estimator: none`` means no estimate (the fixed
no-estimate gate applies); ``oracle`` takes the emulation profile's true peak; every other
estimator asks ``estimators.estimate_memory`` when the spec names a model factory (per GPU, with
DistributedDataParallel's gradient buckets when it asks for several GPUs), else there is nothing
to estimate from (no estimate). Estimator failures become a ``SpecError`` naming the
model, so a bad factory is rejected at submit rather than discovered on a GPU.
"""

from __future__ import annotations

import importlib

from hier_sched.core.spec import JobSpec, SpecError
from hier_sched.core.units import gib

__all__ = ["estimate_for_spec", "estimate_warning"]

# spec.estimator -> estimators.estimate_memory(method=...)
_METHOD = {"auto": "auto", "horus": "horus", "faketensor": "faketensor", "ml": "ml", "gpumemnet": "gpumemnet"}


def estimate_for_spec(spec: JobSpec, gpu_type: str) -> tuple[float | None, str]:
    """(MiB per GPU or None, where the number came from)."""
    if spec.memory_mib is not None:
        return spec.memory_mib, "declared memory_mib"
    if spec.estimator == "none":
        return None, "no estimate (estimator: none)"
    if spec.estimator == "oracle":
        assert spec.emulation is not None  # JobSpec validation guarantees it without memory_mib
        return spec.emulation.peak_mib, "oracle (emulation.peak_mib)"
    model = spec.model
    if model is None or model.factory is None:
        return None, f"no estimate (estimator {spec.estimator!r} needs model.factory)"
    batch = model.batch_size or spec.batch_size
    if batch is None:
        raise SpecError(["model.batch_size: required to estimate memory from model.factory"], f"job spec {spec.name!r}")
    try:
        from estimators import estimate_memory

        module, name = model.factory.split(":")
        factory = getattr(importlib.import_module(module), name)
        est = estimate_memory(factory, batch_size=batch, input_shape=model.input_shape, optimizer=model.optimizer,
                              dtype=model.dtype, gpu=gpu_type, method=_METHOD[spec.estimator],
                              data_parallel=spec.data_parallel)
    except Exception as exc:  # noqa: BLE001 - import errors, tracing failures, bad shapes: all the user's to fix
        raise SpecError([f"model.factory: estimator {spec.estimator!r} failed for {model.factory}: "
                         f"{type(exc).__name__}: {exc}"], f"job spec {spec.name!r}") from None
    return float(est.peak_mib), f"estimator {est.method}"


def estimate_warning(spec: JobSpec, estimate: float | None, no_estimate_mib: float) -> str | None:
    """What to tell the submitter when an estimator was asked for and found nothing to estimate
    from (no model factory): the job runs as of unknown size, which they may not expect."""
    if estimate is not None or spec.estimator in ("none", "oracle"):
        return None
    return (f"est={spec.estimator!r} found nothing to estimate from (no model.factory, no memory_mib): the job is "
            f"placed as of unknown size, needing {gib(no_estimate_mib)} free on each GPU")
