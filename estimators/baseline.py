"""The process baseline: what a training process holds on its GPU besides its allocator's segments
(CUDA context, the cuBLAS/cuDNN handles and the kernels loaded for them), as nvidia-smi counts it.

It is a property of a node's software stack (driver, CUDA, cuDNN, torch), not of the GPU type:
with CUDA's lazy module loading the context holds only the kernels a process uses, without it
every kernel of every library (over 1 GB; DATA_SOURCES.md). So it is taken, in this order, from:

1. ``probe``: what a node measured at start-up on its real GPU (``node_actor.baseline_probe``),
   recorded here with ``record_probe`` per GPU type and software stack;
2. ``learned``: the baseline finished jobs imply (measured peak minus what the trace estimated
   for the rest), per GPU type and stack, once ``MIN_LEARNED_JOBS`` jobs have reported;
3. ``configured``: ``HIER_SCHED_PROCESS_BASELINE_MIB`` (one number, or ``TYPE=MiB,...``);
4. ``default``: the GPU type's value in ``hier_sched.core.gpu_types`` (public measurements), or,
   where an estimate places a job on a cluster (``unmeasured="safe"``), the top of the public range
   (``CONTEXT_RANGE_TOP_MIB``): an under-estimate is an OOM waiting to happen, and every node of a
   cluster measures its own (``node_actor.baseline_probe``), so a type without a measurement is one
   whose nodes could not be probed (or are on another host without a shared state directory).

Without a stack, the largest value recorded for the GPU type is used: a job may land on any node
of that type. Two exceptions keep a figure from standing where it does not belong: a configured value
is never overruled without a stack (with one, the stack's own measurement wins and its source says
what it overruled), and what an emulated node measured serves only emulated stacks and placements on
this state directory's cluster, never an estimate at the command line for a real GPU. Records live in ``process_baselines.json`` in the state directory (atomic writes).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from hier_sched.common import paths
from hier_sched.common.private_files import replace_private
from hier_sched.core.gpu_types import gpu_type

from estimators.types import EstimatorError

__all__ = ["Baseline", "process_baseline", "default_baseline", "record_probe", "learn_from_peak", "CONFIG_ENV",
           "BASELINE_FILE", "MIN_LEARNED_JOBS", "CONTEXT_RANGE_TOP_MIB", "UNMEASURED", "recorded_probes"]

CONFIG_ENV = "HIER_SCHED_PROCESS_BASELINE_MIB"
BASELINE_FILE = "process_baselines.json"
MIN_LEARNED_JOBS = 3  # one job's implied baseline carries the trace's error on that job; take a median
_LEARNED_KEPT = 25  # the most recent implied baselines kept per GPU type and stack
UNKNOWN_STACK = "unknown stack"
# The software stack an emulated node reports (``node_actor.baseline_probe.EMULATED_STACK``; the
# estimators do not import the node actor's shell).
EMULATED_STACK = "emulated device"
CONTEXT_RANGE_TOP_MIB = 1500
# What to assume when this cluster measured nothing for a GPU type: the type's published default
# (offline tools, replays of another site's server) or the top of the public range (placements).
UNMEASURED = ("default", "safe")


@dataclass(frozen=True, slots=True)
class Baseline:
    mib: float
    source: str  # e.g. "probe (A100-40GB; driver 550.54.15, CUDA 12.4, ...)", "default for A100-40GB"
    measured: bool  # from this cluster (probe, learned): no allowance for the public range is needed

    def high_mib(self) -> float:
        """What the safe bound counts for it: itself when measured here, else at least the top of
        the public range of CUDA contexts (FIELD_NOTES §2: 300-1,500 MiB)."""
        return self.mib if self.measured else max(CONTEXT_RANGE_TOP_MIB, self.mib)


def _dir(state: str | os.PathLike | None) -> Path:
    return Path(state) if state is not None else paths.state_dir()


def _path(state: str | os.PathLike | None) -> Path:
    return _dir(state) / BASELINE_FILE


def _load(state: str | os.PathLike | None) -> dict:
    path = _path(state)
    if not path.is_file():
        return {"probe": {}, "learned": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EstimatorError(f"process-baseline file {path} is unreadable: {exc}") from None
    return {"probe": data.get("probe", {}), "learned": data.get("learned", {})}


def _save(data: dict, state: str | os.PathLike | None) -> None:
    directory = _dir(state)
    directory.mkdir(parents=True, exist_ok=True)
    replace_private(_path(state), json.dumps(data, indent=1, sort_keys=True))


def _check_mib(mib: object, what: str) -> float:
    if not isinstance(mib, (int, float)) or isinstance(mib, bool) or not math.isfinite(mib) or not 0 < mib < 1e6:
        raise EstimatorError(f"{what} must be a positive number of MiB (got {mib!r})")
    return float(mib)


def record_probe(gpu: str, stack: str, mib: float, *, state: str | os.PathLike | None = None) -> None:
    """Remember a node's measured baseline for its GPU type and software stack (the latest wins)."""
    gpu_type(gpu)
    mib = _check_mib(mib, "probed process baseline")
    data = _load(state)
    data["probe"].setdefault(gpu, {})[stack or UNKNOWN_STACK] = round(mib, 1)
    _save(data, state)


def recorded_probes(state: str | os.PathLike | None = None) -> dict[str, dict[str, float]]:
    """What nodes measured: GPU type -> {software stack: MiB} (``hier-sched doctor`` shows it)."""
    return {gpu: dict(stacks) for gpu, stacks in _load(state)["probe"].items()}


def learn_from_peak(gpu: str, stack: str | None, observed_mib: float, rest_mib: float, *,
                    state: str | os.PathLike | None = None) -> None:
    """A finished job's measured peak (``observed_mib``) minus what its trace estimated besides
    the baseline (``rest_mib``: tensors, allocator, workspaces) is one observation of the baseline."""
    gpu_type(gpu)
    implied = _check_mib(observed_mib, "observed peak") - _check_mib(rest_mib, "traced part")
    if implied <= 0:
        return  # the trace over-estimated this job by more than any baseline: it says nothing about one
    data = _load(state)
    kept = data["learned"].setdefault(gpu, {}).setdefault(stack or UNKNOWN_STACK, [])
    kept.append(round(implied, 1))
    del kept[:-_LEARNED_KEPT]
    _save(data, state)


def _configured(gpu: str) -> float | None:
    text = os.environ.get(CONFIG_ENV, "").strip()
    if not text:
        return None
    if "=" not in text:
        return _check_mib(_number(text), CONFIG_ENV)
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not value:
            raise EstimatorError(f"{CONFIG_ENV}: expected TYPE=MiB items separated by commas (got {item!r})")
        gpu_type(name.strip())  # an unknown type is named, not ignored
        if name.strip() == gpu:
            return _check_mib(_number(value), f"{CONFIG_ENV} for {gpu}")
    return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise EstimatorError(f"{CONFIG_ENV}: {text!r} is not a number of MiB") from None


def _pick(entries: dict[str, float], stack: str | None) -> tuple[float, str, str] | None:
    """(value, stack key, how it was chosen) for ``stack``, or the largest value without one."""
    if stack is not None:
        return (entries[stack], stack, stack) if stack in entries else None
    if not entries:
        return None
    best = max(entries, key=lambda s: entries[s])
    return entries[best], best, best if len(entries) == 1 else f"largest of {len(entries)} stacks: {best}"


def _serving(entries: dict, stack: str | None, placement: bool) -> dict:
    """The records that may stand for ``stack``: an emulated device's only for an emulated stack or
    a placement on this state directory's cluster (whose nodes may be emulated), never for an
    estimate of a real GPU at the command line: an emulated cluster run on this machine does not
    pass its figure off as a real GPU's."""
    if stack is not None:
        return {s: v for s, v in entries.items() if (EMULATED_STACK in s) == (EMULATED_STACK in stack)}
    return entries if placement else {s: v for s, v in entries.items() if EMULATED_STACK not in s}


def process_baseline(gpu: str, *, stack: str | None = None, state: str | os.PathLike | None = None,
                     unmeasured: str = "default") -> Baseline:
    """The baseline to add to a traced job on ``gpu`` (a node's ``stack`` when known); ``unmeasured``
    (one of ``UNMEASURED``) says what counts when nothing was measured or configured."""
    gpu_type(gpu)
    if unmeasured not in UNMEASURED:
        raise EstimatorError(f"unmeasured must be one of {', '.join(UNMEASURED)} (got {unmeasured!r})")
    data = _load(state)
    configured = _configured(gpu)
    # An operator's figure is theirs: it stands unless a node of the job's own stack measured one
    # (and then the source says what it overruled). Without a stack (an estimate at the command
    # line), only an explicit figure or a real measurement counts.
    if configured is not None and stack is None:
        return Baseline(configured, f"configured ({CONFIG_ENV})", False)
    overruled = f"; configured {configured:g} MiB overruled by this stack's measurement" if configured else ""
    probed = _pick(_serving(data["probe"].get(gpu, {}), stack, unmeasured == "safe"), stack)
    if probed:
        return Baseline(probed[0], f"probe ({gpu}; {probed[2]}{overruled})", True)
    observations = _serving(data["learned"].get(gpu, {}), stack, unmeasured == "safe")
    learned = {s: statistics.median(v) for s, v in observations.items() if len(v) >= MIN_LEARNED_JOBS}
    picked = _pick(learned, stack)
    if picked:
        jobs = len(observations[picked[1]])
        return Baseline(picked[0], f"learned from {jobs} finished jobs ({gpu}; {picked[2]}{overruled})", True)
    if unmeasured == "safe" and configured is None:
        return Baseline(float(CONTEXT_RANGE_TOP_MIB), f"not measured on any {gpu} node: {CONTEXT_RANGE_TOP_MIB} MiB "
                        "assumed, the top of the public range", False)
    return default_baseline(gpu)


def default_baseline(gpu: str) -> Baseline:
    """Sources 3 and 4 only (configured, else the GPU type's default): for estimates that stand
    for no node of this cluster, such as a replay of the thesis' server."""
    configured = _configured(gpu)
    if configured is not None:
        return Baseline(configured, f"configured ({CONFIG_ENV})", False)
    return Baseline(float(gpu_type(gpu).cuda_context_mib), f"default for {gpu} (public measurements, DATA_SOURCES.md)",
                    False)
