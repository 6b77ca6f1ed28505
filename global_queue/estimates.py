"""What the scheduler believes a submitted job needs per GPU (MiB), decided once at submit.

Which answer counts is the core's rule (``hier_sched.core.estimate_rules.believe``: a declared
``memory_mib`` wins, ``none`` gives no estimate, ``oracle`` the emulation profile's true peak);
this module is how the live queue *asks* a model estimator: ``estimators.estimate_memory`` on
the spec's model factory (per GPU, with DistributedDataParallel's gradient buckets when it asks
for several GPUs; a GPU type none of whose nodes measured its process baseline gets the safe value,
and the source says so), else there is nothing to estimate from (no estimate). Estimator failures
become a ``SpecError`` naming the model, so a bad factory is rejected at submit rather than
discovered on a GPU.
"""

from __future__ import annotations

import importlib

from hier_sched.core.estimate_rules import Belief, EstimatorRule, believe, rule
from hier_sched.core.spec import JobSpec, SpecError
from hier_sched.core.units import gib

__all__ = ["estimate_for_spec", "estimate_warning"]


def estimate_for_spec(spec: JobSpec, gpu_type: str) -> Belief:
    true_mib = spec.emulation.peak_mib if spec.emulation is not None else None
    return believe(spec.estimator, declared_mib=spec.memory_mib, true_mib=true_mib,
                   ask=lambda rule: _ask_model(spec, rule, gpu_type))


def _ask_model(spec: JobSpec, rule: EstimatorRule, gpu_type: str) -> tuple[float | None, str]:
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
                              dtype=model.dtype, gpu=gpu_type, method=rule.name, data_parallel=spec.data_parallel,
                              unmeasured_baseline="safe")
    except Exception as exc:  # noqa: BLE001 - import errors, tracing failures, bad shapes: all the user's to fix
        raise SpecError([f"model.factory: estimator {spec.estimator!r} failed for {model.factory}: "
                         f"{type(exc).__name__}: {exc}"], f"job spec {spec.name!r}") from None
    return float(est.peak_mib), _source(est)


def _source(est) -> str:
    """The estimator, and for a trace where its process baseline came from (a node's probe, or the
    safe value assumed where nothing was measured)."""
    if est.parts is None:
        return f"estimator {est.method}"
    return f"estimator {est.method}; baseline {est.parts.baseline_mib:.0f} MiB, {est.parts.baseline_source}"


def estimate_warning(spec: JobSpec, estimate: float | None, no_estimate_mib: float) -> str | None:
    """What to tell the submitter when an estimator was asked for and found nothing to estimate
    from (no model factory): the job runs as of unknown size, which they may not expect."""
    if estimate is not None or rule(spec.estimator).kind != "model":
        return None
    return (f"est={spec.estimator!r} found nothing to estimate from (no model.factory, no memory_mib): the job is "
            f"placed as of unknown size, needing {gib(no_estimate_mib)} free on each GPU")
