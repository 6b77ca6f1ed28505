"""The emulated device file shared by real processes (node_actor.emulated_device)."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from hier_sched.core.gpu_types import gpu_type
from hier_sched.device.gpu_model import GpuOutOfMemory, JobActivity
from node_actor.backends import select_backend
from node_actor.emulated_device import EmulatedNodeDevices

A100 = gpu_type("A100-40GB")


def _allocate_and_hold(directory: str, job: str, peak_mib: float, hold_s: float, results) -> None:
    devices = EmulatedNodeDevices.open(directory)
    try:
        with devices.locked() as state:
            state.gpu(0).attach(job, JobActivity(0.3))
            state.gpu(0).allocate_peak(job, peak_mib)
    except GpuOutOfMemory:
        devices.detach_everywhere(job)
        results.put((job, "oom"))
        return
    results.put((job, "ok"))
    time.sleep(hold_s)  # keep the memory while the others try


def test_concurrent_processes_never_exceed_capacity(tmp_path):
    EmulatedNodeDevices(tmp_path, "A100-40GB", 1, time_scale=0.01)
    peak = 9000.0  # four fit in 40536 MiB, a fifth does not
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_allocate_and_hold, args=(str(tmp_path), f"job{i}", peak, 1.5, results))
             for i in range(7)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=20) for _ in procs)
    sample = EmulatedNodeDevices.open(tmp_path).samples()[0]
    for p in procs:
        p.join(20)
    assert sorted(outcomes.values()).count("ok") == int(A100.memory_mib // peak)
    assert sample.memory_used_mib <= sample.memory_total_mib
    assert sample.memory_used_mib == pytest.approx(4 * peak, abs=4)


def test_energy_integrates_idle_power_over_emulated_time(tmp_path):
    devices = EmulatedNodeDevices(tmp_path, "A100-40GB", 2, time_scale=0.01)
    t0 = time.time()
    before = devices.samples()
    t1 = time.time()
    time.sleep(0.3)
    t2 = time.time()
    after = devices.samples()
    t3 = time.time()
    # the two readings were taken somewhere inside [t0, t1] and [t2, t3]
    shortest, longest = (t2 - t1) / 0.01, (t3 - t0) / 0.01
    for b, a in zip(before, after):
        gained = a.energy_j - b.energy_j
        print(f"GPU {a.index}: {gained:.0f} J over {shortest:.1f}-{longest:.1f} emulated s (idle {A100.idle_power_w} W)")
        assert A100.idle_power_w * shortest * 0.999 <= gained <= A100.idle_power_w * longest * 1.001


def test_reopening_with_another_shape_is_refused(tmp_path):
    EmulatedNodeDevices(tmp_path, "A100-40GB", 2)
    with pytest.raises(ValueError, match="2 x A100-40GB"):
        EmulatedNodeDevices(tmp_path, "A100-40GB", 4)


def test_emulated_backend_is_registered_and_reads_the_file(tmp_path):
    backend = select_backend("emulated", directory=tmp_path, gpu_type="A100-40GB", count=3, time_scale=0.01)
    devices = EmulatedNodeDevices.open(tmp_path)
    with devices.locked() as state:
        state.gpu(1).attach("x", JobActivity(0.6), pid=4242)
        state.gpu(1).allocate(("x"), 3000)
    samples = backend.sample()
    assert [s.index for s in samples] == [0, 1, 2]
    assert samples[1].memory_used_mib == pytest.approx(3000 + A100.cuda_context_mib, abs=2)
    assert samples[1].smact > 0 and samples[0].smact == 0
    assert dict(samples[1].processes)[4242] == pytest.approx(samples[1].memory_used_mib)
    assert backend.gpu_count() == 3 and len(set(backend.uuids())) == 3
