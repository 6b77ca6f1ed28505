"""From a launch order to what is started: argv, environment, MPS limits, Ray resources. Pure.

The node actor calls ``plan_launch`` once it has checked that the ordered GPUs still fit; the
result is started by the launcher. Keeping this free of processes and Ray makes "what exactly
does a job get" one readable function, testable on its own.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hier_sched.common.checkpointing import CHECKPOINT_DIR_ENV, RESUME_ENV
from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.common.paths import job_path
from hier_sched.common.progress import PROGRESS_FILE_ENV
from hier_sched.common.settling import SETTLED_FILE_ENV
from hier_sched.core.gpu import Placement
from node_actor.launcher import RAY_GPU, LaunchRequest, RunFiles, gpu_resource
from node_actor.mps import limits_by_client_index, mps_limits

__all__ = ["NodeFacts", "PlannedLaunch", "plan_launch"]

_PYTHON_ENVIRONMENTS = ("pip", "uv", "conda")  # runtime_env keys that give the job its own interpreter
_RAY_GPU_UNIT = 1e-4  # Ray keeps resource amounts to 4 decimals


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the plan needs to know of the node it runs on."""

    name: str
    uuids: Sequence[str]  # per GPU index: what CUDA_VISIBLE_DEVICES takes on real GPUs
    gpu_totals_mib: Sequence[float]
    booked_mib: Mapping[int, float]  # MiB already reserved per GPU by runs on this node
    no_estimate_mib: float  # what a job without an estimate is believed to use
    emulated_device_dir: str | None = None  # emulated GPUs: jobs run inside the emulated training process
    mps_client_env: Callable[[float | None, dict[str, str] | None], dict[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class PlannedLaunch:
    request: LaunchRequest
    resources: dict[str, float]  # Ray resources of the job's task (``RAY_GPU``: its num_gpus)
    limit_mib: float | None  # the MPS pinned-memory limit per GPU


def plan_launch(order: LaunchOrder, files: RunFiles, node: NodeFacts) -> PlannedLaunch:
    placement, spec = order.placement, order.spec
    gpus = placement.gpus
    limit = order.launch.memory_limit_mib
    command = _user_command(spec, files if order.payload is not None else None)
    argv = command if node.emulated_device_dir is None else _emulated_argv(order, spec, files, node, command)
    if argv is None:
        raise ValueError("an emulation-only spec (no command) needs emulated GPUs")
    env = {**spec.env, **_device_env(order, gpus, limit, node), **_job_env(order, spec, files)}
    request = LaunchRequest(order.job_id, tuple(argv), files, spec.workdir, env, spec.runtime_env)
    return PlannedLaunch(request, _ray_resources(placement, node), limit)


def _job_env(order: LaunchOrder, spec: LaunchSpec, files: RunFiles) -> dict[str, str]:
    """The checkpoint protocol's, settled memory's and progress reports' variables and, for
    multi-GPU runs, torchrun's rendezvous."""
    env: dict[str, str] = {SETTLED_FILE_ENV: files.settled, PROGRESS_FILE_ENV: files.progress}
    if spec.checkpoint_dir:
        env[CHECKPOINT_DIR_ENV] = str(job_path(spec.checkpoint_dir, spec.workdir))
    if order.launch.resume:  # an earlier run may have left a checkpoint
        env[RESUME_ENV] = "1"
    launch = order.launch
    if len(launch.placements) > 1 or launch.world_size > 1:
        per_node = len(order.placement.gpus)
        env.update(WORLD_SIZE=str(launch.world_size), NODE_RANK=str(order.rank), RANK=str(order.rank * per_node),
                   LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(per_node), NNODES=str(len(launch.placements)),
                   **order.rendezvous)
    return env


def _device_env(order: LaunchOrder, gpus: tuple[int, ...], limit: float | None, node: NodeFacts) -> dict[str, str]:
    visible = [str(i) for i in gpus] if node.emulated_device_dir is not None else [node.uuids[i] for i in gpus]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)}
    if node.mps_client_env is not None:
        smact = order.launch.request.smact
        threads = mps_limits(1.0, 0.0, smact)[0] if smact is not None else None  # depends on SMACT only
        pinned = limits_by_client_index({i: limit for i in gpus}, list(gpus)) if limit is not None else None
        env.update(node.mps_client_env(threads, pinned))
    return env


def _ray_resources(placement: Placement, node: NodeFacts) -> dict[str, float]:
    """Ray's books of the run: per GPU its MiB resource, and ``GPU``: the sum over its GPUs of the
    share of each that it reserves. Both are capped by what is still unbooked there: a run that
    settled holds less than its task asked Ray for (a task's resources cannot shrink), so Ray's
    books may show more than the reservations; capped, the task is never left waiting in Ray.
    (A placement on idle GPUs -- ``exclusive`` -- still reserves only its MiB: others may join.)"""
    resources: dict[str, float] = {}
    share = 0.0
    for i in placement.gpus:
        total = node.gpu_totals_mib[i]
        amount = math.floor(min(placement.reserved_mib, total - node.booked_mib.get(i, 0.0)))
        if amount >= 1:
            resources[gpu_resource(node.name, i)] = float(amount)
            share += amount / total
    gpus = math.floor(share / _RAY_GPU_UNIT) * _RAY_GPU_UNIT  # down: a GPU's shares must never add up past 1
    if gpus > 0:
        resources[RAY_GPU] = round(gpus, 4)
    return resources


def _emulated_argv(order: LaunchOrder, spec: LaunchSpec, files: RunFiles, node: NodeFacts,
                   command: list[str] | None) -> list[str]:
    """On emulated GPUs the job is the emulated training process, which runs the user's command
    (if any) as its child. The MPS memory limit travels in the environment, read by the
    emulated job as by a real MPS client."""
    assert node.emulated_device_dir is not None
    argv = [sys.executable, "-m", "node_actor.emulated_job", "--device-dir", node.emulated_device_dir,
            "--job-id", order.job_id, "--gpus", ",".join(map(str, order.placement.gpus)), "--peak-file", files.peak]
    emu = spec.emulation
    if emu is not None:
        argv += ["--peak-mib", f"{emu.peak_mib}", "--duration-s", f"{emu.duration_s}", "--smact", f"{emu.smact}",
                 "--warmup-s", f"{emu.warmup_s}"]
        argv += ["--smocc", f"{emu.smocc}"] if emu.smocc is not None else []
        argv += ["--drama", f"{emu.drama}"] if emu.drama is not None else []
    else:  # a real command on an emulated GPU: it occupies what the scheduler believes it needs
        occupy = order.launch.request.need_mib or node.no_estimate_mib
        argv += ["--peak-mib", f"{occupy}", "--warmup-s", "0"]
    if spec.checkpoint_dir:
        argv += ["--checkpoint-dir", str(job_path(spec.checkpoint_dir, spec.workdir))]
    if command is not None:
        argv += ["--", *command]
    return argv


def _user_command(spec: LaunchSpec, callable_files: RunFiles | None) -> list[str] | None:
    python = _python(spec)
    if callable_files is not None:
        return [python, "-m", "node_actor.run_callable", callable_files.payload, callable_files.result]
    if spec.command is not None:
        return list(spec.command)
    if spec.entrypoint is not None:
        module, func = spec.entrypoint.split(":")
        return [python, "-c", f"import importlib, sys; sys.exit(importlib.import_module({module!r}).{func}())"]
    return None


def _python(spec: LaunchSpec) -> str:
    """The interpreter of a callable or entrypoint job: this node's, unless the job's Ray
    runtime_env brings its own environment (pip, uv, conda), which Ray activates in the job's
    task -- then ``python`` on that task's PATH."""
    if spec.runtime_env and any(k in spec.runtime_env for k in _PYTHON_ENVIRONMENTS):
        return "python"
    return sys.executable
