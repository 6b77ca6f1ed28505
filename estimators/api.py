"""``estimate_memory``: one entry point over every estimator, and the ``auto`` policy.

``auto`` (what the scheduler uses) returns in ``peak_mib`` the number to reserve: a measured peak
of the same job if one was recorded (plus 3 %), else the trace path's best estimate raised by
``AUTO_MARGIN`` (5 %), else the ML path's wide safe bound (``method`` says which and why, with
the trace's failure reason). For a trace it is deliberately not a worst case: the node actor adds
its own fixed margin (2048 MiB, ``PlacementConfig``) and recovers from the rare OOM, so a wide
bound there would count safety twice and waste collocation; the ML path's point estimate is far
off on architectures unlike its training data, so without a trace the safe bound is reserved.
``high_mib`` keeps the wide safe bound, ``low_mib`` the low one; a trace's ``parts`` say what the
reservation is made of (tensors, allocator, workspaces, process baseline, margin).
Every other method returns its own best estimate in ``peak_mib``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from hier_sched.core.gpu_types import gpu_type

from estimators.features import MIB, ModelDescription, layer_family, layers_from_torchsummary
from estimators.baseline import process_baseline
from estimators.feedback import job_signature, observed_peak, record_trace
from estimators.formulas import accounting_memory, horus_memory
from estimators.ml import bucket_memory, ml_memory, ml_utilization
from estimators.model_input import ModelSource, check_batch_size, parse_dtype
from estimators.module_features import description_from_module
from estimators.trace_estimator import (AUTO_MARGIN, DEFAULT_TIMEOUT_S, TraceFailed, faketensor_thesis_memory,
                                        reserve_value, trace_memory)
from estimators.types import LABEL_BASELINE_MIB, EstimatorError, MemoryEstimate, UtilEstimate
from estimators.user_step import UserStep

__all__ = ["METHODS", "estimate_memory", "estimate_step", "estimate_from_summary", "estimate_utilization", "kind_of",
           "MEASURED_MARGIN", "AUTO_MARGIN"]

METHODS = ("auto", "trace", "ml", "gpumemnet", "horus", "faketensor", "accounting")
MEASURED_MARGIN = 0.03  # run-to-run variation of a measured peak (allocator timing, cuDNN choices)


def kind_of(desc: ModelDescription) -> str:
    families = {layer_family(l.name) for l in desc.layers}
    if families & {"attention", "embedding"}:
        return "transformer"
    return "cnn" if "conv" in families else "mlp"


def _feature_estimate(desc: ModelDescription, method: str, optimizer: str, gpu: str,
                      data_parallel: bool = False, state_dir: str | None = None,
                      stack: str | None = None, unmeasured_baseline: str = "default") -> MemoryEstimate:
    kind = kind_of(desc)
    if method == "horus":
        return horus_memory(desc)  # the baseline exactly as published: one GPU, no context
    base = process_baseline(gpu, stack=stack, state=state_dir, unmeasured=unmeasured_baseline)
    if kind == "transformer" or method == "accounting":
        est = accounting_memory(desc, optimizer=optimizer, gpu=gpu, baseline_mib=base.mib)
        shift = shift_high = 0.0
    else:
        est = bucket_memory(desc, kind) if method == "gpumemnet" else ml_memory(desc, kind)
        # The labels include the process baseline of GPUMemNet's set-up; swap it for the target's
        # (the safe bound: for the top of the public range while the target's is not measured).
        shift, shift_high = base.mib - LABEL_BASELINE_MIB, base.high_mib() - LABEL_BASELINE_MIB
    if data_parallel:  # the data were measured on one GPU: add DDP's gradient buckets, one copy of the gradients
        buckets = desc.total_params * desc.bytes_per_element / MIB
        shift, shift_high = shift + buckets, shift_high + buckets
    if shift or shift_high:
        peak = est.peak_mib + shift
        est = MemoryEstimate(peak, est.low_mib + shift, max(est.high_mib + shift_high, peak), est.method, est.seconds)
    return est


def _reserve(est: MemoryEstimate, method: str, start: float) -> MemoryEstimate:
    """``auto``'s value for a trace: the best estimate plus ``AUTO_MARGIN`` (never above the safe bound)."""
    reserve = reserve_value(est.peak_mib, est.high_mib)
    parts = replace(est.parts, margin_mib=reserve - est.peak_mib) if est.parts is not None else None
    return MemoryEstimate(reserve, est.low_mib, est.high_mib, method, time.perf_counter() - start, est.notes, parts)


def _reserve_safe(est: MemoryEstimate, method: str, start: float) -> MemoryEstimate:
    """``auto``'s value without a trace: the feature path's wide safe bound. Its point estimate is
    far off on architectures unlike its training data (``estimators evaluate``, family hold-out),
    so the best estimate plus a few per cent would under-reserve them."""
    return MemoryEstimate(est.high_mib, est.low_mib, est.high_mib, method, time.perf_counter() - start,
                          f"point estimate {est.peak_mib:.0f} MiB; reserving the safe bound")


def estimate_memory(model: ModelSource, *, batch_size: int, input_shape: tuple[int, ...] | None = None,
                    sample_input: Any = None, optimizer: str = "adam", dtype: str = "float32",
                    gpu: str = "A100-40GB", method: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S,
                    state_dir: str | None = None, data_parallel: bool = False,
                    stack: str | None = None, unmeasured_baseline: str = "default") -> MemoryEstimate:
    """Peak GPU memory (MiB) of training ``model`` at ``batch_size`` on one ``gpu``.

    ``model`` is an ``nn.Module`` or a zero-argument callable returning one; ``input_shape``
    excludes the batch dimension (or give ``sample_input``: a tensor, a tuple of positional inputs or
    a dict of keyword inputs, e.g. ``input_ids``/``decoder_input_ids``). The loss is cross-entropy on a
    ``(B, C)`` output with random targets, else ``output.float().mean()``. ``data_parallel``: the
    job trains on several GPUs with DistributedDataParallel (``batch_size`` per GPU), whose
    gradient buckets every GPU holds too (not in the thesis' FakeTensor baseline). ``stack``: the
    software stack of the node the job will run on, when known (``estimators.baseline``); the process
    baseline is otherwise the largest recorded for ``gpu``, or its configured or default value
    (``unmeasured_baseline="safe"``: the top of the public range instead of the default, for
    placements on a cluster whose nodes measure theirs). Estimates of one job for several GPU
    types trace it once (``trace_estimator.trace_sims``).
    """
    start = time.perf_counter()
    if method not in METHODS:
        raise EstimatorError(f"method must be one of {', '.join(METHODS)} (got {method!r})")
    check_batch_size(batch_size)
    parse_dtype(dtype)
    gpu_type(gpu)
    common = dict(batch_size=batch_size, input_shape=input_shape, sample_input=sample_input, dtype=dtype)
    where = dict(state_dir=state_dir, stack=stack, unmeasured_baseline=unmeasured_baseline)
    if method == "trace":
        return trace_memory(model, gpu=gpu, timeout_s=timeout_s, optimizer=optimizer, data_parallel=data_parallel,
                            **where, **common)
    if method == "faketensor":
        return faketensor_thesis_memory(model, gpu=gpu, timeout_s=timeout_s, **common)
    if method != "auto":
        return _feature_estimate(description_from_module(model, **common), method, optimizer, gpu, data_parallel,
                                 **where)

    signature = job_signature(model, batch_size=batch_size, optimizer=optimizer, gpu=gpu,
                              input_shape=input_shape, dtype=dtype, data_parallel=data_parallel)
    measured = observed_peak(signature, state=state_dir)
    if measured is not None:
        mib, runs = measured
        return MemoryEstimate(mib * (1 + MEASURED_MARGIN), mib, mib * (1 + MEASURED_MARGIN),
                              f"auto:measured ({runs} run{'s' if runs > 1 else ''})", time.perf_counter() - start)
    try:
        traced = trace_memory(model, gpu=gpu, timeout_s=timeout_s, optimizer=optimizer, data_parallel=data_parallel,
                              **where, **common)
    except TraceFailed as failure:
        reason = failure.reason
    else:
        assert traced.parts is not None
        record_trace(signature, gpu, traced.peak_mib - traced.parts.baseline_mib, state=state_dir)
        return _reserve(traced, f"auto:{traced.method}", start)
    try:
        desc = description_from_module(model, **common)
    except EstimatorError as exc:
        raise EstimatorError(f"no estimate possible: trace failed ({reason}); features failed ({exc})") from None
    est = _feature_estimate(desc, "ml", optimizer, gpu, data_parallel, **where)
    return _reserve_safe(est, f"auto:{est.method} (trace failed: {reason[:160]})", start)


def estimate_step(step: UserStep, *, gpu: str = "A100-40GB", method: str = "auto",
                  timeout_s: float = DEFAULT_TIMEOUT_S, state_dir: str | None = None, stack: str | None = None,
                  unmeasured_baseline: str = "default") -> MemoryEstimate:
    """Peak GPU memory (MiB) of the user's own training step (``estimators.user_step``) on one
    ``gpu``: its trace, as a model's (``trace_estimator.trace_memory``); ``auto`` reserves the
    best estimate plus ``AUTO_MARGIN``, ``trace`` gives the best estimate. No other method can
    read a step: there is no model description to compute features from."""
    start = time.perf_counter()
    if method not in ("auto", "trace"):
        raise EstimatorError(f"the user's step is estimated by its trace: method must be auto or trace (got {method!r})")
    traced = trace_memory(step, gpu=gpu, timeout_s=timeout_s, state_dir=state_dir, stack=stack,
                          unmeasured_baseline=unmeasured_baseline)
    return _reserve(traced, f"auto:{traced.method}", start) if method == "auto" else traced


def estimate_from_summary(text: str, *, batch_size: int, method: str = "auto", optimizer: str = "adam",
                          gpu: str = "A100-40GB", data_parallel: bool = False) -> MemoryEstimate:
    """Estimate from a torchsummary printout (the path when only a summary is known): ML for
    MLP/CNN layer lists, the accounting formula for transformers; ``auto`` returns the safe bound
    (``high_mib``), as for any estimate without a trace."""
    start = time.perf_counter()
    check_batch_size(batch_size)
    if method not in ("auto", "ml", "gpumemnet", "horus", "accounting"):
        raise EstimatorError(f"a torchsummary text supports methods auto, ml, gpumemnet, horus, accounting (got {method!r})")
    layers, activation = layers_from_torchsummary(text)
    est = _feature_estimate(ModelDescription(layers, batch_size, activation), "ml" if method == "auto" else method,
                            optimizer, gpu, data_parallel)
    return _reserve_safe(est, f"auto:{est.method} (torchsummary)", start) if method == "auto" else est


def estimate_utilization(model: ModelSource, *, batch_size: int, input_shape: tuple[int, ...] | None = None,
                         sample_input: Any = None, dtype: str = "float32") -> UtilEstimate:
    """Solo mean SMACT from the model's features (ML regressor; MLP or CNN data)."""
    desc = description_from_module(model, batch_size=batch_size, input_shape=input_shape,
                                   sample_input=sample_input, dtype=dtype)
    kind = kind_of(desc)
    if kind == "transformer":
        raise EstimatorError("no utilization model for transformers (the GPUMemNet data has none)")
    return ml_utilization(desc, kind)
