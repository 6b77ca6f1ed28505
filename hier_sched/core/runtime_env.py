"""The ``runtime_env`` field of a job spec: the Ray runtime environment its processes run in.

Ray validates a runtime environment itself, but only when the job's task is started on a
node — too late to tell the user. What is checked here, at submission, is what would otherwise
fail later for a reason of ours:

* the job's processes start on some node of the cluster, so code must come from a URI every
  node can fetch (``gcs://`` — what ``ray job submit --working-dir`` uploads —, ``s3://``,
  ``https://``...), never a path on the submitting machine;
* ``env_vars`` end up in a process environment: string names (non-empty, no ``=``) and string
  values, no NUL character, and none of the variables the scheduler sets for the job
  (``env_var_problem``: its GPUs, its MPS limits, its id and checkpoint directory);
* the whole value travels in the scheduler's write-ahead log: plain data only (mappings with
  string keys, lists, strings, booleans, 64-bit integers, finite numbers), not nested absurdly.

Every other key (``pip``, ``uv``, ``conda``, ``py_executable``...) is Ray's to check.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_runtime_env", "env_var_problem", "SCHEDULER_ENV"]

_URI_KEYS = ("working_dir", "py_modules")
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_MAX_DEPTH = 32

# What the node sets on each job's process (node_actor.launch_plan, node_actor.launcher,
# hier_sched.common.checkpointing). A job that set them itself could leave the GPUs it was given, join
# or escape an MPS daemon's limits, or take another job's id or checkpoint directory.
SCHEDULER_ENV = {
    "CUDA_VISIBLE_DEVICES": "the GPUs the scheduler placed the job on",
    "HIER_SCHED_JOB_ID": "the job's id",
    "HIER_SCHED_CHECKPOINT_DIR": "the spec's checkpoint_dir",
    "HIER_SCHED_RESUME": "whether the run resumes a checkpoint",
}
_SCHEDULER_ENV_PREFIX = "CUDA_MPS_"  # the node's MPS daemon and the job's MPS limits


def env_var_problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be in a job's environment, or None."""
    if not name or "=" in name or "\0" in name + value:
        return "a variable needs a non-empty name without '=' and no NUL character"
    if name in SCHEDULER_ENV or name.startswith(_SCHEDULER_ENV_PREFIX):
        what = SCHEDULER_ENV.get(name, "the node's MPS daemon and the job's MPS limits")
        return f"set by the scheduler ({what}); a job cannot choose it"
    return None


def check_runtime_env(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it can reach every node; a ``ValueError`` naming the key otherwise."""
    _plain(value, "", 0)
    for key in _URI_KEYS:
        entries = value.get(key)
        if entries is None:
            continue
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, str) or "://" not in entry:
                raise ValueError(f"{key}: {_short(entry)} is not a URI that every node can fetch (gcs://, s3://, "
                                 "https://...); a job run by 'ray job submit --working-dir DIR -- hier-sched run "
                                 "SPEC' gets the uploaded working_dir by itself")
    env_vars = value.get("env_vars")
    if env_vars is not None:
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise ValueError("env_vars: must map names to string values")
        for name, text in env_vars.items():
            if problem := env_var_problem(name, text):
                raise ValueError(f"env_vars: {_short(name)}: {problem}")
    return value


def _plain(value: Any, where: str, depth: int) -> None:
    """Plain data the write-ahead log can hold, or a ``ValueError`` saying where it is not."""
    here = where or "runtime_env"
    if depth > _MAX_DEPTH:
        raise ValueError(f"{here}: nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"{here}: integer out of the 64-bit range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{here}: not a finite number")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _plain(item, f"{where}.{i}" if where else str(i), depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{here}: keys must be strings (got {_short(key)})")
            name = key if len(key) <= 40 else key[:40] + "..."
            _plain(item, f"{where}.{name}" if where else name, depth + 1)
    else:
        raise ValueError(f"{here}: {type(value).__name__} is not plain data (mappings, lists, strings, numbers)")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
