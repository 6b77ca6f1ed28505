"""What the scheduler believes a submitted job needs per GPU (MiB), as the live queue decides it.

Which answer counts is the core's rule (``hier_sched.core.estimate_rules.believe``: a declared
``memory_mib`` wins, ``none`` gives no estimate, ``oracle`` the emulation profile's true peak).
A model estimator needs the job's model, and the queue never imports the user's code: a spec
with a ``model.factory`` (or the user's own training step, ``model.step``) that a model estimator
must read is accepted *estimating*, and its ``estimate_request`` (plain data, logged with the
submission) is answered where the job's code lives (``estimators.job_estimate``, in a Ray task
with the job's ``runtime_env``: ``global_queue.estimate_pool``). A model estimator with neither
has nothing to estimate from.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from hier_sched.core.estimate_rules import Belief, believe, learns_peak, rule
from hier_sched.core.spec import JobSpec, SpecError
from hier_sched.core.units import gib

__all__ = ["estimate_for_spec", "estimate_warning", "needs_model_estimate", "estimate_request", "estimate_key",
           "request_what", "estimate_parts",
           "pending_belief", "client_belief"]


def needs_model_estimate(spec: JobSpec) -> bool:
    """Whether the job's estimate must come from its model or its own step (where its code lives)."""
    return (spec.memory_mib is None and rule(spec.estimator).kind == "model"
            and (spec.training is not None
                 or (spec.model is not None and (spec.model.factory is not None or spec.model.step is not None))))


def estimate_for_spec(spec: JobSpec) -> Belief:
    """The belief for a job whose estimate needs no model (``needs_model_estimate`` is false)."""
    true_mib = spec.emulation.peak_mib if spec.emulation is not None else None
    return believe(spec.estimator, declared_mib=spec.memory_mib, true_mib=true_mib,
                   ask=lambda _: (None, f"no estimate (estimator {spec.estimator!r} needs model.factory)"))


def estimate_request(spec: JobSpec, gpu_types: list[str], *, timeout_s: float,
                     host_budget_mib: float) -> dict[str, Any]:
    """What ``estimators.job_estimate.estimate_for_request`` needs, as plain data (it is logged)."""
    model = spec.model
    where = {"estimator": spec.estimator, "gpu_types": list(gpu_types), "workdir": spec.workdir,
             "runtime_env": spec.runtime_env or {}, "env": dict(spec.env), "timeout_s": timeout_s,
             "host_budget_mib": host_budget_mib}
    if model is not None and model.step is not None:  # the step makes its own model and batch; rank 0 of the job's GPUs
        return {"step": model.step, "world_size": spec.gpus, **where}
    if spec.training is not None:  # an LLM's set-up: its architecture is built from its config, no user code
        return {"training": spec.training.model_dump(mode="json"), **where}
    assert model is not None and model.factory is not None
    batch = model.batch_size or spec.batch_size
    if batch is None:
        raise SpecError(["model.batch_size: required to estimate memory from model.factory"], f"job spec {spec.name!r}")
    return {"factory": model.factory, "batch_size": batch,
            "input_shape": list(model.input_shape) if model.input_shape else None, "optimizer": model.optimizer,
            "dtype": model.dtype, "data_parallel": spec.data_parallel, **where}


def request_what(request: dict[str, Any]) -> str:
    """What a request estimates, for ``status``: the user's step, or the factory's model at its batch."""
    if request.get("step"):
        return f"the step {request['step']}"
    if request.get("training"):
        t = request["training"]
        return f"the training set-up ({t.get('hf_model_type')}, {t.get('peft', 'none')}, {t.get('precision')})"
    return f"{request['factory']} (batch {request['batch_size']})"


def estimate_key(request: dict[str, Any]) -> str:
    """Jobs whose requests are equal (the same factory in the same environment, batch, shape,
    optimizer, estimator and GPU types) get one estimate."""
    what = {k: v for k, v in request.items() if k not in ("timeout_s", "host_budget_mib")}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def pending_belief(spec: JobSpec, request: dict[str, Any]) -> Belief:
    """The belief while the estimate is made: no figure yet, and what is being done."""
    return Belief(None, f"estimating: {spec.estimator} on {request_what(request)} where the job's code lives",
                  learns=learns_peak(spec.estimator, declared=False))


def client_belief(spec: JobSpec, estimate: dict[str, Any]) -> Belief:
    """The belief from an estimate the submitting process made (``hier_sched.front.client``): a
    figure per GPU type, checked like a declared ``memory_mib`` (the submitter could declare any)."""
    needs = estimate.get("needs")
    if not isinstance(needs, dict) or not needs or not all(
            isinstance(t, str) and isinstance(m, (int, float)) and not isinstance(m, bool) and 0 < m < 2**40
            for t, m in needs.items()):
        raise SpecError([f"estimate: expected {{'needs': {{gpu type: MiB > 0}}, 'source': ...}} "
                         f"(got {estimate!r:.200})"], f"job spec {spec.name!r}")
    pairs = tuple(sorted((t, float(m)) for t, m in needs.items()))
    return Belief(max(m for _, m in pairs), str(estimate.get("source", "estimated by the submitting process"))[:300],
                  learns=learns_peak(spec.estimator, declared=False), needs=pairs)


_MAX_PARTS = 16


def estimate_parts(outcome: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """What each GPU type's figure of an estimate is made of (``MemoryParts.as_dict`` per type, or an
    LLM's parts: weights, gradients, ...), as kept with the job for ``status``; None when the
    estimate says nothing of it. Only finite ``*_mib`` figures (and the baseline's source) of the
    types the estimate names are kept: a submitting process may send anything."""
    parts = outcome.get("parts")
    if not isinstance(parts, dict):
        return None
    kept = {}
    for gpu, figures in parts.items():
        if gpu not in outcome.get("needs", {}) or not isinstance(figures, dict):
            continue
        numbers = {k[:40]: round(float(v), 1) for k, v in list(figures.items())[:_MAX_PARTS]
                   if isinstance(k, str) and k.endswith("_mib") and isinstance(v, (int, float))
                   and not isinstance(v, bool) and math.isfinite(v)}
        source = figures.get("baseline_source")
        kept[str(gpu)] = {**numbers, **({"baseline_source": source[:200]} if isinstance(source, str) else {})}
    return kept or None


def estimate_warning(spec: JobSpec, estimate: float | None, no_estimate_mib: float) -> str | None:
    """What to tell the submitter when an estimator was asked for and found nothing to estimate
    from (no model factory, step or training section): the job runs as of unknown size, which they may not expect."""
    if estimate is not None or rule(spec.estimator).kind != "model":
        return None
    return (f"est={spec.estimator!r} found nothing to estimate from (no model.factory, model.step, training or "
            f"memory_mib): the job is placed as of unknown size, needing {gib(no_estimate_mib)} free on each GPU")
