"""``hier-sched doctor``: what the scheduler sees on the machine it runs on, and what to fix.

Gathers the facts (NVML, ``dcgmi``, ``nvidia-cuda-mps-control``, the scheduler and this host's Ray
nodes, the process baselines the nodes measured) and hands them to the pure checks of
``node_actor.doctor_checks``. Exit 1 when any check fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from typing import Any

import click

from node_actor.doctor_checks import (FAIL, WARN, NvmlFacts, RayNodeFacts, ToolFacts, check_baselines, check_dcgm,
                                      check_gpu_types, check_mps, check_nvml, check_ray_nodes, check_scheduler,
                                      exit_code, report)

__all__ = ["doctor"]

_TOOL_TIMEOUT_S = 10.0
_STATUS_COLOURS = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "N/A": "bright_black"}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_facts() -> NvmlFacts:
    from node_actor.backends.device_names import gpu_type_for

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, ImportError: no NVML here
        return NvmlFacts(error=f"{type(exc).__name__}: {exc}")
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            devices.append((_text(pynvml.nvmlDeviceGetName(handle)),
                            pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20))
        from hier_sched.core.gpu_types import GPU_TYPES

        types = tuple(t if t in GPU_TYPES else "" for t in (gpu_type_for(n, m) for n, m in devices))
        return NvmlFacts("", _text(pynvml.nvmlSystemGetDriverVersion()), _text(pynvml.nvmlSystemGetNVMLVersion()),
                         tuple(devices), types)
    except Exception as exc:  # noqa: BLE001 - a driver that answers init but not queries
        return NvmlFacts(error=f"{type(exc).__name__}: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass


def _run(argv: list[str], stdin: str | None = None) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def dcgm_facts() -> ToolFacts:
    path = shutil.which("dcgmi")
    if path is None:
        return ToolFacts(None)
    _, version = _run([path, "--version"])
    answered, output = _run([path, "dmon", "-e", "1002,1003,1005", "-c", "1"])
    return ToolFacts(path, version.splitlines()[0] if version else "", answered, "" if answered else output[-200:])


def mps_facts() -> ToolFacts:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        return ToolFacts(None)
    answered, output = _run([path], stdin="get_server_list\n")
    return ToolFacts(path, "", answered, "" if answered else output[-200:])


def _scheduler_facts() -> tuple[dict[str, Any] | None, float | None, str]:
    """The scheduler's ``cluster()`` answer, how long it took, or why there is none."""
    from hier_sched.front.connection import SchedulerUnavailable, connect

    try:
        scheduler = connect(command="hier-sched doctor")
        start = time.perf_counter()
        cluster = scheduler.call_whole("cluster")
        return cluster, time.perf_counter() - start, ""
    except SchedulerUnavailable as exc:
        return None, None, str(exc)


def _ray_nodes_here() -> list[RayNodeFacts]:
    import ray

    here = ray.util.get_node_ip_address()
    return [RayNodeFacts(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})", bool(n["Alive"]), n.get("Resources", {}))
            for n in ray.nodes() if n["NodeManagerAddress"] == here]


def gather() -> list:
    from estimators.baseline import CONTEXT_RANGE_TOP_MIB, recorded_probes
    from hier_sched.common import paths

    nvml = nvml_facts()
    gpu_node = bool(nvml.devices)
    cluster, answer_s, error = _scheduler_facts()
    emulated = [(n["node"], n["gpu_type"]) for n in (cluster or {}).get("nodes", []) if n.get("backend") == "emulated"]
    checks = [check_scheduler(answer_s, error),
              check_ray_nodes(_ray_nodes_here() if cluster is not None else [],
                              "not connected (see the scheduler check)" if error else "")]
    checks.append(check_gpu_types(nvml, [] if gpu_node else emulated))
    checks += [check_nvml(nvml, gpu_node), check_dcgm(dcgm_facts() if gpu_node else ToolFacts(None), gpu_node),
               check_mps(mps_facts() if gpu_node else ToolFacts(None), gpu_node)]
    state = cluster["state_dir"] if cluster else paths.state_dir()
    types = sorted(set(t for t in nvml.types if t) if gpu_node else {t for _, t in emulated})
    checks.append(check_baselines(types, recorded_probes(state), CONTEXT_RANGE_TOP_MIB))
    return checks


@click.command()
@click.option("--json", "as_json", is_flag=True, help="[{name, status, detail, fix}, ...]")
def doctor(as_json: bool) -> None:
    """What the scheduler sees on this machine: GPU types, NVML/DCGM/MPS, baselines, Ray. Exit 1 on a FAIL."""
    checks = gather()
    if as_json:
        click.echo(json.dumps(report(checks), indent=1))
    else:
        for c in checks:
            click.echo(f"{click.style(f'{c.status:4}', fg=_STATUS_COLOURS[c.status])}  {c.name}: {c.detail}")
            if c.fix and c.status in (FAIL, WARN):
                click.echo(f"      fix: {c.fix}")
    sys.exit(exit_code(checks))
