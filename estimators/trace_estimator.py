"""Our main path for models we can build: trace 2 training iterations on fake CPU tensors, replay
the allocations through the caching-allocator simulation, add the GPU type's fixed costs.

Tracing runs in a separate process with a timeout (``trace_worker``): fake tensors can abort a
process (pytorch#92627), user models can hang, the model is turned into fakes there without
touching the caller's copy, and the caller may have started autograd threads that a fork of it
could not use (CUDA builds of torch).
"""

from __future__ import annotations

import hashlib
import resource
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from hier_sched.core.gpu_types import GPU_TYPES, GpuType, gpu_type

from estimators.allocator import simulate
from estimators.baseline import Baseline, process_baseline
from estimators.model_input import MetaBuildFailed, ModelSource, check_batch_size
from estimators.trace_worker import WorkerFailed, call_in_worker, payload_of
from estimators.tracer import trace_training
from estimators.types import EstimatorError, MemoryEstimate, MemoryParts
from estimators.user_step import UserStep, trace_user_step

__all__ = ["TraceFailed", "TraceResult", "TraceSims", "run_trace", "trace_sims", "trace_memory", "faketensor_thesis_memory",
           "DEFAULT_TIMEOUT_S", "AUTO_MARGIN", "reserve_value"]

MIB = 2**20
TraceSource = ModelSource | UserStep  # a model (or its factory), or the user's own step
DEFAULT_TIMEOUT_S = 120.0
# The best estimate (``peak_mib``) is the physical model: simulated segments + cuBLAS + the process
# baseline (``estimators.baseline``).
# The safe bound (``high_mib``) adds what the trace cannot know, each term set from a published
# range, not fitted to the evaluation workloads:
# - 10 % on the simulated segments: kernels that allocate differently on a GPU, allocator timing;
# - unless the baseline was measured on this cluster (a node's probe, finished jobs), the top of
#   the CUDA-context range (FIELD_NOTES §2: 300-1,500 MiB by GPU, driver, libraries) instead of a
#   configured or default value (``Baseline.high_mib``);
# - with cudnn.benchmark, PyTorch tries convolution algorithms whose workspaces the caching
#   allocator keeps reserved afterwards ("grows to the memory it sees", thesis Ch. 6.2.3): two
#   more of the largest modelled convolution workspace.
HIGH_BAND = 1.10
BENCHMARK_WORKSPACES = 2
# What ``auto`` reserves on top of the best estimate: the best estimate is a point value, wrong by a
# few per cent either way (run-to-run variation of a measured peak alone is ~3 %, see
# ``api.MEASURED_MARGIN``; cuDNN may pick algorithms with other workspaces). 5 % turns "a few per
# cent under" into "fits" without the 2x waste of the wide bound; the node actor adds its own
# 2048 MiB margin and OOM recovery on top, so this is deliberately small. A policy value, set
# before the real-workload evaluation, not tuned on it.
AUTO_MARGIN = 0.05
# A real-tensor trace (models that fake tensors cannot run) may use this share of the host memory
# available when it starts.
REAL_RUN_MEMORY_SHARE = 0.5
# How a fake-tensor trace says that the model's forward read tensor values (``.item()``, boolean
# masks, ``nonzero``): the exceptions' names as they appear in the failure reason.
_DATA_DEPENDENT_MARKERS = ("DataDependentOutputException", "DynamicOutputShapeException", "GuardOnDataDependentSymNode")


def reserve_value(best_mib: float, high_mib: float) -> float:
    """The number ``auto`` reserves: the best estimate plus ``AUTO_MARGIN``, never above the safe bound."""
    return min(best_mib * (1 + AUTO_MARGIN), max(high_mib, best_mib))


class TraceFailed(EstimatorError):
    """Tracing did not produce a result (model error, crash, timeout); ``reason`` says which."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"trace failed: {reason}")


@dataclass(frozen=True, slots=True)
class TraceResult:
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    peak_live_bytes: int
    param_bytes: int
    largest_workspace_bytes: int
    seconds: float
    # The same trace replayed without the cuDNN workspaces: what the tensors alone reserve.
    tensor_reserved_bytes: int = 0
    tensor_allocated_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TraceSims:
    """One trace's allocator simulations: ``unbounded`` (no capacity limit: what every GPU type
    sees whose capacity it stays under) and ``bounded`` per GPU type whose capacity the unbounded
    reserved peak exceeds (there, cached segments are released and workspaces yield). The trace
    itself does not depend on the device; only these capacities do, so one trace serves every type."""

    unbounded: TraceResult
    bounded: dict[str, TraceResult] = field(default_factory=dict)

    def for_type(self, gpu: str) -> TraceResult:
        return self.bounded.get(gpu, self.unbounded)


def _capacity_bytes(gpu: GpuType) -> int:
    return (gpu.memory_mib - _fixed_mib(gpu)) * MIB


def _simulate(events: list, gpu: GpuType, capacity: int | None, trace: Any, seconds: float) -> TraceResult:
    sim = simulate(events, gpu, capacity_bytes=capacity)
    tensors = simulate([e for e in events if not e.workspace], gpu, capacity_bytes=capacity)
    return TraceResult(sim.peak_reserved_bytes, sim.peak_allocated_bytes, trace.peak_live_bytes, trace.param_bytes,
                       trace.largest_workspace_bytes, seconds, tensors.peak_reserved_bytes,
                       tensors.peak_allocated_bytes)


def _simulate_every_type(trace: Any, seconds: float) -> TraceSims:
    """The unbounded simulation, then one per capacity it exceeds. A capacity never reached leaves
    the simulation unchanged (no release, no yield happens below it), so types under the unbounded
    peak share it. The allocator's rounding is the same for every known type (a test pins it), so
    the unbounded run needs no type of its own."""
    reference = GPU_TYPES["A100-40GB"]
    unbounded = _simulate(trace.events, reference, None, trace, seconds)
    by_capacity: dict[int, TraceResult] = {}
    bounded = {}
    for name, gpu in GPU_TYPES.items():
        capacity = _capacity_bytes(gpu)
        if unbounded.peak_reserved_bytes > capacity:
            if capacity not in by_capacity:
                by_capacity[capacity] = _simulate(trace.events, gpu, capacity, trace, seconds)
            bounded[name] = by_capacity[capacity]
    return TraceSims(unbounded, bounded)


def _trace_in_child(source: TraceSource, kwargs: dict, iterations: int,
                    host_memory_share: float) -> tuple[str, Any]:
    """Runs in the tracing worker's forked child: ``("ok", TraceSims)`` or ``("error", reason)``."""
    budget = None
    doing = "running it for real on the CPU"
    try:
        start = time.perf_counter()
        if kwargs.get("real_tensors"):
            budget = _limit_host_memory(host_memory_share)
            # One thread computes inline: a real run must not spread over the cores the
            # scheduler's node shares, and an OpenMP pool a fork inherited would never answer.
            torch.set_num_threads(1)
        try:
            trace = (trace_user_step(source, iterations=iterations, real_tensors=kwargs.get("real_tensors", False))
                     if isinstance(source, UserStep) else trace_training(source, iterations=iterations, **kwargs))
        except MetaBuildFailed:
            # Built with real CPU weights instead (traced on fakes all the same), within the host
            # memory budget of a real run: a large model's weights could otherwise fill the host.
            budget = _limit_host_memory(host_memory_share)
            doing = "building it with real weights on the CPU"
            trace = trace_training(source, iterations=iterations, build_on_meta=False, **kwargs)
        return "ok", _simulate_every_type(trace, time.perf_counter() - start)
    except BaseException as exc:  # report whatever the model raised, by type, to the caller
        return "error", _failure_reason(exc, budget, host_memory_share, doing)


def _failure_reason(exc: BaseException, host_budget_bytes: int | None, host_memory_share: float,
                    doing: str) -> str:
    """The child's report of a failed trace; ``host_budget_bytes`` is set when it used real tensors
    (``doing`` says for what)."""
    if host_budget_bytes is not None and (isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)):
        return (f"{doing} needs more than the host memory budget "
                f"({host_budget_bytes / MIB:.0f} MiB, {host_memory_share:.0%} of what was available)")
    if isinstance(exc, EstimatorError):
        return str(exc)
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return f"{type(exc).__name__} while tracing: {last[:300]}"


def _fixed_mib(gpu: GpuType) -> int:
    """What the allocator simulation leaves of the GPU's capacity for segments: the GPU type's
    default baseline and the cuBLAS workspace (only jobs near the capacity depend on it)."""
    return gpu.cuda_context_mib + gpu.cublas_workspace_mib


def _limit_host_memory(share: float) -> int:
    """Cap the child's address space at what it maps now plus a budget (``share`` of the host
    memory available, ``REAL_RUN_MEMORY_SHARE`` by default), and return the budget. A model that
    needs more fails with a clear reason instead of pushing the host into swap or the OOM killer: an allocation past the
    cap raises inside torch. Free memory the child inherited from its parent's allocator is mapped
    already, so the budget is a lower bound of what the run may use, not an exact figure."""
    budget = int(psutil.virtual_memory().available * share)
    mapped = psutil.Process().memory_info().vms
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + budget if hard == resource.RLIM_INFINITY else min(mapped + budget, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return budget


def _needs_real_tensors(reason: str) -> bool:
    """Did tracing fail because the model's forward reads tensor values, which fakes do not have?"""
    return any(marker in reason for marker in _DATA_DEPENDENT_MARKERS)


def _payload(source: TraceSource, iterations: int, kwargs: dict) -> bytes:
    if not isinstance(source, UserStep):  # the user's step makes its own batch
        check_batch_size(kwargs.get("batch_size"))
    try:
        return payload_of(_trace_in_child, source, kwargs, iterations, REAL_RUN_MEMORY_SHARE)
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises many types for objects it cannot pickle
        raise TraceFailed(f"the model cannot be sent to the tracing worker (not picklable): "
                          f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _call(payload: bytes, timeout_s: float) -> TraceSims:
    try:
        status, value = call_in_worker(payload, timeout_s)
    except WorkerFailed as exc:
        raise TraceFailed(str(exc)) from None
    if status != "ok":
        raise TraceFailed(value)
    return value


def run_trace(source: ModelSource, *, gpu: str = "A100-40GB", iterations: int = 2,
              timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> TraceResult:
    """Trace + allocator simulation in the tracing worker (``trace_worker``: a fresh process, never a
    fork of the caller, so it works under CUDA builds of torch whatever the caller ran); raises
    ``TraceFailed`` with the reason. Always traces anew (``trace_sims`` reuses an earlier trace)."""
    gpu_type(gpu)
    return _call(_payload(source, iterations, kwargs), timeout_s).for_type(gpu)


# Traces by their payload (the model or factory as pickled, and every argument that shapes the
# trace): estimates of one job for each GPU type of a cluster trace it once. Bounded: a payload
# may hold a whole model.
_TRACE_CACHE_SIZE = 32
_trace_cache: OrderedDict[str, TraceSims] = OrderedDict()
_trace_cache_lock = threading.Lock()


def trace_sims(source: TraceSource, *, iterations: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S,
               **kwargs: Any) -> TraceSims:
    """The trace's simulations for every GPU type, from the cache when the same payload was traced
    in this process before (only successes are kept: a failure may have been a timeout)."""
    payload = _payload(source, iterations, kwargs)
    key = hashlib.sha256(payload).hexdigest()
    with _trace_cache_lock:
        if key in _trace_cache:
            _trace_cache.move_to_end(key)
            return _trace_cache[key]
    sims = _call(payload, timeout_s)
    with _trace_cache_lock:
        _trace_cache[key] = sims
        while len(_trace_cache) > _TRACE_CACHE_SIZE:
            _trace_cache.popitem(last=False)
    return sims


def trace_memory(source: TraceSource, *, gpu: str = "A100-40GB", timeout_s: float = DEFAULT_TIMEOUT_S,
                 state_dir: str | None = None, stack: str | None = None, unmeasured_baseline: str = "default",
                 **kwargs: Any) -> MemoryEstimate:
    """Peak = simulated reserved segments + cuBLAS workspace + the process baseline (``baseline``:
    a node's probe, learned from finished jobs, configured, or the GPU type's default; ``stack``
    names a node's software stack when known). ``parts`` splits it into tensors, allocator
    overhead, workspaces and baseline. Low = live (rounded) bytes + baseline; high: see
    ``HIGH_BAND`` and the constants beside it (a measured baseline needs no allowance for the
    public range). A model whose forward reads tensor values is traced again with real CPU
    tensors (method ``trace:cpu-run``), within a share of the host's memory (``REAL_RUN_MEMORY_SHARE``).
    The trace is made once for all GPU types (``trace_sims``); the type's capacity, cuBLAS
    workspace and baseline (``unmeasured_baseline``: see ``baseline.process_baseline``) are its own."""
    start = time.perf_counter()
    g = gpu_type(gpu)
    method = "trace:user-step" if isinstance(source, UserStep) else "trace"
    try:
        sims = trace_sims(source, timeout_s=timeout_s, **kwargs)
    except TraceFailed as failure:
        if not _needs_real_tensors(failure.reason):
            raise
        sims = trace_sims(source, timeout_s=timeout_s, real_tensors=True, **kwargs)
        method += ":cpu-run"
    result = sims.for_type(gpu)
    base = process_baseline(gpu, stack=stack, state=state_dir, unmeasured=unmeasured_baseline)
    parts = _parts(result, g, base)
    peak = parts.total_mib()
    low = result.peak_allocated_bytes / MIB + base.mib
    high = (HIGH_BAND * result.peak_reserved_bytes + BENCHMARK_WORKSPACES * result.largest_workspace_bytes) / MIB \
        + base.high_mib() + g.cublas_workspace_mib
    if peak <= g.memory_mib:  # a job that fits never holds more than the whole GPU: caches and workspaces yield
        high = min(high, g.memory_mib)
    return MemoryEstimate(peak, min(low, peak), max(high, peak), method, time.perf_counter() - start,
                          notes=f"reserved {result.peak_reserved_bytes / MIB:.0f} MiB, "
                                f"allocated {result.peak_allocated_bytes / MIB:.0f} MiB", parts=parts)


def _parts(result: TraceResult, gpu: GpuType, base: Baseline) -> MemoryParts:
    """The best estimate split so that the parts add up to it: the trace replayed without cuDNN
    workspaces gives the tensors and the allocator's overhead on them; what the workspaces add
    to the reserved peak (0 when the GPU's capacity made them yield) joins the cuBLAS workspace."""
    cudnn = max(0, result.peak_reserved_bytes - result.tensor_reserved_bytes)
    tensors = result.tensor_allocated_bytes
    allocator = result.peak_reserved_bytes - cudnn - tensors
    return MemoryParts(tensors / MIB, allocator / MIB, cudnn / MIB + gpu.cublas_workspace_mib, base.mib, base.source)


def faketensor_thesis_memory(source: ModelSource, *, gpu: str = "A100-40GB",
                             timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> MemoryEstimate:
    """The thesis' FakeTensor baseline: one forward + backward, live tensor bytes only — no
    optimizer state, no CUDA context, no allocator rounding. Kept to be beaten, faithfully."""
    start = time.perf_counter()
    result = run_trace(source, gpu=gpu, timeout_s=timeout_s, iterations=1, **dict(kwargs, optimizer="none"))
    peak = result.peak_live_bytes / MIB
    return MemoryEstimate(peak, peak, peak, "faketensor-thesis", time.perf_counter() - start)
