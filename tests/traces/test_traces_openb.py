"""``openb:default`` / ``openb:gpushare100``: Alibaba pods with fractional GPU requests."""

from __future__ import annotations

import csv

import pytest

from hier_sched.core.gpu_types import GPU_TYPES
from traces import TraceError, load_trace
from traces._paths import data_file
from traces.validate import job_problems

DIR = ("traces", "alibaba-openb-2023")


def _pods(variant: str) -> list[dict[str, str]]:
    with data_file(*DIR, f"openb_pod_list_{variant}.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("variant", ["default", "gpushare100"])
def test_gpu_pods_become_jobs_and_cpu_pods_are_counted(variant):
    pods = _pods(variant)
    gpu_pods = {p["name"]: p for p in pods if int(p["num_gpu"]) > 0}
    trace = load_trace(f"openb:{variant}")
    assert len(pods) == 8152
    assert len(trace.jobs) == len(gpu_pods)
    assert any(f"skipped {len(pods) - len(gpu_pods)} pods" in n for n in trace.notes)
    submits = [j.submit_s for j in trace.jobs]
    assert submits == sorted(submits)
    for job in trace.jobs:
        pod = gpu_pods[job.job_id]
        assert job.submit_s == float(pod["creation_time"])
        start = pod["scheduled_time"] or pod["creation_time"]
        assert job.duration_s == max(1.0, float(pod["deletion_time"]) - float(start))
        assert job.gpu_milli == int(pod["gpu_milli"]) and job.gpus == int(pod["num_gpu"])
        assert job.peak_mib == pytest.approx(int(pod["gpu_milli"]) / 1000 * GPU_TYPES["T4"].memory_mib)
        assert job_problems(job) == []


def test_fractional_requests_scale_memory_and_utilization():
    jobs = load_trace("openb:gpushare100").jobs
    assert all(j.gpu_milli < 1000 and j.gpus == 1 for j in jobs)
    half = [j for j in jobs if j.gpu_milli == 470]
    full = [j for j in load_trace("openb:default").jobs if j.gpu_milli == 1000]
    assert half and full
    assert half[0].smact == pytest.approx(0.47 * full[0].smact)
    assert {j.priority for j in jobs} <= {0, 1, 2}


def test_node_list_maps_every_gpu_model_to_a_known_type():
    with data_file(*DIR, "openb_node_list_gpu_node.csv").open(newline="") as fh:
        nodes = list(csv.DictReader(fh))
    cluster = load_trace("openb:default").cluster
    assert len(cluster.node_list) == len(nodes) == 1213
    assert sum(g for g, _ in cluster.node_list) == sum(int(n["gpu"]) for n in nodes) == 6212
    assert {t for _, t in cluster.node_list} <= GPU_TYPES.keys()
    assert ("A10" in {t for _, t in cluster.node_list}) and cluster.gpus_per_node == 8


def test_unknown_openb_variant_lists_the_known_ones():
    with pytest.raises(TraceError, match="gpushare100"):
        load_trace("openb:nope")
