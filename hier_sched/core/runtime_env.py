"""The ``runtime_env`` field of a job spec: the Ray runtime environment its processes run in.

Ray validates a runtime environment itself, but only when the job's task is started on a
node — too late to tell the user. What is checked here, at submission, is what would otherwise
fail there for a reason of ours: the job's processes start on some node of the cluster, so
code must come from a URI every node can fetch (``gcs://`` — what ``ray job submit
--working-dir`` uploads —, ``s3://``, ``https://``...), never a path on the submitting machine;
and ``env_vars`` must be strings. Every other key (``pip``, ``uv``, ``conda``,
``py_executable``...) is Ray's to check.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_runtime_env"]

_URI_KEYS = ("working_dir", "py_modules")


def check_runtime_env(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it can reach every node; a ``ValueError`` naming the key otherwise."""
    for key in _URI_KEYS:
        entries = value.get(key)
        if entries is None:
            continue
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, str) or "://" not in entry:
                raise ValueError(f"{key}: {entry!r} is not a URI that every node can fetch (gcs://, s3://, "
                                 "https://...); a job run by 'ray job submit --working-dir DIR -- hier-sched run "
                                 "SPEC' gets the uploaded working_dir by itself")
    env_vars = value.get("env_vars")
    if env_vars is not None and (not isinstance(env_vars, dict)
                                 or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items())):
        raise ValueError("env_vars: must map names to string values")
    return value
