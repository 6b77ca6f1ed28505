"""Unit tests of the emulated GPU: memory ledger, OOM semantics, physics shape, MIG, persistence."""

from __future__ import annotations

import pickle

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hier_sched.core.gpu import SharingMode
from hier_sched.device.gpu_memory import MemoryLedger
from hier_sched.device.gpu_model import (
    EmulatedGpu,
    GpuBusy,
    GpuOutOfMemory,
    JobActivity,
    mig_slices,
)
from hier_sched.core.gpu_types import gpu_type

A100 = gpu_type("A100-40GB")
CONTEXT = A100.cuda_context_mib
LIGHT = JobActivity(0.2, 0.1, 0.05)
HEAVY = JobActivity(0.82, 0.4, 0.5)


def gpu_with(*jobs: tuple[str, float], sharing=SharingMode.MPS, activity=LIGHT) -> EmulatedGpu:
    """A100 with each job attached and grown to the given total MiB (context included)."""
    gpu = EmulatedGpu("A100-40GB", sharing=sharing)
    for job, total_mib in jobs:
        gpu.attach(job, activity)
        gpu.allocate(job, total_mib - CONTEXT)
    return gpu


# ----------------------------------------------------------------------------- ledger
def test_attach_creates_one_cuda_context_per_process():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("a", LIGHT)
    gpu.attach("b", LIGHT)
    assert gpu.job_memory_mib("a") == CONTEXT
    assert gpu.memory_used_mib == 2 * CONTEXT
    assert gpu.memory_free_mib == A100.memory_mib - 2 * CONTEXT
    assert gpu.residents == ("a", "b")


def test_allocations_are_rounded_to_whole_pages():
    gpu = gpu_with(("a", CONTEXT + 2))
    gpu.allocate("a", 0.5)
    assert gpu.job_memory_mib("a") == CONTEXT + 2 + A100.small_segment_mib


def test_detach_frees_every_segment_and_leaves_a_hole_between_neighbours():
    gpu = gpu_with(("a", 10_000), ("b", 10_000), ("c", 10_000))
    assert gpu.detach("b") == 10_000
    assert gpu.residents == ("a", "c")
    assert gpu.memory_used_mib == 20_000
    # the hole b left sits between a and c: free memory is now in two pieces
    tail = A100.memory_mib - 30_000
    assert gpu.largest_free_block_mib == max(10_000, tail)
    assert gpu.memory_free_mib == 10_000 + tail


def test_detach_of_an_unknown_job_is_a_no_op():
    gpu = gpu_with(("a", 1_000))
    assert gpu.detach("ghost") == 0.0
    assert gpu.memory_used_mib == 1_000


def test_holes_merge_back_into_one_block_when_everyone_leaves():
    gpu = gpu_with(("a", 5_000), ("b", 7_000), ("c", 9_000))
    for job in ("b", "a", "c"):
        gpu.detach(job)
    assert gpu.largest_free_block_mib == gpu.memory_total_mib == A100.memory_mib


# ----------------------------------------------------------------------------- OOM semantics
def test_fragmentation_oom_when_free_memory_is_in_pieces():
    # a [0, 15510) | b [15510, 21020) | c up to 5000 MiB before the end; then a leaves
    gpu = gpu_with(("a", 15_510), ("b", 5_510), ("c", A100.memory_mib - 21_020 - 5_000))
    gpu.detach("a")
    gpu.attach("d", LIGHT)
    assert gpu.memory_free_mib >= 16_000 > gpu.largest_free_block_mib
    before = {job: gpu.job_memory_mib(job) for job in ("b", "c")}
    with pytest.raises(GpuOutOfMemory) as failure:
        gpu.allocate("d", 16_000)
    oom = failure.value
    assert oom.job_id == "d"
    assert oom.requested_mib == 16_000
    assert oom.free_mib >= oom.requested_mib > oom.largest_free_mib
    assert oom.allocated_mib == CONTEXT  # d holds only its context
    assert "CUDA out of memory" in str(oom)
    # the allocating process fails; the neighbours keep every MiB
    assert {job: gpu.job_memory_mib(job) for job in ("b", "c")} == before
    assert gpu.job_memory_mib("d") == CONTEXT


def test_the_later_job_fails_and_the_earlier_keeps_running():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("early", HEAVY)
    gpu.allocate_peak("early", 30_000)
    gpu.attach("late", HEAVY)
    with pytest.raises(GpuOutOfMemory) as failure:
        gpu.allocate_peak("late", 20_000)
    assert failure.value.job_id == "late"
    assert gpu.job_memory_mib("early") == 30_000
    held = failure.value.allocated_mib
    assert CONTEXT <= held == gpu.job_memory_mib("late") < 20_000
    gpu.detach("late")
    assert gpu.memory_used_mib == 30_000


def test_attach_fails_when_even_the_context_does_not_fit():
    gpu = gpu_with(("big", A100.memory_mib - CONTEXT + 2))
    with pytest.raises(GpuOutOfMemory) as failure:
        gpu.attach("newcomer", LIGHT)
    assert failure.value.allocated_mib == 0
    assert gpu.residents == ("big",)


def test_mps_memory_limit_makes_the_culprit_fail_itself():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("neighbour", LIGHT)
    gpu.allocate("neighbour", 5_000)
    gpu.attach("culprit", LIGHT, mem_limit_mib=4_000)
    gpu.allocate("culprit", 3_000)
    with pytest.raises(GpuOutOfMemory) as failure:
        gpu.allocate("culprit", 1_000)  # the device has >25 GB free; the limit refuses
    assert failure.value.limit_mib == 4_000
    assert failure.value.job_id == "culprit"
    assert gpu.job_memory_mib("neighbour") == CONTEXT + 5_000
    assert gpu.job_memory_mib("culprit") == CONTEXT + 3_000


def test_a_limit_below_the_context_refuses_the_process_at_start():
    gpu = EmulatedGpu("A100-40GB")
    with pytest.raises(GpuOutOfMemory):
        gpu.attach("tiny", LIGHT, mem_limit_mib=CONTEXT - 10)
    assert gpu.residents == ()


def test_allocate_peak_reaches_the_peak_in_deterministic_segments():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("job", LIGHT)
    gpu.allocate_peak("job", 8_294, chunks=4)
    assert gpu.job_memory_mib("job") == 8_294
    state = gpu.to_state()
    sizes = [size for owner, _, size in state["segments"] if owner == "job"]
    assert len(sizes) == 1 + 1 + 4  # context, one large block, four pieces
    assert sizes[1] > sizes[2] == sizes[3] == sizes[4]
    gpu.allocate_peak("job", 8_294)  # already there: nothing more
    assert gpu.job_memory_mib("job") == 8_294


def test_out_of_memory_survives_pickling_with_its_fields():
    oom = GpuOutOfMemory("j", 100.0, 50.0, 20.0, 510.0, 4000.0)
    copy = pickle.loads(pickle.dumps(oom))
    assert (copy.job_id, copy.requested_mib, copy.free_mib, copy.largest_free_mib, copy.allocated_mib,
            copy.limit_mib) == ("j", 100.0, 50.0, 20.0, 510.0, 4000.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda g: g.allocate("ghost", 10), "not attached"),
        (lambda g: g.allocate("a", -5), "positive"),
        (lambda g: g.allocate("a", float("nan")), "positive"),
        (lambda g: g.attach("a", LIGHT), "already attached"),
        (lambda g: g.allocate_peak("a", 1_000, chunks=0), "chunks"),
        (lambda g: g.slowdown("ghost"), "not attached"),
    ],
)
def test_bad_calls_name_the_problem(call, message):
    gpu = gpu_with(("a", 1_000))
    with pytest.raises(ValueError, match=message):
        call(gpu)


@pytest.mark.parametrize("field", ["smact", "smocc", "drama"])
def test_activity_must_be_fractions(field):
    with pytest.raises(ValueError, match=field):
        JobActivity(**{"smact": 0.5, field: 1.5})


def test_unknown_gpu_type_is_rejected():
    with pytest.raises(ValueError, match="unknown GPU type"):
        EmulatedGpu("GTX-1080")


# ----------------------------------------------------------------------------- physics shape
def test_utilization_is_saturating_not_additive():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("a", JobActivity(0.6, 0.3, 0.3))
    solo = gpu.utilization()
    gpu.attach("b", JobActivity(0.6, 0.3, 0.3))
    pair = gpu.utilization()
    for one, two in zip(solo, pair):
        assert one < two < 2 * one
    for index in range(6):
        gpu.attach(f"x{index}", JobActivity(0.9, 0.9, 0.9))
    assert all(0.99 < value <= 1.0 for value in gpu.utilization())


def test_light_jobs_share_almost_for_free_heavy_ones_do_not():
    light = gpu_with(("a", 1_000), ("b", 1_000), activity=LIGHT)
    heavy = gpu_with(("a", 1_000), ("b", 1_000), activity=HEAVY)
    assert 1.0 < light.slowdown("a") < 1.1
    assert heavy.slowdown("a") > 1.5


def test_a_solo_job_runs_at_solo_speed_in_every_mode():
    for sharing in (SharingMode.MPS, SharingMode.STREAMS, SharingMode.NONE):
        assert gpu_with(("a", 1_000), sharing=sharing, activity=HEAVY).slowdown("a") == 1.0


def test_streams_are_slower_than_mps_for_the_same_residents():
    for activity in (LIGHT, HEAVY):
        mps = gpu_with(("a", 1_000), ("b", 1_000), activity=activity)
        streams = gpu_with(("a", 1_000), ("b", 1_000), activity=activity, sharing=SharingMode.STREAMS)
        assert streams.slowdown("a") > mps.slowdown("a")


def test_a_light_job_barely_slows_a_heavy_neighbour_under_mps():
    gpu = EmulatedGpu("A100-40GB")
    gpu.attach("heavy", HEAVY)
    gpu.attach("light", JobActivity(0.05))
    assert gpu.slowdown("heavy") < 1.1
    assert gpu.slowdown("light") < 1.1


def test_cached_physics_follows_the_resident_set():
    gpu = gpu_with(("a", 1_000), activity=HEAVY)
    power_solo = gpu.power_w()
    gpu.attach("b", HEAVY)
    assert gpu.slowdown("a") > 1.5
    assert gpu.power_w() >= power_solo
    gpu.detach("b")
    assert gpu.slowdown("a") == 1.0
    assert gpu.power_w() == power_solo


def test_no_sharing_admits_one_process():
    gpu = gpu_with(("a", 1_000), sharing=SharingMode.NONE)
    with pytest.raises(GpuBusy):
        gpu.attach("b", LIGHT)


def test_power_is_idle_without_processes_and_capped_when_busy():
    gpu = EmulatedGpu("A100-40GB")
    assert gpu.power_w() == A100.idle_power_w
    gpu.attach("a", JobActivity(0.1))
    low = gpu.power_w()
    gpu.attach("b", JobActivity(0.9))
    assert A100.idle_power_w < low < gpu.power_w() <= A100.max_power_w


def test_sample_reports_the_device_as_monitoring_sees_it():
    gpu = EmulatedGpu("A100-40GB", index=3, uuid="GPU-x")
    gpu.attach("a", HEAVY, pid=4242)
    gpu.allocate("a", 1_000)
    sample = gpu.sample(energy_j=12.5)
    assert (sample.index, sample.uuid, sample.energy_j) == (3, "GPU-x", 12.5)
    assert sample.memory_used_mib == CONTEXT + 1_000
    assert sample.smact == pytest.approx(HEAVY.smact)
    assert sample.processes == ((4242, CONTEXT + 1_000),)
    assert sample.power_w == gpu.power_w()


# ----------------------------------------------------------------------------- MIG
def test_mig_slices_have_the_profile_memory_and_are_isolated():
    big, middle, small = mig_slices("A100-40GB", ("4g.20gb", "2g.10gb", "1g.5gb"), uuid="GPU-m")
    assert [s.memory_total_mib for s in (big, middle, small)] == [19_968, 9_984, 4_864]
    assert len({s.uuid for s in (big, middle, small)}) == 3
    big.attach("a", HEAVY)
    alone = big.slowdown("a")
    middle.attach("b", HEAVY)
    small.attach("c", HEAVY)
    assert big.slowdown("a") == alone  # neighbours in other slices change nothing
    with pytest.raises(GpuBusy):
        big.attach("d", LIGHT)  # one job per slice


def test_smaller_slices_run_a_job_slower_and_a_full_slice_almost_at_full_speed():
    factors = []
    for profile in ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"):
        (slice_,) = mig_slices("A100-40GB", (profile,))
        slice_.attach("job", HEAVY)
        factors.append(slice_.slowdown("job"))
    assert factors == sorted(factors, reverse=True)
    assert factors[-1] < 1.1 < factors[0]  # 7g has 98 of 108 SMs


def test_a_slice_reads_its_own_utilization():
    (small,) = mig_slices("A100-40GB", ("1g.5gb",))
    small.attach("job", JobActivity(0.1, 0.05, 0.02))
    smact, _, _ = small.utilization()
    assert smact > 0.1  # the same work fills a larger fraction of a seventh of the GPU
    assert small.power_w() < A100.idle_power_w  # a slice draws its share of the board


@pytest.mark.parametrize(
    "gpu, layout, message",
    [
        ("A100-40GB", ("4g.20gb", "4g.20gb"), "does not fit"),
        ("A100-40GB", ("9g.99gb",), "no MIG profile"),
        ("V100-32GB", ("1g.5gb",), "does not support MIG"),
        ("A100-40GB", (), "at least one"),
    ],
)
def test_impossible_mig_layouts_are_rejected(gpu, layout, message):
    with pytest.raises(ValueError, match=message):
        mig_slices(gpu, layout)


def test_mig_needs_a_profile_and_a_profile_needs_mig():
    with pytest.raises(ValueError, match="MIG"):
        EmulatedGpu("A100-40GB", sharing=SharingMode.MIG)
    with pytest.raises(ValueError, match="MIG"):
        EmulatedGpu("A100-40GB", sharing=SharingMode.MPS, mig_profile="1g.5gb")


# ----------------------------------------------------------------------------- persistence
def _busy_gpu() -> EmulatedGpu:
    gpu = gpu_with(("a", 6_000), ("b", 9_000), ("c", 4_000), activity=HEAVY)
    gpu.detach("b")
    gpu.attach("d", LIGHT, mem_limit_mib=12_000, pid=77)
    gpu.allocate_peak("d", 7_000)
    return gpu


def test_state_round_trips_through_msgpack_losslessly():
    gpu = _busy_gpu()
    state = msgpack.unpackb(msgpack.packb(gpu.to_state()))
    copy = EmulatedGpu.from_state(state)
    assert copy.to_state() == gpu.to_state()
    assert copy.residents == gpu.residents
    assert copy.largest_free_block_mib == gpu.largest_free_block_mib
    assert [copy.slowdown(j) for j in copy.residents] == [gpu.slowdown(j) for j in gpu.residents]
    # the same next allocation lands in the same place, and the limit survived
    for device in (gpu, copy):
        device.attach("e", LIGHT)
        device.allocate("e", 8_000)
        with pytest.raises(GpuOutOfMemory):
            device.allocate("d", 6_000)
    assert copy.to_state() == gpu.to_state()


def test_mig_slice_and_custom_type_round_trip():
    (slice_,) = mig_slices("A100-40GB", ("3g.20gb",), index=2, uuid="GPU-q")
    slice_.attach("j", HEAVY)
    assert EmulatedGpu.from_state(slice_.to_state()).to_state() == slice_.to_state()
    from dataclasses import replace

    custom = EmulatedGpu(replace(A100, name="A100-lab", memory_mib=20_000))
    custom.attach("j", LIGHT)
    copy = EmulatedGpu.from_state(msgpack.unpackb(msgpack.packb(custom.to_state())))
    assert copy.memory_total_mib == 20_000 and copy.gpu_type == custom.gpu_type


def test_corrupt_state_is_rejected():
    state = _busy_gpu().to_state()
    with pytest.raises(ValueError, match="version"):
        EmulatedGpu.from_state({**state, "version": 99})
    with pytest.raises(ValueError, match="not resident"):
        EmulatedGpu.from_state({**state, "residents": state["residents"][1:]})
    overlapping = state["segments"] + [[state["segments"][0][0], state["segments"][0][1], 2048]]
    with pytest.raises(ValueError, match="overlap"):
        EmulatedGpu.from_state({**state, "segments": overlapping})


# ----------------------------------------------------------------------------- invariants
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("attach allocate detach".split()), st.integers(0, 5),
                          st.integers(1, 12_000)), max_size=40))
def test_ledger_invariants_hold_for_any_sequence(operations):
    gpu = EmulatedGpu("A100-40GB")
    for operation, job_number, mib in operations:
        job = f"j{job_number}"
        try:
            if operation == "attach" and job not in gpu.residents:
                gpu.attach(job, LIGHT)
            elif operation == "allocate" and job in gpu.residents:
                gpu.allocate(job, mib)
            elif operation == "detach":
                gpu.detach(job)
        except GpuOutOfMemory as oom:
            assert oom.requested_mib > oom.largest_free_mib
        assert gpu.memory_used_mib + gpu.memory_free_mib == gpu.memory_total_mib
        assert sum(gpu.job_memory_mib(j) for j in gpu.residents) == gpu.memory_used_mib
        assert gpu.largest_free_block_mib <= gpu.memory_free_mib
        assert all(gpu.slowdown(j) >= 1.0 for j in gpu.residents)
    for job in gpu.residents:
        gpu.detach(job)
    assert gpu.largest_free_block_mib == gpu.memory_total_mib


def test_ledger_rebuild_matches_the_original():
    ledger = MemoryLedger(1_000)
    for owner, size in (("a", 100), ("b", 300), ("c", 50)):
        ledger.reserve(owner, size)
    ledger.release_owner("b")
    copy = MemoryLedger.from_segments(1_000, ledger.segments())
    assert (copy.used_kib, copy.largest_free_kib) == (ledger.used_kib, ledger.largest_free_kib)
    assert copy.reserve("d", 300) == ledger.reserve("d", 300) == 100  # best fit: b's old hole


def test_activity_must_be_a_job_activity():
    with pytest.raises(TypeError, match="JobActivity"):
        EmulatedGpu("A100-40GB").attach("a", {"smact": 0.5})
