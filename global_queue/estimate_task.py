"""Estimates as Ray tasks in the job's own ``runtime_env``: where the job's code lives, never in
the queue actor's process.

Each task (``_estimate_task``) asks for one CPU and no GPU (and hides every GPU from the model's
code), runs at a lower priority than the scheduler's actors, and gets the job's ``runtime_env``:
its ``working_dir`` / ``py_modules`` URIs (fetched by Ray, the task starts in the working
directory's copy), ``pip`` / ``uv`` / ``conda`` packages and ``env_vars``, plus the spec's ``env``.
The spec's ``workdir`` is put first on the import path inside (``estimators.job_estimate``). The
queue polls with ``ray.wait(timeout=0)`` on its tick; a cancel is forced (the task's tracing
worker and its child die with it, ``estimators.trace_worker``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayError

from estimators.job_estimate import request_subject

__all__ = ["RayEstimateRunner", "estimate_runtime_env"]

log = logging.getLogger(__name__)


@ray.remote(num_cpus=1, num_gpus=0, max_retries=0)
def _estimate_task(request: dict[str, Any]) -> dict[str, Any]:
    from estimators.job_estimate import estimate_for_request

    os.nice(10)  # the scheduler's actors share this node's cores
    return estimate_for_request(request, where=f"Ray task on {ray.util.get_node_ip_address()}")


def estimate_runtime_env(request: Mapping[str, Any]) -> dict[str, Any]:
    """The job's ``runtime_env`` with its ``env`` and no GPU for the model's code."""
    env = dict(request.get("runtime_env") or {})
    env["env_vars"] = {**env.get("env_vars", {}), **request.get("env", {}), "CUDA_VISIBLE_DEVICES": "",
                       "OMP_NUM_THREADS": "1", "HIER_SCHED_ESTIMATING": "1"}
    return env


class RayEstimateRunner:
    """``EstimateRunner`` (``global_queue.estimate_pool``) over Ray tasks."""

    def __init__(self) -> None:
        self.refs: dict[str, Any] = {}  # key -> the task's ObjectRef
        self.keys: dict[Any, str] = {}

    def start(self, key: str, request: Mapping[str, Any]) -> None:
        ref = _estimate_task.options(runtime_env=estimate_runtime_env(request),
                                     name=f"hs-estimate:{request_subject(request)}").remote(dict(request))
        self.refs[key] = ref
        self.keys[ref] = key

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        if not self.refs:
            return []
        ready, _ = ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        out = []
        for ref in ready:
            key = self.keys.pop(ref)
            del self.refs[key]
            try:
                outcome = ray.get(ref, timeout=0)
            except RayError as exc:  # the task could not start (its runtime_env) or its worker died
                log.warning("an estimate task failed: %s", exc)
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                outcome = {"reject": f"the estimate could not be made in the job's runtime_env: "
                                     f"{type(exc).__name__}: {first}"}
            out.append((key, outcome))
        return out

    def cancel(self, key: str) -> None:
        ref = self.refs.pop(key, None)
        if ref is None:
            return
        self.keys.pop(ref, None)
        try:
            ray.cancel(ref, force=True)
        except Exception as exc:  # noqa: BLE001 - already finished or gone: nothing left to stop
            log.info("cancelling an estimate task: %s", exc)
