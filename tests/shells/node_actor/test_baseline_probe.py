"""The node's process-baseline probe, on the code paths that need no GPU: the arithmetic on the
child's report and NVML's process list, a whole probe against a stand-in NVML and child, and a
clean None where there is no GPU (this machine)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from node_actor.baseline_probe import baseline_from, probe_process_baseline

MIB = 1024 * 1024
REPORT = {"pid": 4242, "reserved_bytes": 22 * MIB, "torch": "2.4.0+cu124", "cuda": "12.4", "cudnn": 90100,
          "device_name": "NVIDIA A100-SXM4-40GB", "device_total_bytes": 40536 * MIB}


def test_the_baseline_is_nvmls_figure_for_the_probe_minus_what_its_allocator_reserved():
    result = baseline_from(REPORT, [(17, 9000 * MIB), (4242, 1436 * MIB)], "550.54.15")
    assert result is not None
    assert result.baseline_mib == 1414 and result.process_mib == 1436 and result.reserved_mib == 22
    assert result.gpu_type == "A100-40GB"
    assert result.stack == "driver 550.54.15, CUDA 12.4, cuDNN 90100, torch 2.4.0+cu124"


def test_no_usable_measurement_gives_none():
    assert baseline_from({"error": "no CUDA device"}, [], "550") is None
    assert baseline_from(REPORT, [(17, 9000 * MIB)], "550") is None  # NVML does not see the probe's pid
    assert baseline_from(REPORT, [(4242, None)], "550") is None  # no per-process figure (e.g. MPS)
    assert baseline_from(REPORT, [(4242, 10 * MIB)], "550") is None  # not above the allocator's segments
    assert baseline_from({"pid": "x"}, [], "550") is None


def test_without_a_gpu_the_probe_returns_none():
    assert probe_process_baseline(timeout_s=60) is None


class FakeNvml:
    """Stands in for pynvml: one device that lists the process whose pid is in ``pid_file``."""

    def __init__(self, pid_file, used_bytes):
        self.pid_file, self.used_bytes, self.shut = pid_file, used_bytes, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=int(self.pid_file.read_text()), usedGpuMemory=self.used_bytes)]

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"


def test_a_whole_probe_reads_the_child_it_started(tmp_path):
    """The child reports its pid and holds on until its input closes; NVML is read meanwhile."""
    nvml = FakeNvml(tmp_path / "pid", 1500 * MIB)
    script = ("import json, os, sys\n"
              f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
              f"report = json.loads({json.dumps(json.dumps(REPORT))}); report['pid'] = os.getpid()\n"
              "print(json.dumps(report), flush=True)\n"
              "sys.stdin.read()\n")
    result = probe_process_baseline(0, nvml=nvml, script=script, timeout_s=60)
    assert result is not None and result.baseline_mib == 1500 - 22 and nvml.shut


def test_an_emulated_node_measures_its_baseline_through_its_device(tmp_path):
    from estimators.baseline import process_baseline, record_probe
    from hier_sched.core.gpu_types import gpu_type
    from node_actor.baseline_probe import EMULATED_STACK, probe_emulated
    from node_actor.emulated_device import EmulatedNodeDevices

    for name in ("A100-40GB", "H100-80GB"):
        devices = EmulatedNodeDevices(tmp_path / name, name, count=2)
        result = probe_emulated(devices)
        assert result is not None
        assert (result.gpu_type, result.stack) == (name, EMULATED_STACK)
        assert result.baseline_mib == gpu_type(name).cuda_context_mib
        assert all(s.memory_used_mib == 0 and not s.processes for s in devices.samples())  # the probe left
        record_probe(result.gpu_type, result.stack, result.baseline_mib, state=tmp_path)
        measured = process_baseline(name, state=tmp_path, unmeasured="safe")
        assert measured.measured and measured.mib == gpu_type(name).cuda_context_mib


def test_an_emulated_gpu_that_cannot_take_a_process_gives_no_measurement(tmp_path):
    from hier_sched.device.gpu_model import JobActivity
    from node_actor.baseline_probe import probe_emulated
    from node_actor.emulated_device import EmulatedNodeDevices

    devices = EmulatedNodeDevices(tmp_path, "A100-40GB", count=1, sharing="none")
    with devices.locked() as state:
        state.gpu(0).attach("job-1", JobActivity(0.5), pid=1)
    assert probe_emulated(devices) is None
