"""Learning from what jobs really used: a repeated job is estimated from its measured peak.

Observations persist in ``observed_peaks.json`` under a state directory (argument, else env
``HIER_SCHED_STATE_DIR``, else ``~/.hier_sched``); writes are atomic (temp file + rename), so a
crash mid-write never loses the earlier observations.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from estimators.baseline import learn_from_peak
from estimators.types import EstimatorError
from hier_sched.common import paths
from hier_sched.common.private_files import replace_private

__all__ = ["job_signature", "record_observed_peak", "observed_peak", "record_trace", "state_dir", "STATE_FILE",
           "TRACES_FILE"]

STATE_FILE = "observed_peaks.json"
# What the trace estimated for a job besides the process baseline, so that the job's measured peak
# teaches the baseline (``baseline.learn_from_peak``).
TRACES_FILE = "traced_jobs.json"
_TRACES_KEPT = 2000


def state_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path) if path is not None else paths.state_dir()


def _model_identity(model: str | nn.Module | Callable[[], nn.Module]) -> str:
    if isinstance(model, str):
        return model
    if isinstance(model, nn.Module):
        # The architecture printout names every layer and its shape: equal printouts, equal memory.
        text = repr(model)
        return f"{type(model).__module__}.{type(model).__qualname__}#{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    if callable(model):
        name = getattr(model, "__qualname__", None) or repr(model)
        return f"{getattr(model, '__module__', '?')}:{name}"
    raise EstimatorError(f"cannot make a job signature from a {type(model).__name__}")


def job_signature(model: str | nn.Module | Callable[[], nn.Module], *, batch_size: int, optimizer: str = "adam",
                  gpu: str = "A100-40GB", input_shape: Sequence[int] | None = None, dtype: str = "float32",
                  data_parallel: bool = False) -> str:
    """A stable key for "the same job": model identity, batch, input shape, optimizer, dtype, GPU
    type, and whether it trains data-parallel (its GPUs then also hold gradient buckets)."""
    shape = ",".join(map(str, input_shape)) if input_shape else "-"
    text = f"{_model_identity(model)}|b={batch_size}|in={shape}|opt={optimizer}|dtype={dtype}|gpu={gpu}"
    if data_parallel:  # appended only when set: keys recorded before the field existed still match
        text += "|ddp"
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _load(path: Path) -> dict[str, dict[str, float]]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EstimatorError(f"observed-peaks file {path} is unreadable: {exc}") from None
    return data if isinstance(data, dict) else {}


def _write(directory: Path, name: str, data: dict, *, sort_keys: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    replace_private(directory / name, json.dumps(data, indent=1, sort_keys=sort_keys))


def record_observed_peak(signature: str, mib: float, *, state: str | os.PathLike | None = None,
                         stack: str | None = None) -> None:
    """Remember a measured peak (MiB). Repeated runs keep the largest value seen. When the job was
    estimated by a trace, the peak also teaches the process baseline of its GPU type and ``stack``
    (the software stack of the node it ran on, when known)."""
    if not isinstance(mib, (int, float)) or not math.isfinite(mib) or mib <= 0:
        raise EstimatorError(f"observed peak must be a positive number of MiB (got {mib!r})")
    directory = state_dir(state)
    data = _load(directory / STATE_FILE)
    entry = data.get(signature, {"max_mib": 0.0, "runs": 0})
    data[signature] = {"max_mib": max(float(entry["max_mib"]), float(mib)), "runs": int(entry["runs"]) + 1,
                       "last_mib": float(mib)}
    _write(directory, STATE_FILE, data)
    traced = _load(directory / TRACES_FILE).get(signature)
    if traced:
        learn_from_peak(traced["gpu"], stack, float(mib), float(traced["rest_mib"]), state=directory)


def record_trace(signature: str, gpu: str, rest_mib: float, *, state: str | os.PathLike | None = None) -> None:
    """Remember what a trace estimated for a job besides the process baseline (tensors, allocator,
    workspaces), for ``record_observed_peak`` to learn the baseline from the job's measured peak."""
    directory = state_dir(state)
    data = _load(directory / TRACES_FILE)
    data.pop(signature, None)  # re-inserted last: the oldest entries are dropped first
    data[signature] = {"gpu": gpu, "rest_mib": round(float(rest_mib), 1)}
    for old in list(data)[:-_TRACES_KEPT]:
        del data[old]
    _write(directory, TRACES_FILE, data, sort_keys=False)  # insertion order: oldest first


def observed_peak(signature: str, *, state: str | os.PathLike | None = None) -> tuple[float, int] | None:
    """(largest measured peak MiB, number of runs) for a signature, or None if never measured."""
    entry = _load(state_dir(state) / STATE_FILE).get(signature)
    return (float(entry["max_mib"]), int(entry["runs"])) if entry else None
