"""Where the shared, read-only trace data lives.

The data is never copied into the repository: loaders read it from ``$HIER_SCHED_SHARED``
(default ``<repo root>/../shared``) on every run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from hier_sched.common.paths import shared_dir
from traces.schema import TraceError

__all__ = ["shared_dir", "data_file", "cached_per_data_dir"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def data_file(*parts: str) -> Path:
    """A file under ``<shared>/data``; a clear error if the shared data is not where we look."""
    path = shared_dir().joinpath("data", *parts)
    if not path.exists():
        raise TraceError(f"shared data not found: {path} (set HIER_SCHED_SHARED to the shared/ directory)")
    return path


def cached_per_data_dir(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``functools.cache`` that also keys on the current shared directory: whoever points
    ``HIER_SCHED_SHARED`` elsewhere (a test with a broken file, a user) never gets tables parsed
    from another directory. Cached values are shared: they must be immutable."""
    cached = functools.cache(lambda root, *args: fn(*args))

    @functools.wraps(fn)
    def per_dir(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return cached(shared_dir(), *args, **kwargs)

    return per_dir
