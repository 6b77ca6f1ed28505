"""The Python API: submit a function (or a command) to the running hier_sched cluster.

    import hier_sched as hs
    h = hs.submit(train, 64, est=7106, gpus=1, name="resnet50-bs64")
    h.result(timeout=600)    # the function's return value; JobFailed with the reason otherwise

``est`` says what the scheduler should believe the job needs per GPU: MiB (a number), an
estimator name (``"auto"``, ``"horus"``, ``"none"``, ...), a model description
``{"factory": "pkg.mod:build", "batch_size": 64, "input_shape": [3, 224, 224]}``, your own
training step (a zero-argument callable that builds the model, optimizer and batch and returns
the step to run, or runs one step: ``estimators.user_step``; traced here, as written, with its
autocast, checkpointing and loss; ``{"step": "pkg.mod:fn"}`` names one in the job's code), or an
estimate object with ``.peak_mib`` (``estimators.MemoryEstimate``). A model description whose
``factory`` is a model object, a zero-argument callable, or a ``"pkg.mod:fn"`` string importable
in this process is estimated here, before submitting (this process's tracing worker, under the
same time and host-memory budgets as on the cluster; a model that cannot be built raises
``SpecError`` naming the error); any other factory string is estimated on the cluster, where the
job's code lives, while the job waits ``estimating``. Other keyword arguments are
job-spec fields (``priority``, ``checkpoint_dir``, ``emulation``, ...). The scheduler is found
through Ray from any node of its cluster (``RAY_ADDRESS``, this process's own Ray connection,
or a cluster on this node: ``hier_sched.front.connection``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hier_sched.core.job import TERMINAL  # str states compare equal to these members
from hier_sched.core.spec import JobSpec, SpecError, parse_spec
from hier_sched.front.connection import connect
from hier_sched.front.ray_job_env import inherit_ray_job_env

__all__ = ["BatchRefused", "JobCancelled", "JobFailed", "JobHandle", "spec_from_est", "submit", "submit_many", "wait"]



class JobFailed(RuntimeError):
    """The job ended ``failed``; the message is the scheduler's reason."""


class JobCancelled(RuntimeError):
    pass


class BatchRefused(SpecError):
    """Some jobs of a ``submit_many`` call were refused; the others were accepted and queued.
    ``handles``: each job's handle, in order, None where refused; ``refusals``: index -> why."""

    def __init__(self, handles: list[JobHandle | None], refusals: dict[int, str]):
        self.handles = handles
        self.refusals = refusals
        accepted = sum(h is not None for h in handles)
        super().__init__([f"job {i}: {reason}" for i, reason in sorted(refusals.items())],
                         f"submit_many ({accepted} of {len(handles)} accepted)")


def spec_from_est(est: Any) -> dict[str, Any]:
    """The spec fields that express ``est``."""
    if est is None:
        return {}
    if isinstance(est, bool):
        raise SpecError([f"est: expected MiB, an estimator name, a model description or an estimate (got {est!r})"])
    if isinstance(est, (int, float)):
        return {"memory_mib": _mib(est)}
    if isinstance(est, str):
        return {"estimator": est}
    if isinstance(est, Mapping):
        model = dict(est)
        for field in ("factory", "step"):
            if _estimated_here(model.get(field)):
                model.pop(field)  # an object, or a string this process imports: estimated before submitting
        return {"model": model} if model else {}
    peak = getattr(est, "peak_mib", None)
    if isinstance(peak, (int, float)) and not isinstance(peak, bool):
        return {"memory_mib": _mib(peak)}
    if callable(est):  # the user's own training step: estimated here, before submitting
        return {}
    raise SpecError([f"est: expected MiB, an estimator name, a model description, your training step or an "
                     f"estimate (got {type(est).__name__})"])


def _estimated_here(factory: Any) -> bool:
    """Whether a model description's ``factory`` is estimated in this process: an object or a
    callable, or a ``"pkg.mod:fn"`` whose module this process has or finds on its path."""
    if factory is None:
        return False
    if not isinstance(factory, str):
        return True
    module = factory.partition(":")[0]
    return module in sys.modules or _on_path(module)


def _on_path(module: str) -> bool:
    """The module's file on this process's import path, looked up without importing anything."""
    *packages, leaf = module.split(".")
    for entry in sys.path:
        base = os.path.join(entry or os.getcwd(), *packages)
        if os.path.isfile(os.path.join(base, leaf + ".py")) or os.path.isfile(os.path.join(base, leaf, "__init__.py")):
            return True
    return not packages and importlib.util.find_spec(leaf) is not None  # a top-level module: nothing runs


def _estimate_here(est: Any, spec: JobSpec, scheduler: Any) -> dict[str, Any] | None:
    """The estimate per GPU type of the cluster, made in this process for the user's step or a
    model description ``_estimated_here`` takes; None for every other ``est``. Raises ``SpecError``
    when the model cannot be built or the step not traced (naming the error)."""
    step = est if callable(est) and not isinstance(est, Mapping) else (
        est.get("step") if isinstance(est, Mapping) and _estimated_here(est.get("step")) else None)
    if step is not None:
        return _step_estimated_here(step, spec, scheduler)
    if not isinstance(est, Mapping) or not _estimated_here(est.get("factory")):
        return None
    from estimators.job_estimate import FactoryRef, budgets, estimate_model

    factory = est["factory"]
    name = factory if isinstance(factory, str) else getattr(factory, "__qualname__", type(factory).__name__)
    model = spec.model
    batch = (model.batch_size if model else None) or spec.batch_size
    if batch is None:
        raise SpecError(["model.batch_size: required to estimate memory from model.factory"], f"job spec {spec.name!r}")
    timeout_s, host_mib = budgets()
    outcome = estimate_model(
        FactoryRef(factory) if isinstance(factory, str) else factory, name, batch_size=batch,
        input_shape=model.input_shape if model else None, optimizer=model.optimizer if model else "adam",
        dtype=model.dtype if model else "float32", data_parallel=spec.data_parallel, estimator=spec.estimator,
        gpu_types=scheduler.call("cluster")["gpu_types"], timeout_s=timeout_s, host_budget_mib=host_mib,
        where="in the submitting process")
    if "reject" in outcome:
        raise SpecError([outcome["reject"]], f"job spec {spec.name!r}")
    return outcome


def _step_estimated_here(step: Callable[[], Any] | str, spec: JobSpec, scheduler: Any) -> dict[str, Any]:
    from estimators.job_estimate import budgets, estimate_user_step
    from estimators.user_step import UserStep

    timeout_s, host_mib = budgets()
    outcome = estimate_user_step(step, UserStep(step).name, world_size=spec.gpus, estimator=spec.estimator,
                                 gpu_types=scheduler.call("cluster")["gpu_types"], timeout_s=timeout_s,
                                 host_budget_mib=host_mib, where="in the submitting process")
    if "reject" in outcome:
        raise SpecError([outcome["reject"]], f"job spec {spec.name!r}")
    return outcome


def _mib(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float: no GPU has that much memory
        raise SpecError([f"est: {str(value)[:20]}... MiB is not a memory size"]) from None


class JobHandle:
    def __init__(self, job_id: str):
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"

    def status(self) -> dict[str, Any]:
        answer = connect().call("status", self.job_id)
        if answer is None:
            raise LookupError(f"the scheduler does not know job {self.job_id!r}")
        return answer

    def cancel(self) -> dict[str, Any]:
        return connect().call("cancel", self.job_id)

    def result(self, timeout: float | None = None, poll_s: float = 0.25) -> Any:
        """Wait for the job; its return value (None for command jobs), or raise why it did not succeed."""
        deadline = None if timeout is None else time.time() + timeout
        while True:
            state = self.status()
            if state["state"] in TERMINAL:
                break
            if deadline is not None and time.time() >= deadline:
                raise TimeoutError(f"job {self.job_id} still {state['state']} after {timeout} s")
            time.sleep(poll_s)
        if state["state"] == "failed":
            raise JobFailed(f"job {self.job_id} failed: {state['reason']}")
        if state["state"] == "cancelled":
            raise JobCancelled(f"job {self.job_id} was cancelled: {state['reason']}")
        data = connect().call("result", self.job_id)
        if data is None:
            return None
        import cloudpickle

        return cloudpickle.loads(data)


def _job(fn: Callable[..., Any] | Sequence[str], args: Sequence[Any], fn_kwargs: Mapping[str, Any] | None,
         data: dict[str, Any], name: str | None) -> tuple[dict[str, Any], JobSpec, bytes | None]:
    """The job's spec fields, its validated spec and its payload (a callable's, pickled)."""
    data = dict(data)
    payload = None
    if isinstance(fn, (list, tuple)):
        if not fn:
            raise SpecError(["command: must not be empty (give the program and its arguments)"])
        data.update(name=name or os.path.basename(str(fn[0])), command=list(fn))
        spec = parse_spec(data)
    elif callable(fn):
        data["name"] = name or getattr(fn, "__name__", "job")
        spec = parse_spec(data, callable_=fn)
        import cloudpickle  # the standalone package, so the job's process need not import Ray to load it

        payload = cloudpickle.dumps((fn, tuple(args), dict(fn_kwargs or {})))
    else:
        raise SpecError([f"fn: expected a callable or a command argv list (got {type(fn).__name__})"])
    return data, spec, payload


def submit(fn: Callable[..., Any] | Sequence[str], *args: Any, est: Any = None, gpus: int = 1, name: str | None = None,
           fn_kwargs: Mapping[str, Any] | None = None, **spec_fields: Any) -> JobHandle:
    """Queue ``fn(*args, **fn_kwargs)`` (or a command argv) as a training job; returns its handle."""
    data, spec, payload = _job(fn, args, fn_kwargs,
                               {"gpus": gpus, "workdir": os.getcwd(), **spec_from_est(est), **spec_fields}, name)
    scheduler = connect()  # connected: a driver's runtime_env (working_dir, pip, env_vars) goes with the job
    estimate = _estimate_here(est, spec, scheduler)
    answer = scheduler.submit(inherit_ray_job_env(data), payload, estimate)
    if "error" in answer:
        raise SpecError(answer.get("problems") or [answer["error"]], f"job spec {data['name']!r}")
    if answer.get("warning"):
        warnings.warn(f"{answer['job_id']}: {answer['warning']}", UserWarning, stacklevel=2)
    return JobHandle(answer["job_id"])


def submit_many(jobs: Sequence[Callable[[], Any] | Sequence[str]], *, est: Any = None, gpus: int = 1,
                name: str | None = None, **spec_fields: Any) -> list[JobHandle]:
    """Queue several jobs in one call: each a callable (called with no arguments) or a command argv,
    all with the same ``est``, ``gpus``, ``name`` and spec fields. The queue writes them to its log
    with one durable write and answers once every accepted job is durable. Each job is judged
    alone: one that is refused (its spec is invalid, or it can never fit the cluster) does not
    stop the others; ``BatchRefused`` then says which and holds the accepted jobs' handles.
    Each job carries a request id of its own: a call retried after a queue restart returns the
    jobs the first call created. Returns the handles, in order."""
    shared = {"gpus": gpus, "workdir": os.getcwd(), **spec_from_est(est), **spec_fields}
    refusals: dict[int, str] = {}
    prepared: dict[int, tuple[dict[str, Any], bytes | None]] = {}
    spec = None
    for i, fn in enumerate(jobs):
        try:
            data, spec, payload = _job(fn, (), None, shared, name)
        except SpecError as exc:
            refusals[i] = str(exc)
            continue
        prepared[i] = (data, payload)
    handles: list[JobHandle | None] = [None] * len(jobs)
    if prepared:
        scheduler = connect()
        order = list(prepared)
        estimate = _estimate_here(est, spec, scheduler)  # one est for all: estimated once
        answers = scheduler.submit_many([inherit_ray_job_env(prepared[i][0]) for i in order],
                                        [prepared[i][1] for i in order], [estimate] * len(order))
        for i, answer in zip(order, answers):
            if "error" in answer:
                refusals[i] = answer["error"]
                continue
            if answer.get("warning"):
                warnings.warn(f"{answer['job_id']}: {answer['warning']}", UserWarning, stacklevel=2)
            handles[i] = JobHandle(answer["job_id"])
    if refusals:
        raise BatchRefused(handles, refusals)
    return handles  # type: ignore[return-value]  # none is None: nothing was refused


def wait(handles: Sequence[JobHandle], timeout: float | None = None, poll_s: float = 0.1) -> dict[str, str]:
    """Wait until every job ended; ``{job_id: final state}``. One call per look for all the jobs
    still running (``handle.result()`` for each would ask once per job)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    final: dict[str, str] = {}
    left = [h.job_id for h in handles]
    scheduler = connect()
    while left:
        states = scheduler.call("states", left)
        unknown = [j for j in left if states.get(j) is None]
        if unknown:
            raise LookupError(f"the scheduler does not know job(s) {', '.join(unknown[:5])}")
        final.update({j: s for j, s in states.items() if s in TERMINAL})
        left = [j for j in left if j not in final]
        if left and deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(left)} of {len(handles)} job(s) still running after {timeout} s")
        if left:
            time.sleep(poll_s)
    return final
