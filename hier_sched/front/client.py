"""The Python API: submit a function (or a command) to the running hier_sched cluster.

    import hier_sched as hs
    h = hs.submit(train, 64, est=7106, gpus=1, name="resnet50-bs64")
    h.result(timeout=600)    # the function's return value; JobFailed with the reason otherwise

``est`` says what the scheduler should believe the job needs per GPU: MiB (a number), an
estimator name (``"auto"``, ``"horus"``, ``"none"``, ...), a model description
``{"factory": "pkg.mod:build", "batch_size": 64, "input_shape": [3, 224, 224]}``, or an
estimate object with ``.peak_mib`` (``estimators.MemoryEstimate``). Other keyword arguments are
job-spec fields (``priority``, ``checkpoint_dir``, ``emulation``, ...). The scheduler is found
through Ray from any node of its cluster (``RAY_ADDRESS``, this process's own Ray connection,
or a cluster on this node: ``hier_sched.front.connection``).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hier_sched.core.job import TERMINAL  # str states compare equal to these members
from hier_sched.core.spec import SpecError, parse_spec
from hier_sched.front.connection import connect
from hier_sched.front.ray_job_env import inherit_ray_job_env

__all__ = ["submit", "wait", "JobHandle", "JobFailed", "JobCancelled", "spec_from_est"]



class JobFailed(RuntimeError):
    """The job ended ``failed``; the message is the scheduler's reason."""


class JobCancelled(RuntimeError):
    pass


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
        return {"model": dict(est)}
    peak = getattr(est, "peak_mib", None)
    if isinstance(peak, (int, float)) and not isinstance(peak, bool):
        return {"memory_mib": _mib(peak)}
    raise SpecError([f"est: expected MiB, an estimator name, a model description or an estimate (got {type(est).__name__})"])


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


def submit(fn: Callable[..., Any] | Sequence[str], *args: Any, est: Any = None, gpus: int = 1, name: str | None = None,
           fn_kwargs: Mapping[str, Any] | None = None, **spec_fields: Any) -> JobHandle:
    """Queue ``fn(*args, **fn_kwargs)`` (or a command argv) as a training job; returns its handle."""
    data: dict[str, Any] = {"gpus": gpus, "workdir": os.getcwd(), **spec_from_est(est), **spec_fields}
    payload = None
    if isinstance(fn, (list, tuple)):
        if not fn:
            raise SpecError(["command: must not be empty (give the program and its arguments)"])
        data.update(name=name or os.path.basename(str(fn[0])), command=list(fn))
        parse_spec(data)
    elif callable(fn):
        data["name"] = name or getattr(fn, "__name__", "job")
        parse_spec(data, callable_=fn)
        import cloudpickle  # the standalone package, so the job's process need not import Ray to load it

        payload = cloudpickle.dumps((fn, args, dict(fn_kwargs or {})))
    else:
        raise SpecError([f"fn: expected a callable or a command argv list (got {type(fn).__name__})"])
    scheduler = connect()  # connected: a driver's runtime_env (working_dir, pip, env_vars) goes with the job
    answer = scheduler.call("submit", inherit_ray_job_env(data), payload)
    if "error" in answer:
        raise SpecError(answer.get("problems") or [answer["error"]], f"job spec {data['name']!r}")
    if answer.get("warning"):
        warnings.warn(f"{answer['job_id']}: {answer['warning']}", UserWarning, stacklevel=2)
    return JobHandle(answer["job_id"])


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
