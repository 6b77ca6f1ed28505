"""A Ray job's runtime environment, carried to the scheduled job's processes.

``ray job submit --working-dir . --runtime-env-json '{"pip": [...], "env_vars": {...}}' --
hier-sched run spec.yaml`` uploads the working directory and starts ``hier-sched run`` in a
copy of it, with the job's ``runtime_env`` (the ``gcs://`` URI of that upload, ``pip``,
``env_vars``...). The scheduled job, though, runs as a Ray task of the node actor on whatever
node the scheduler picks — not as part of that Ray job — so it would see none of it. Hence
two halves:

* submitting (``run``, ``submit``, ``hier_sched.submit``): ``inherit_ray_job_env`` adds the
  ``runtime_env`` of the Ray job this process is a driver of to the spec (the spec's own keys
  win; ``env_vars`` are merged), and makes a ``workdir`` inside the job's copy of the working
  directory relative to it — the copy sits at another path on another node;
* launching (the node actor): the job's Ray task runs with the spec's ``runtime_env``, so Ray
  fetches the working directory on that node, installs the ``pip`` packages, and starts the
  task in that directory; the job's process gets the scheduler's own variables
  (``CUDA_VISIBLE_DEVICES``, the MPS limits, the checkpoint protocol's) on top
  (``node_actor.launcher.run_process``).

The uploaded package stays in Ray's object store while a job references it: the Ray job (as long
as ``run`` waits) and the scheduled job's task (while it runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ray_job_runtime_env", "inherit_ray_job_env"]


def ray_job_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` of the Ray job this process is a driver of; empty when it is none
    (a shell outside any Ray job, or not connected to Ray)."""
    import ray

    if not ray.is_initialized():
        return {}
    return {k: v for k, v in dict(ray.get_runtime_context().runtime_env or {}).items() if v}


def inherit_ray_job_env(spec: Mapping[str, Any], job_env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``spec`` (a spec dict) with the Ray job's runtime environment (``job_env``; default: this
    process's, ``ray_job_runtime_env``) under its ``runtime_env``."""
    job_env = dict(ray_job_runtime_env() if job_env is None else job_env)
    data = dict(spec)
    if not job_env:
        return data
    own = dict(data.get("runtime_env") or {})
    merged = {**job_env, **own}
    env_vars = {**job_env.get("env_vars", {}), **own.get("env_vars", {})}
    if env_vars:
        merged["env_vars"] = env_vars
    data["runtime_env"] = merged
    uri = merged.get("working_dir")
    if isinstance(uri, str) and data.get("workdir"):
        data["workdir"] = _relative_to_copy(data["workdir"], uri)
    return data


def _relative_to_copy(workdir: str, uri: str) -> str:
    """``workdir`` relative to this node's copy of the working directory ``uri`` when it lies in
    it (each node unpacks its own copy, and the job's task starts inside it); else unchanged."""
    from ray._private.runtime_env.packaging import get_local_dir_from_uri  # a DeveloperAPI: Ray's own naming

    copy_name = get_local_dir_from_uri(uri, "/").name
    path = Path(workdir)
    for parent in (path, *path.parents):
        if parent.name == copy_name:
            return str(path.relative_to(parent))
    return workdir

