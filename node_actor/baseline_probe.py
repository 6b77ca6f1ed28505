"""Measure this node's process baseline once, at start-up, on its real GPU.

The process baseline is what a training process holds on its GPU besides its caching allocator's
segments: the CUDA context and the cuBLAS/cuDNN handles with the kernels they load. It depends on
the node's driver, CUDA, cuDNN and torch versions (``estimators.baseline``), so the node measures
it: a short-lived child process initialises CUDA the way training does (a convolution forward and
backward through cuDNN, a matrix product through cuBLAS, an Adam step), reports what its allocator
reserved, and waits while this process reads the child's memory through NVML's per-process list
(what nvidia-smi shows). Baseline = NVML's figure for the child minus the allocator's reserved bytes.

Without a GPU (no NVML library, no CUDA device, a CPU build of torch) or where NVML cannot see the
child's pid (some container set-ups), ``probe_process_baseline`` returns None with the reason
logged: the estimators then fall back to learned, configured or default values.

Run it before starting the MPS daemon: under MPS, NVML lists the MPS server, not the client.

Emulated nodes measure theirs too (``probe_emulated``): a probe process attaches to the emulated
device and is read from its process list, as an emulated job would be.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from node_actor.backends.device_names import gpu_type_for
from node_actor.emulated_device import EmulatedNodeDevices

__all__ = ["ProbeResult", "probe_process_baseline", "probe_emulated", "baseline_from", "PROBE_SCRIPT", "EMULATED_STACK"]

log = logging.getLogger(__name__)
_MIB = 1024 * 1024
EMULATED_STACK = "emulated device"

# The child: initialise what training initialises, report, and hold its memory until stdin closes.
PROBE_SCRIPT = r"""
import json, os, sys
import torch
if not torch.cuda.is_available():
    print(json.dumps({"error": f"no CUDA device visible to torch {torch.__version__}"}), flush=True)
    sys.exit(0)
device = torch.device("cuda", int(sys.argv[1]))
torch.cuda.set_device(device)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(8 * 30 * 30, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters())
x = torch.randn(4, 3, 32, 32, device=device)
loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (4,), device=device))
loss.backward()
optimizer.step()
torch.cuda.synchronize(device)
props = torch.cuda.get_device_properties(device)
print(json.dumps({"pid": os.getpid(), "reserved_bytes": torch.cuda.memory_reserved(device),
                  "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version(), "device_name": props.name,
                  "device_total_bytes": props.total_memory}), flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    gpu_type: str  # a key of hier_sched.core.gpu_types.GPU_TYPES (or the driver's name when unknown)
    stack: str  # e.g. "driver 550.54.15, CUDA 12.4, cuDNN 90100, torch 2.4.0+cu124"
    baseline_mib: float  # what the estimators add per process (``estimators.baseline.record_probe``)
    process_mib: float  # NVML's figure for the probe process
    reserved_mib: float  # what its caching allocator had reserved

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def baseline_from(report: dict[str, Any], processes: Iterable[tuple[int, int | None]],
                  driver_version: str) -> ProbeResult | None:
    """The probe's result from the child's report and NVML's ``(pid, used bytes)`` list of the
    device; None (reason logged) when the child reported an error or NVML does not list it."""
    if "error" in report:
        log.info("process-baseline probe: %s", report["error"])
        return None
    try:
        pid, reserved = int(report["pid"]), int(report["reserved_bytes"])
        name, total = str(report["device_name"]), int(report["device_total_bytes"])
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("process-baseline probe: unreadable report %r (%s)", report, exc)
        return None
    used = next((u for p, u in processes if p == pid), None)
    if used is None:
        log.warning("process-baseline probe: NVML lists no memory for the probe process (pid %d); a container "
                    "without the host's pid namespace, or MPS, hides it", pid)
        return None
    baseline = (used - reserved) / _MIB
    if baseline <= 0:
        log.warning("process-baseline probe: NVML's %d bytes are not above the allocator's %d", used, reserved)
        return None
    stack = f"driver {driver_version}, CUDA {report.get('cuda')}, cuDNN {report.get('cudnn')}, torch {report.get('torch')}"
    return ProbeResult(gpu_type_for(name, total / _MIB), stack, round(baseline, 1), round(used / _MIB, 1),
                       round(reserved / _MIB, 1))


def probe_emulated(devices: EmulatedNodeDevices) -> ProbeResult | None:
    """The process baseline of an emulated node: what a probe process holds on its GPU 0 before it
    allocates anything (its emulated CUDA context). None when GPU 0 cannot take a process now."""
    held = devices.process_baseline_mib(0)
    if held is None:
        return None
    return ProbeResult(devices.gpu_type, EMULATED_STACK, round(held, 1), round(held, 1), 0.0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_processes(nvml: ModuleType | Any) -> list[tuple[int, int | None]]:
    """(pid, used bytes) of every compute process NVML lists, on every device (the pid decides)."""
    out: list[tuple[int, int | None]] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        out += [(p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    return out


def _read_line(stream: Any, timeout_s: float) -> str | None:
    if not select.select([stream], [], [], timeout_s)[0]:
        return None
    return stream.readline()


def probe_process_baseline(device_index: int = 0, *, timeout_s: float = 120.0, nvml: ModuleType | Any | None = None,
                           script: str = PROBE_SCRIPT) -> ProbeResult | None:
    """Measure the process baseline on CUDA device ``device_index`` (as this node's processes see
    it, i.e. after ``CUDA_VISIBLE_DEVICES``); None when it cannot be measured here. ``nvml`` and
    ``script`` replace the NVML module and the child's program (tests without a GPU)."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends: no GPU here
        log.info("process-baseline probe: NVML unavailable (%s)", exc)
        return None
    try:
        child = subprocess.Popen([sys.executable, "-c", script, str(device_index)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            line = _read_line(child.stdout, timeout_s)
            if not line:
                log.warning("process-baseline probe: no report within %.0f s: %s", timeout_s,
                            child.stderr.read()[-500:] if child.poll() is not None else "still running")
                return None
            report = json.loads(line)
            return baseline_from(report, _nvml_processes(nvml) if "error" not in report else [],
                                 _text(nvml.nvmlSystemGetDriverVersion()))
        except (OSError, ValueError) as exc:
            log.warning("process-baseline probe failed: %s", exc)
            return None
        finally:
            child.stdin.close()  # the child exits once it sees the end of its input
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that misbehaved is best effort
            pass
