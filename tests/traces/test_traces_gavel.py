"""``gavel:<name>``: Gavel's Philly-derived traces with durations from measured V100 throughputs."""

from __future__ import annotations

import json

import pytest

from hier_sched.core.gpu_types import gpu_type
from traces import TraceError, load_trace
from traces._paths import data_file
from traces.gavel import GAVEL_TYPES, gavel_traces
from traces.validate import job_problems

TRACE_DIR = data_file("traces", "gavel", "msr", "seed=0")


def _lines(name: str) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in (TRACE_DIR / f"{name}.trace").open()]


def _v100() -> dict[str, float]:
    return json.loads(data_file("interference", "gavel_physical_cluster_throughputs.json").read_text())["v100"]


def test_every_trace_on_disk_loads_with_every_job():
    names = gavel_traces()
    assert len(names) == 15
    total = 0
    for name in names:
        trace = load_trace(f"gavel:{name}")
        assert len(trace.jobs) == len(_lines(name))
        total += len(trace.jobs)
    assert total == 15264


def test_fields_come_from_the_file_and_durations_from_measured_throughput():
    lines, trace = _lines("11cb48"), load_trace("gavel:11cb48")
    measured = _v100()
    speed = gpu_type("V100-16GB").relative_speed / gpu_type("A100-40GB").relative_speed
    checked = 0
    for fields, job in zip(lines, trace.jobs, strict=True):
        job_type, steps, arrival, scale = fields[0], int(fields[4]), float(fields[5]), int(fields[6])
        assert (job.workload, job.submit_s, job.gpus) == (job_type, arrival, scale)
        key = str((job_type, scale))
        if key in measured:
            assert job.duration_s == pytest.approx(steps / measured[key]["null"] * speed)
            checked += 1
        assert job.peak_mib == GAVEL_TYPES[job_type].peak_mib
        assert job_problems(job) == []
    assert checked > len(lines) // 2  # most jobs run at a measured scale factor


def test_unmeasured_scale_factors_scale_the_largest_measured_one_linearly():
    measured = _v100()
    job = next(j for j in load_trace("gavel:11cb48").jobs if j.gpus == 16 and j.workload.startswith("ResNet-50"))
    fields = _lines("11cb48")[int(job.job_id.rsplit("-", 1)[1])]
    per_8 = measured[str((job.workload, 8))]["null"]
    assert job.duration_s == pytest.approx(int(fields[4]) / (per_8 * 2) * 0.55)


def test_wide_jobs_are_multi_node_gangs_and_every_job_fits_the_hinted_v100s():
    trace = load_trace("gavel:11cb48")
    memory = gpu_type(trace.cluster.gpu_type).memory_mib
    for job in trace.jobs:
        assert job.peak_mib <= memory
        if job.gpus <= 8:
            assert job.gpus_per_node is None
        else:
            assert job.gpus_per_node <= 8 and job.gpus % job.gpus_per_node == 0
    assert any(j.gpus == 64 and j.gpus_per_node == 8 for j in trace.jobs)


def test_every_gavel_job_type_borrows_a_real_profile_or_states_an_estimate():
    for name, kind in GAVEL_TYPES.items():
        assert kind.peak_mib > 0 and kind.why, name
    assert load_trace("gavel:795a4c").jobs[0].smact > 0


def test_unknown_gavel_trace_lists_the_known_ones():
    with pytest.raises(TraceError, match="11cb48"):
        load_trace("gavel:nope")
