"""A cluster shared by tenants in the replay: per-tenant figures, finish-time fairness against each
tenant alone on its quota, utilization, work lost to preemption, and the three-way comparison."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hier_sched.core.events import CancelRequested, CheckpointRequested
from hier_sched.core.presets import preset
from hier_sched.front.cli import main
from replay.cluster import ClusterShape
from replay.engine import Simulator
from replay.estimates import estimator_for
from replay.metrics import summarize
from replay.run import ReplayOptions
from replay.tenant_runs import alone_jcts, compare_tenants
from traces.schema import Trace, TraceJob

# Two tenants with one GPU each on a 2-GPU node; every job fills a GPU (two never share one).
# a submits two 1,000-s jobs at 0, b one at 10. Alone on its one GPU, a's run one after the other
# (JCTs 1,000 and 2,000), b's at once (1,000).
OPTS = ReplayOptions(policy="magm", estimator="oracle", nodes=1, gpus_per_node=2, report_delay_s=0.0)


def big(jid: str, user: str, submit_s: float, gpus: int = 1) -> TraceJob:
    return TraceJob(jid, submit_s, "w", gpus, 1000.0, 30000.0, smact=0.4, smocc=0.2, drama=0.2, user=user)


TRACE = Trace("two-tenants", [big("a1", "a", 0.0), big("a2", "a", 0.0), big("b1", "b", 10.0)],
              tenant_gpus={"a": 1, "b": 1})


def test_each_tenant_alone_runs_on_its_quota():
    assert alone_jcts(TRACE, OPTS, TRACE.tenant_gpus) == pytest.approx({"a1": 1000, "a2": 2000, "b1": 1000}, abs=1)


def test_known_waits_give_known_finish_time_fairness_three_ways():
    fifo, strict, borrowing = (result for _, result in compare_tenants(TRACE, OPTS))
    # FIFO: a takes both GPUs, b waits for a1's end: b's JCT 1,990 against 1,000 alone.
    a, b = fifo.tenants["a"], fifo.tenants["b"]
    assert (a["jobs"], a["gpu_hours"], a["mean_wait_s"]) == (2, pytest.approx(2000 / 3600), pytest.approx(0, abs=1))
    assert b["mean_wait_s"] == pytest.approx(990, abs=1) and b["p95_wait_s"] == pytest.approx(990, abs=1)
    assert a["rho"] == pytest.approx(2000 / 3000, abs=1e-3) and b["rho"] == pytest.approx(1.99, abs=1e-3)
    assert fifo.max_rho == b["rho"]
    assert fifo.utilization == pytest.approx(3000 / (2 * 2000), abs=1e-3)  # busy GPU-s over 2 GPUs x 2,000 s
    # strict quotas: each tenant exactly as alone
    assert strict.tenants["a"]["rho"] == pytest.approx(1, abs=1e-3) == strict.tenants["b"]["rho"]
    # borrowing: a borrows b's GPU until b arrives; a2 saves in 60 s and resumes after a1, nothing lost
    assert borrowing.preemptions == 1 and borrowing.preemption_lost_gpu_hours == 0
    assert borrowing.preemption_saving_gpu_hours == pytest.approx(60 / 3600)
    assert borrowing.tenants["b"]["rho"] == pytest.approx(1.06, abs=1e-3)
    assert borrowing.tenants["a"]["rho"] == pytest.approx((1000 + 1930) / 3000, abs=1e-3)
    assert borrowing.max_rho < fifo.max_rho / 1.8


def test_a_signalled_run_stopped_before_it_saved_loses_its_gpu_time_since_it_began():
    job = big("j", "a", 0.0, gpus=2)
    sim = Simulator(Trace("t", [job]), ClusterShape.uniform(1, 2), preset("magm"), estimator_for("oracle"),
                    report_delay_s=0.0)
    sim.world.inject(100.0, CheckpointRequested("j"))  # it would save at 160 s ...
    sim.world.inject(130.0, CancelRequested("j"))  # ... but is stopped at 130 s
    wall = sim.run()
    result = summarize(sim, trace_name="t", policy="magm", estimator="oracle", sharing="mps", wall_s=wall, seed=0)
    assert result.preemption_lost_gpu_hours == pytest.approx(2 * 130 / 3600)
    assert result.preemption_saving_gpu_hours == 0
    assert result.max_rho is None and result.tenants["a"]["rho"] is None  # no quota, no alone run


def test_the_tenants_comparison_command_writes_three_runs_with_tenants(tmp_path):
    out = tmp_path / "tenants.json"
    result = CliRunner().invoke(main, ["replay", "--trace", "philly-vc:ed69ec,103959?days=3&jobs=6", "--policy", "auto",
                                       "--estimator", "oracle", "--tenants-compare", "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "max rho" in result.output and "utilization" in result.output
    runs = json.loads(out.read_text())
    assert [r["label"] for r in runs] == ["FIFO", "strict quotas", "fair share + reclaim"]
    for run in runs:
        assert set(run["tenants"]) == {"ed69ec", "103959"}
        assert set(run["tenants"]["ed69ec"]) >= {"gpu_hours", "mean_wait_s", "p95_wait_s", "rho"}
        assert run["max_rho"] == max(t["rho"] for t in run["tenants"].values())
        assert 0 < run["utilization"] <= 1 and run["preemption_lost_gpu_hours"] == 0
    refused = CliRunner().invoke(main, ["replay", "--trace", "carma:test", "--tenants-compare", "--quiet"])
    assert refused.exit_code == 1 and "no tenant quotas" in refused.output
