"""``synthetic:philly?...``: deterministic, resampled from real data, loaded as documented."""

from __future__ import annotations

import numpy as np
import pytest

from traces import TraceError, load_trace
from traces._paths import data_file
from traces.gavel import gavel_traces
from traces.validate import job_problems
from traces.workloads import carma_workloads


def _span(trace) -> float:
    return trace.jobs[-1].submit_s - trace.jobs[0].submit_s


def test_same_seed_same_trace_other_seed_other_trace():
    a = load_trace("synthetic:philly?jobs=2000&gpus=64", seed=3)
    b = load_trace("synthetic:philly?jobs=2000&gpus=64&seed=3")
    c = load_trace("synthetic:philly?jobs=2000&gpus=64", seed=4)
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs
    assert load_trace("synthetic:philly?jobs=10&seed=5", seed=99).jobs == load_trace(
        "synthetic:philly?jobs=10", seed=5).jobs  # the query's seed wins


def test_jobs_take_a_real_workload_and_a_real_philly_runtime():
    trace = load_trace("synthetic:philly?jobs=3000&gpus=128&seed=1")
    runtimes = set(np.maximum(np.loadtxt(data_file("traces", "philly", "philly_job_runtimes_s.csv"),
                                          skiprows=1), 1.0).tolist())
    catalogue = carma_workloads()
    assert len(trace.jobs) == 3000
    for job in trace.jobs:
        workload = catalogue[job.workload]
        assert (job.peak_mib, job.smact, job.horus_mib) == (workload.peak_mib, workload.util.smact,
                                                            workload.horus_mib)
        assert job.duration_s in runtimes
        assert job_problems(job) == []
    assert len({j.workload for j in trace.jobs}) > 30
    widths = [j.gpus for j in trace.jobs]
    assert 0.6 < widths.count(1) / len(widths) < 0.78  # Gavel's Philly traces: 68.7 % single-GPU
    assert any(j.gpus_per_node == 8 and j.gpus >= 16 for j in trace.jobs)


def test_arrival_rate_follows_the_documented_load_rule():
    base = load_trace("synthetic:philly?jobs=20000&gpus=1000&seed=2")
    assert _span(load_trace("synthetic:philly?jobs=20000&gpus=1000&seed=2&load=1.7")) == pytest.approx(_span(base) / 2)
    assert _span(load_trace("synthetic:philly?jobs=20000&gpus=2000&seed=2")) == pytest.approx(_span(base) / 2)
    # Absolute: mean gap = E[#GPUs x duration] / (load x G), expectations over the source data.
    runtimes = np.maximum(np.loadtxt(data_file("traces", "philly", "philly_job_runtimes_s.csv"), skiprows=1), 1.0)
    widths = [j.gpus for name in gavel_traces() for j in load_trace(f"gavel:{name}").jobs]
    expected_gap = np.mean(widths) * runtimes.mean() / (0.85 * 1000)
    assert _span(base) / (len(base.jobs) - 1) == pytest.approx(expected_gap, rel=0.05)


@pytest.mark.parametrize("gpus", [1, 4, 12, 20, 64])
def test_every_job_fits_the_cluster_it_comes_with(gpus):
    trace = load_trace(f"synthetic:philly?jobs=3000&gpus={gpus}&seed=0")
    cluster = trace.cluster
    nodes = cluster.node_list or ((cluster.gpus_per_node, cluster.gpu_type),) * cluster.nodes
    assert sum(g for g, _ in nodes) == gpus
    for job in trace.jobs:
        per_node = job.gpus_per_node or job.gpus
        assert sum(g >= per_node for g, _ in nodes) >= job.gpus // per_node
    if gpus < 16:
        assert any("narrowed" in n for n in trace.notes)


@pytest.mark.parametrize("query", ["philly?jobs=0", "philly?gpus=-1", "philly?jobs=ten", "philly?color=red",
                                   "philly?load=0", "helios?jobs=5"])
def test_bad_parameters_are_named(query):
    with pytest.raises(TraceError, match="synthetic"):
        load_trace(f"synthetic:{query}")


def test_tenants_split_the_cluster_among_phillys_largest_vcs_and_change_nothing_else():
    from traces.philly_vc import philly_vc_nodes

    plain = load_trace("synthetic:philly?jobs=3000&gpus=256&seed=2")
    teams = load_trace("synthetic:philly?jobs=3000&gpus=256&seed=2&tenants=4")
    largest = sorted(philly_vc_nodes(), key=lambda vc: -philly_vc_nodes()[vc])[:4]
    assert list(teams.tenant_gpus) == largest and sum(teams.tenant_gpus.values()) == 256
    assert all(g % 8 == 0 and g >= 8 for g in teams.tenant_gpus.values())
    assert not plain.tenant_gpus and all(j.user == "default" for j in plain.jobs)
    # the same arrivals and work; each job now belongs to a team and fits its quota
    assert [j.submit_s for j in teams.jobs] == [j.submit_s for j in plain.jobs]
    for before, after in zip(plain.jobs, teams.jobs):
        assert after.user in teams.tenant_gpus and after.gpus <= teams.tenant_gpus[after.user]
        assert after.gpus * after.duration_s == pytest.approx(before.gpus * before.duration_s)
    shares = np.array([sum(j.user == t for j in teams.jobs) for t in largest]) / len(teams.jobs)
    quota_shares = np.array([teams.tenant_gpus[t] for t in largest]) / 256
    assert np.abs(shares - quota_shares).max() < 0.05  # drawn in proportion to the quotas


@pytest.mark.parametrize("query, problem", [("tenants=12", "tenants must be 1-11"),
                                            ("tenants=9", "9 tenants need at least 72 GPUs"),
                                            ("tenants=two", "bad parameter value")])
def test_bad_tenants_are_refused_by_name(query, problem):
    with pytest.raises(TraceError, match=problem):
        load_trace(f"synthetic:philly?jobs=10&gpus=64&{query}")
