"""A job's memory estimate, made where the job's code lives (a Ray task in the job's own
``runtime_env``, or the submitting Python process), never in the scheduler's queue.

``estimate_for_request(request)`` takes the plain request the queue logged with the job
(``global_queue.estimates.estimate_request``) and answers with a plain outcome:

- ``{"needs": {gpu type: MiB}, "source": ..., "parts": {gpu type: parts}}``: the estimate per GPU
  type of the cluster (``estimate_memory`` once per type, whose ``auto`` chain falls back to the
  feature-based estimate when the trace fails, and says so in the source), and what each type's
  figure is made of where a trace made it (``MemoryParts.as_dict``);
- ``{"reject": reason}``: the model cannot be built here (its module does not import, the
  factory raises, never returns, or needs more host memory than the budget), so no estimate
  can be made; the reason names the factory and the error.

The model is first built once in a child of the tracing worker under the request's time and
host-memory budgets (``trace_worker.worker_limits``), with the user's import inside that
child: a factory that hangs or fills the memory fails there, by itself, and is named. Only a
model that built is traced; its traces run under the same budgets.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from estimators.trace_worker import WorkerFailed, budget_reason, call_in_worker, payload_of, worker_limits

__all__ = ["FactoryRef", "estimate_for_request", "estimate_model", "estimate_user_step", "estimate_training",
           "request_subject", "budgets", "DEFAULT_TIMEOUT_S",
           "DEFAULT_HOST_BUDGET_MIB"]

DEFAULT_TIMEOUT_S = 60.0  # building the model, and each trace
DEFAULT_HOST_BUDGET_MIB = 8192.0  # host memory a build or trace may take beyond what the tracer maps at start


def budgets() -> tuple[float, float]:
    """(seconds, host MiB) an estimate may take: ``HIER_SCHED_ESTIMATE_TIMEOUT_S`` and
    ``HIER_SCHED_ESTIMATE_HOST_MIB`` where set (the queue's and a submitting process's), else the defaults."""
    return (float(os.environ.get("HIER_SCHED_ESTIMATE_TIMEOUT_S", DEFAULT_TIMEOUT_S)),
            float(os.environ.get("HIER_SCHED_ESTIMATE_HOST_MIB", DEFAULT_HOST_BUDGET_MIB)))


@dataclass(frozen=True, slots=True)
class FactoryRef:
    """A ``"pkg.mod:function"`` factory that imports its module only when called: pickled into the
    tracing worker's child, the user's import happens there, under the child's budgets."""

    path: str

    def __call__(self) -> Any:
        from estimators.model_input import resolve_factory

        return resolve_factory(self.path)()


def _build_in_child(factory: Any, budget_bytes: int) -> tuple[str, Any]:
    """Runs in the tracing worker's child: build the model once, report how it went."""
    from torch import nn

    try:
        model = factory if isinstance(factory, nn.Module) else factory()
    except MemoryError:
        return "error", f"building the model {budget_reason(budget_bytes)}"
    except BaseException as exc:  # noqa: BLE001 - whatever the user's code raised, by name
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        if "can't allocate memory" in last:
            return "error", f"building the model {budget_reason(budget_bytes)}"
        return "error", last[:300]
    if not isinstance(model, nn.Module):
        return "error", f"the factory returned {type(model).__name__}, not an nn.Module"
    return "ok", sum(p.numel() for p in model.parameters())


def estimate_model(factory: Any, name: str, *, batch_size: int, input_shape: tuple[int, ...] | None,
                   optimizer: str, dtype: str, data_parallel: bool, estimator: str, gpu_types: list[str],
                   timeout_s: float, host_budget_mib: float, where: str) -> dict[str, Any]:
    """The outcome (see the module) for a model ``factory`` (a callable or ``FactoryRef``; ``name``
    for messages); ``where`` says where this runs, for the source."""
    from estimators import estimate_memory

    start = time.perf_counter()
    budget = int(host_budget_mib * 2**20)
    with worker_limits(host_budget_bytes=budget):
        try:
            status, value = call_in_worker(payload_of(_build_in_child, factory, budget), timeout_s)
        except WorkerFailed as exc:
            return {"reject": f"model.factory {name}: the tracing worker failed: {exc}"}
        if status != "ok":
            if value.startswith("timeout"):
                value = f"did not return within {timeout_s:.0f} s (building the model)"
            return {"reject": f"model.factory {name}: {value}"}
        return _per_gpu_type(
            lambda gpu: estimate_memory(factory, batch_size=batch_size, input_shape=input_shape, optimizer=optimizer,
                                        dtype=dtype, gpu=gpu, method=estimator, timeout_s=timeout_s,
                                        data_parallel=data_parallel, unmeasured_baseline="safe"),
            gpu_types, f"model.factory {name}: estimator {estimator!r} failed", where, start)


def _per_gpu_type(estimate: Callable[[str], Any], gpu_types: list[str], failed: str, where: str,
                  start: float) -> dict[str, Any]:
    """The outcome from ``estimate(gpu type)`` for each of the cluster's types: the needs, the
    source (the method, where it ran, how long, and where each type's process baseline came from:
    a probe, or the safe value) and each type's parts; ``failed`` begins a rejection's reason."""
    from estimators.types import EstimatorError

    needs: dict[str, float] = {}
    parts: dict[str, dict[str, Any]] = {}
    method = ""
    baselines: list[str] = []
    for gpu in gpu_types:
        try:
            est = estimate(gpu)
        except EstimatorError as exc:
            return {"reject": f"{failed}: {exc}"}
        needs[gpu] = float(est.peak_mib)
        method = est.method
        if est.parts is not None:
            parts[gpu] = est.parts.as_dict()
            baselines.append(f"{gpu} baseline {est.parts.baseline_mib:.0f} MiB, {est.parts.baseline_source}")
    return _outcome(needs, parts, method, where, start, baselines)


def _outcome(needs: dict[str, float], parts: dict[str, dict[str, Any]], method: str, where: str, start: float,
             notes: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """An estimate's outcome; its source says the method, where it ran and how long, then ``notes``."""
    source = f"{method} ({where}, {time.perf_counter() - start:.1f} s)"
    return {"needs": needs, "source": "; ".join([source, *notes]), "parts": parts}


def estimate_user_step(step: Any, name: str, *, world_size: int = 1, estimator: str, gpu_types: list[str],
                       timeout_s: float, host_budget_mib: float, where: str) -> dict[str, Any]:
    """The outcome (see the module) for the user's own training step (``estimators.user_step``:
    a callable, or a ``"pkg.mod:fn"`` imported in the tracing worker's child), traced as rank 0 of
    ``world_size`` (the job's GPUs); ``name`` for messages. The step builds its own model: its
    trace, under the same budgets, is the build's test."""
    from estimators.api import estimate_step
    from estimators.user_step import UserStep

    start = time.perf_counter()
    method = "trace" if estimator == "trace" else "auto"
    with worker_limits(host_budget_bytes=int(host_budget_mib * 2**20)):
        return _per_gpu_type(
            lambda gpu: estimate_step(UserStep(step, world_size), gpu=gpu, method=method, timeout_s=timeout_s,
                                      unmeasured_baseline="safe"),
            gpu_types, f"model.step {name}", where, start)


def _llm_in_child(training: dict[str, Any], gpu_types: list[str]) -> tuple[str, Any]:
    """Runs in the tracing worker's child: the set-up's step traced once, composed for each type."""
    try:
        from estimators.llm_estimate import baseline_for, compose
        from estimators.llm_trace import trace_step
        from hier_sched.core.spec import TrainingSpec

        setup = TrainingSpec(**training)
        figures = trace_step(setup)
        return "ok", {gpu: compose(setup, figures, baseline_for(gpu)[0]) for gpu in gpu_types}
    except ModuleNotFoundError as exc:
        return "error", (f"{exc.name} is not installed where the job's code runs, and the section's architecture "
                         f"is built with it: add it to the job's runtime_env (pip: [{exc.name}])")
    except BaseException as exc:  # noqa: BLE001 - whatever failed, by name
        return "error", traceback.format_exception_only(type(exc), exc)[-1].strip()[:300]


def estimate_training(training: Mapping[str, Any], *, estimator: str, gpu_types: list[str], timeout_s: float,
                      host_budget_mib: float, where: str) -> dict[str, Any]:
    """The outcome (see the module) for an LLM's ``training`` section (``estimators.llm_estimate``):
    its step traced in the tracing worker's child under the budgets (transformers builds the
    architecture there), each type's figure with its parts (weights, gradients, optimizer state,
    activations, ...); ``auto`` adds ``AUTO_MARGIN``, as for a traced model."""
    from estimators.trace_estimator import AUTO_MARGIN

    start = time.perf_counter()
    what = _training_subject(training)
    with worker_limits(host_budget_bytes=int(host_budget_mib * 2**20)):
        try:
            status, value = call_in_worker(payload_of(_llm_in_child, dict(training), list(gpu_types)), timeout_s)
        except WorkerFailed as exc:
            return {"reject": f"{what}: the tracing worker failed: {exc}"}
    if status != "ok":
        return {"reject": f"{what}: " + (f"not estimated within {timeout_s:.0f} s" if value.startswith("timeout")
                                        else value)}
    margin = 0.0 if estimator == "trace" else AUTO_MARGIN
    needs = {gpu: est.peak_mib * (1 + margin) for gpu, est in value.items()}
    parts = {gpu: {**{f"{k}_mib": round(v, 1) for k, v in est.parts.items()},
                   "margin_mib": round(est.peak_mib * margin, 1)} for gpu, est in value.items()}
    method = next(iter(value.values())).method
    return _outcome(needs, parts, f"{'' if estimator == 'trace' else 'auto:'}{method}", where, start)


def estimate_for_request(request: Mapping[str, Any], where: str = "Ray task") -> dict[str, Any]:
    """The outcome for a request the queue logged: its ``workdir`` (relative: to this process's
    directory, the job's copy of its working directory in a Ray task) goes first on the import
    path, where the factory's module is looked for."""
    workdir = request.get("workdir")
    if workdir:
        path = os.path.abspath(workdir)
        if not os.path.isdir(path):
            return {"reject": f"{request_subject(request)}: workdir {workdir} does not exist where the estimate ran"}
        if path not in sys.path:
            sys.path.insert(0, path)
    budgets_given = dict(estimator=request["estimator"], gpu_types=list(request["gpu_types"]),
                         timeout_s=float(request["timeout_s"]), host_budget_mib=float(request["host_budget_mib"]),
                         where=where)
    if request.get("step"):
        return estimate_user_step(request["step"], request["step"], world_size=int(request.get("world_size", 1)),
                                  **budgets_given)
    if request.get("training"):
        return estimate_training(request["training"], **budgets_given)
    shape = request.get("input_shape")
    return estimate_model(FactoryRef(request["factory"]), request["factory"], batch_size=request["batch_size"],
                          input_shape=tuple(shape) if shape else None, optimizer=request["optimizer"],
                          dtype=request["dtype"], data_parallel=request["data_parallel"], **budgets_given)


def request_subject(request: Mapping[str, Any]) -> str:
    """What an estimate request estimates, as the spec names it: ``model.step X``, ``training (type,
    peft)`` or ``model.factory X``."""
    if request.get("step"):
        return f"model.step {request['step']}"
    if request.get("training"):
        return _training_subject(request["training"])
    return f"model.factory {request['factory']}"


def _training_subject(training: Mapping[str, Any]) -> str:
    return f"training ({training.get('hf_model_type')}, {training.get('peft', 'none')})"
