"""Tenant traces: ``philly-vc:`` merges Gavel's per-VC files, ``helios-vc:`` rebuilds jobs from
per-minute series; both carry their tenants and quotas scaled to the replay's cluster."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hier_sched.core.queues_spec import parse_queues
from hier_sched.front.cli import main
from traces import TraceError, load_trace
from traces.gavel import load_gavel
from traces.helios_vc import VcSeries, helios_vcs, rebuild_jobs
from traces.philly_vc import philly_vc_nodes
from traces.tenants import queues_document, scaled_quota, tenant_queues
from traces.validate import job_problems

DAY = 86400.0


def test_philly_vc_merges_each_vcs_own_jobs_with_its_tenant_and_scaled_quota():
    trace = load_trace("philly-vc:ed69ec,2869ce?start=7&days=14&scale=0.0625")
    assert trace.tenant_gpus == {"ed69ec": 4, "2869ce": 8}  # 8 and 16 nodes of 8 GPUs, / 16
    assert [g for g, _ in trace.cluster.node_list] == [8, 4]  # the cluster of the quotas, in 8-GPU nodes
    submits = [j.submit_s for j in trace.jobs]
    assert submits == sorted(submits) and 0 <= submits[0] and submits[-1] < 14 * DAY
    for vc in ("ed69ec", "2869ce"):
        mine = [j for j in trace.jobs if j.user == vc]
        source = {j.job_id: j for j in load_gavel(vc).jobs if 7 * DAY <= j.submit_s < 21 * DAY}
        assert {j.job_id for j in mine} == set(source)  # every job of the window, and only its VC's
        for job in mine:
            original = source[job.job_id]
            assert job.submit_s == pytest.approx(original.submit_s - 7 * DAY)
            assert job.gpus == min(original.gpus, trace.tenant_gpus[vc])  # narrowed to the quota ...
            assert job.gpus * job.duration_s == pytest.approx(original.gpus * original.duration_s)  # ... work kept
            assert job_problems(job) == []
    assert any(j.user == "2869ce" and j.gpus == 8 and j.duration_s > 0 for j in trace.jobs)


def test_philly_vc_all_names_the_eleven_vcs_with_node_counts_and_caps_jobs_per_vc():
    trace = load_trace("philly-vc:all?days=28&jobs=5")
    assert set(trace.tenant_gpus) == set(philly_vc_nodes()) and len(philly_vc_nodes()) == 11
    assert max(Counter(j.user for j in trace.jobs).values()) == 5
    assert trace.name == "philly-vc:all?start=7&days=28&scale=0.0625&jobs=5"


@pytest.mark.parametrize("gpus, scale, quota", [(512, 1 / 16, 32), (64, 1 / 16, 4), (64, 0.1, 6), (96, 0.1, 8), (120, 0.1, 16),
                                                (100, 0.1, 8), (128, 0.1, 16), (8, 0.01, 1)])
def test_quotas_round_to_whole_nodes_from_a_node_on(gpus, scale, quota):
    assert scaled_quota(gpus, scale) == quota


@pytest.mark.parametrize("name, words", [
    ("philly-vc:nope", "unknown tenant(s) nope"),
    ("philly-vc:ed69ec,ed69ec", "named twice"),
    ("philly-vc:ed69ec?load=2", "unknown parameter 'load'"),
    ("philly-vc:ed69ec?days=0", "days > 0"),
    ("helios-vc:vc6YE?start=30&days=7", "start + days must be <= 31"),
    ("helios-vc:vc6YE?scale=x", "bad parameter value"),
])
def test_bad_tenant_queries_say_what_is_wrong(name, words):
    with pytest.raises(TraceError, match=None) as err:
        load_trace(name)
    assert words in str(err.value)


def series(jobs, gpus, running):
    return VcSeries(*(np.array(values, dtype=np.int64) for values in (jobs, gpus, running)))


def test_helios_jobs_are_rebuilt_from_rises_in_the_series_with_the_running_gpu_time():
    # < 8 GPUs: 2 jobs (3 GPUs) at the start; +2 jobs / +4 GPUs in minute 2; +1 job in minute 4 whose
    # GPUs a departure hid (the mean size then: 6 GPUs / 5 jobs -> 1). >= 8 GPUs: one job of 12 GPUs in
    # minute 3, a whole-node size: 16.
    small = series([2, 2, 4, 4, 5], [3, 3, 7, 7, 6], [3, 3, 7, 7, 6])
    large = series([0, 0, 0, 1, 1], [0, 0, 0, 12, 12], [0, 0, 0, 12, 12])
    jobs = rebuild_jobs("vcX", {"less_8": small, "noless_8": large}, 0, 5, np.random.default_rng(0))
    assert sorted((j.submit_s, j.gpus) for j in jobs) == [(0.0, 1), (0.0, 2), (75.0, 2), (105.0, 2), (150.0, 16),
                                                          (210.0, 1)]
    # each class's GPU-time is the GPU-minutes it ran (26 and 24), no job longer than the 5-minute window
    assert sum(j.gpus * j.duration_s for j in jobs if j.gpus < 8) == pytest.approx(26 * 60.0)
    assert sum(j.gpus * j.duration_s for j in jobs if j.gpus >= 8) == pytest.approx(24 * 60.0)
    assert all(0 < j.duration_s <= 300.0 and job_problems(j) == [] for j in jobs)
    assert {j.gpus_per_node for j in jobs} == {None, 8}


def test_a_helios_class_that_ran_more_than_its_arrivals_can_runs_them_all_window_long():
    busy = series([1] * 5, [8] * 5, [16] * 5)  # 80 GPU-minutes, more than one 8-GPU job can run in 5
    idle = series([0] * 5, [0] * 5, [0] * 5)
    jobs = rebuild_jobs("vcX", {"less_8": idle, "noless_8": busy}, 0, 5, np.random.default_rng(0))
    assert [(j.gpus, j.duration_s) for j in jobs] == [(8, 300.0)]


def test_helios_vc_keeps_a_share_scale_x_load_of_each_vcs_jobs_on_scaled_daily_quotas():
    whole = load_trace("helios-vc:vcMod,vc8Sj?days=2&scale=1")
    quarter = load_trace("helios-vc:vcMod,vc8Sj?days=2&scale=0.25")
    all_on_quarter = load_trace("helios-vc:vcMod,vc8Sj?days=2&scale=0.25&load=4")
    assert whole.tenant_gpus == {"vcMod": 64, "vc8Sj": 48}  # May's quotas (the zero day skipped)
    assert quarter.tenant_gpus == {"vcMod": 16, "vc8Sj": 16}  # 12 rounds up to a whole node
    counts = Counter(j.user for j in whole.jobs)
    assert Counter(j.user for j in quarter.jobs) == {vc: n // 4 for vc, n in counts.items()}
    assert Counter(j.user for j in all_on_quarter.jobs) == counts
    assert whole.duration_gpu is None and whole.cluster.gpu_type == "V100-32GB"
    assert load_trace("helios-vc:vc8Sj?days=2&seed=1").jobs != load_trace("helios-vc:vc8Sj?days=2&seed=2").jobs
    assert len(helios_vcs()) == 16


def test_the_queue_file_of_a_tenant_trace_reads_back_as_its_quotas():
    quotas = {"ed69ec": 4, "103959": 4}
    for borrowing in (True, False):
        queues = tenant_queues(quotas, borrowing=borrowing)
        assert parse_queues(yaml.safe_load(yaml.safe_dump(queues_document(queues)))).queues == queues
    result = CliRunner().invoke(main, ["traces", "queues", "philly-vc:ed69ec,103959?days=1", "--strict"])
    assert result.exit_code == 0, result.output
    assert parse_queues(yaml.safe_load(result.output)).queues == tenant_queues(quotas, borrowing=False)
    refused = CliRunner().invoke(main, ["traces", "queues", "carma:test"])
    assert refused.exit_code == 1 and "no tenants with quotas" in refused.output
