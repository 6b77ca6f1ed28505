"""``hier-sched doctor``'s checks: what the scheduler sees on a node, each with a verdict and a fix.

Pure functions over facts gathered elsewhere (``hier_sched.front.doctor`` reads NVML, DCGM, MPS,
Ray and the state directory), so each verdict is tested with stand-in facts. A verdict is PASS,
WARN (works, with less: e.g. no DCGM, so SMACT falls back to NVML utilisation), FAIL (the scheduler
would place jobs on wrong figures or not at all) or N/A (does not apply: NVML on an emulated node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hier_sched.core.gpu_types import GPU_TYPES

__all__ = ["Check", "PASS", "WARN", "FAIL", "NA", "NvmlFacts", "ToolFacts", "RayNodeFacts", "check_gpu_types",
           "check_nvml", "check_dcgm", "check_mps", "check_baselines", "check_ray_nodes", "check_scheduler",
           "exit_code", "report"]

PASS, WARN, FAIL, NA = "PASS", "WARN", "FAIL", "N/A"
# ``launcher.gpu_resource``: one per GPU, named per scheduler node
_GPU_MEMORY_RESOURCE = re.compile(r"^hs_.+_gpu\d+_mem_mib$")
SCHEDULER_ANSWER_S = 1.0  # the queue answers status calls well within this on a healthy cluster


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # PASS / WARN / FAIL / N/A
    detail: str
    fix: str = ""  # what to do about a WARN or FAIL

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NvmlFacts:
    error: str = ""  # why NVML could not be used ("" when it could)
    driver: str = ""
    nvml: str = ""
    devices: tuple[tuple[str, float], ...] = ()  # (NVML name, memory total MiB) per device
    types: tuple[str, ...] = ()  # our GPU type per device ("" when the name is not known)


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """A command-line tool: where it is, what ``--version`` said, and whether it answered a query."""

    path: str | None
    version: str = ""
    answered: bool | None = None  # None: not asked
    error: str = ""


@dataclass(frozen=True, slots=True)
class RayNodeFacts:
    address: str
    alive: bool
    resources: Mapping[str, float]


def check_gpu_types(nvml: NvmlFacts, emulated: Sequence[tuple[str, str]]) -> Check:
    """Real GPUs: every NVML name maps to a known type, one type per node. Emulated nodes
    (``(node, type)`` from the scheduler): their configured types."""
    if nvml.devices:
        unknown = sorted({name for (name, _), t in zip(nvml.devices, nvml.types) if not t})
        if unknown:
            return Check("GPU types", FAIL, f"unknown GPU name(s): {', '.join(unknown)}",
                         "add the GPU to hier_sched/core/gpu_types.py (GPU_TYPES) and node_actor/backends/device_names.py")
        kinds = sorted(set(nvml.types))
        if len(kinds) > 1:
            return Check("GPU types", FAIL, f"several GPU types on one node: {', '.join(kinds)}",
                         "one type per node is assumed: hide the others with CUDA_VISIBLE_DEVICES")
        return Check("GPU types", PASS, f"{len(nvml.devices)} x {kinds[0]} ({nvml.devices[0][0]})")
    if emulated:
        listed = ", ".join(f"{node}: {t}" for node, t in emulated)
        unknown = sorted({t for _, t in emulated if t not in GPU_TYPES})
        if unknown:
            return Check("GPU types", FAIL, f"emulated type(s) not in GPU_TYPES: {', '.join(unknown)}",
                         "restart with `hier-sched up --gpu-type` naming a known type")
        return Check("GPU types", PASS, f"emulated: {listed}")
    return Check("GPU types", FAIL, "no GPU seen: NVML lists none and no emulated node runs",
                 "on a GPU node, install the NVIDIA driver; elsewhere start `hier-sched up --emulated`")


def check_nvml(nvml: NvmlFacts, gpu_node: bool) -> Check:
    if not gpu_node:
        return Check("NVML", NA, f"no GPU here{f' (NVML: {nvml.error})' if nvml.error else ''}: emulated nodes only")
    if nvml.error:
        return Check("NVML", FAIL, nvml.error, "install the NVIDIA driver and `pip install nvidia-ml-py`")
    return Check("NVML", PASS, f"driver {nvml.driver}, NVML {nvml.nvml}")


def check_dcgm(dcgm: ToolFacts, gpu_node: bool) -> Check:
    if not gpu_node:
        return Check("DCGM", NA, "no GPU here: emulated nodes take SMACT from the device model")
    if dcgm.path is None:
        return Check("DCGM", WARN, "dcgmi not on PATH: SMACT falls back to NVML utilisation (a coarser signal)",
                     "install datacenter-gpu-manager and start nv-hostengine")
    if dcgm.answered is False:
        return Check("DCGM", WARN, f"dcgmi {dcgm.version} did not answer a SMACT query: {dcgm.error}",
                     "start nv-hostengine (`sudo nv-hostengine`) and check `dcgmi dmon -e 1002 -c 1`")
    return Check("DCGM", PASS, f"dcgmi {dcgm.version} at {dcgm.path}, SMACT readable")


def check_mps(mps: ToolFacts, gpu_node: bool) -> Check:
    if not gpu_node:
        return Check("MPS", NA, "no GPU here: emulated nodes emulate MPS limits")
    if mps.path is None:
        return Check("MPS", WARN, "nvidia-cuda-mps-control not on PATH: collocated jobs share a GPU without MPS limits",
                     "install the CUDA toolkit's MPS control daemon, or run with --sharing streams")
    if mps.answered is False:
        return Check("MPS", WARN, f"the MPS control daemon does not answer: {mps.error}",
                     "start it with `hier-sched up --mps-daemon` (compute mode EXCLUSIVE_PROCESS)")
    return Check("MPS", PASS, f"nvidia-cuda-mps-control at {mps.path}" + (", daemon answering" if mps.answered else ""))


def check_baselines(types: Sequence[str], recorded: Mapping[str, Mapping[str, float]], safe_mib: float) -> Check:
    """Has every GPU type here a measured process baseline? ``recorded``: type -> {stack: MiB}
    (the probes in the state directory)."""
    if not types:
        return Check("process baseline", NA, "no GPU type to measure")
    missing = [t for t in types if not recorded.get(t)]
    measured = "; ".join(f"{t}: " + ", ".join(f"{mib:.0f} MiB ({stack})" for stack, mib in sorted(recorded[t].items()))
                         for t in types if recorded.get(t))
    if missing:
        return Check("process baseline", FAIL,
                     f"not measured for {', '.join(missing)}: jobs there get the {safe_mib:.0f} MiB safe value"
                     + (f" (measured: {measured})" if measured else ""),
                     "check that NVML lists per-process memory (a container needs the host's pid namespace) and "
                     "restart the node; `HIER_SCHED_PROCESS_BASELINE_MIB` sets a figure by hand")
    return Check("process baseline", PASS, measured)


def check_ray_nodes(nodes: Sequence[RayNodeFacts], error: str = "") -> Check:
    """This host's Ray nodes: alive, and each GPU's memory declared as a resource (``up`` declares
    them; a cluster the scheduler was attached to with ``up --address`` has none, which works
    without ``ray status`` showing the GPUs' memory: WARN)."""
    if error:
        return Check("Ray", FAIL, error, "start the cluster with `hier-sched up`, or set RAY_ADDRESS")
    if not nodes:
        return Check("Ray", FAIL, "no Ray node on this host", "join it with `ray start --address HEAD:PORT`")
    problems, undeclared, seen = [], [], []
    for node in nodes:
        res = node.resources
        gpus = int(res.get("GPU", 0))
        memory = [k for k in res if _GPU_MEMORY_RESOURCE.match(k)]
        seen.append(f"{node.address}: CPU {res.get('CPU', 0):g}, GPU {gpus}, {len(memory)} GPU memory resources")
        if not node.alive:
            problems.append(f"{node.address} is dead")
        elif gpus and not memory:
            undeclared.append(node.address)
        elif gpus and len(memory) != gpus:
            problems.append(f"{node.address} declares {len(memory)} GPU memory resources for {gpus} GPUs")
    if problems:
        return Check("Ray", FAIL, "; ".join(problems), "restart the node with `hier-sched up` (it declares them)")
    if undeclared:
        return Check("Ray", WARN, f"{', '.join(undeclared)}: no GPU memory resources ({'; '.join(seen)})",
                     "`hier-sched up` on a node declares them, so `ray status` shows each GPU's memory")
    return Check("Ray", PASS, "; ".join(seen))


def check_scheduler(answer_s: float | None, error: str = "") -> Check:
    if error or answer_s is None:
        return Check("scheduler", FAIL, error or "no answer", "start it with `hier-sched up`")
    if answer_s > SCHEDULER_ANSWER_S:
        return Check("scheduler", WARN, f"the global queue answered in {answer_s:.2f} s (> {SCHEDULER_ANSWER_S:g} s)",
                     "the head is overloaded: see `hier-sched top`")
    return Check("scheduler", PASS, f"the global queue answered in {1000 * answer_s:.0f} ms")


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def report(checks: Sequence[Check]) -> list[dict[str, Any]]:
    """The checks as plain dicts (``doctor --json``)."""
    return [c.as_dict() for c in checks]
