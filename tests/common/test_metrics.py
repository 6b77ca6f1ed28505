"""The scheduler's metrics, as the publishers compute them from the core's job records and a
node's summary (no Ray: a ``MemorySink`` takes what ``RaySink`` would record). The live export
on each node's Prometheus endpoint is tested in ``test_ray_surfaces.py``."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

from hier_sched.common.metrics import (METRICS, MemorySink, NodeMetrics, QueueMetrics, estimator_choice,
                                       estimator_label)
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (CheckpointRequested, JobTicket, NodeDraining, NodeJoined, NodeLost, NodeUndrained,
                                    QueuesConfigured, RunEnded, Submitted)
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuSample, GpuState
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueQuota, QueueSetup
from hier_sched.core.scheduler import Scheduler

TOTAL = 40536.0


def _idle(now: float = 0.0) -> ClusterIndex:
    return ClusterIndex.from_snapshots({"n0": [GpuState("n0", i, TOTAL, 0.0) for i in range(2)]})


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world():
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (TOTAL, TOTAL))], 0.0)
    clock = Clock()
    sink = MemorySink()
    metrics = QueueMetrics(sink, interval_s=1.0, clock=clock)

    def publish(now_s: float, estimators=None) -> bool:
        clock.t += 1.0  # past the throttle
        return metrics.publish(s, estimators or {}, now_s)

    return s, sink, publish


def _ticket(job_id: str, **kw) -> JobTicket:
    return JobTicket(job_id, job_id, **{"need_mib": 4000.0, "signature": job_id, **kw})


def test_nodes_per_state_follow_drains_and_losses(world):
    s, sink, publish = world
    s.apply([NodeJoined("n1", (TOTAL,)), NodeJoined("n2", (TOTAL,))], 0.0)
    s.step([Submitted(_ticket("stays"))], _idle(), 1.0)  # on n0's first GPU
    s.apply([NodeDraining("n0"), NodeDraining("n1"), NodeDraining("n2"), NodeLost("n2")], 2.0)

    def states() -> dict[str, float]:
        return {st: sink.value("hier_sched_nodes", state=st) for st in ("open", "draining", "drained")}

    publish(3.0)
    assert states() == {"open": 0, "draining": 1, "drained": 1}  # n0 runs a job, n1 is empty, n2 is gone
    s.apply([NodeUndrained("n1")], 4.0)
    publish(5.0)
    assert states() == {"open": 1, "draining": 1, "drained": 0}


def test_queue_depths_and_running_jobs(world):
    s, sink, publish = world
    publish(0.0)  # the baseline: nothing yet
    s.step([Submitted(_ticket(f"j{i}")) for i in range(3)], None, 10.0)
    publish(30.0)
    assert sink.value("hier_sched_queue_depth", queue="main") == 3
    assert sink.value("hier_sched_queue_depth", queue="recovery") == 0
    assert sink.value("hier_sched_oldest_wait_seconds") == 20.0
    assert sink.value("hier_sched_jobs_submitted_total") == 3
    s.step([], _idle(), 40.0)  # MAGM puts one job on each idle GPU
    publish(41.0)
    assert sink.value("hier_sched_running_jobs") == 2 and sink.value("hier_sched_jobs", state="running") == 2
    assert sorted(sink.samples[("hier_sched_wait_seconds", ())]) == [30.0, 30.0]


def test_team_queues_are_published_per_queue_and_figure(world):
    s, sink, publish = world
    publish(0.0)
    assert not [k for k in sink.gauges if k[0].startswith("hier_sched_team_queue")]  # none configured: none
    s.apply([QueuesConfigured(QueueSetup((QueueQuota("team-a", 1), QueueQuota("team-b", 1, nominal_mib=20000.0))))],
            1.0)
    s.step([Submitted(_ticket(f"a{i}", queue="team-a")) for i in range(3)], _idle(), 2.0)
    s.step([], None, 3.0)
    publish(3.0)
    gpus = {figure: sink.value("hier_sched_team_queue_gpus", team_queue="team-a", figure=figure)
            for figure in ("used", "nominal", "borrowed", "fair_share")}
    assert gpus == {"used": 2, "nominal": 1, "borrowed": 1, "fair_share": 2}  # 3 asked, 2 GPUs in the cluster
    assert sink.value("hier_sched_team_queue_memory_mib", team_queue="team-a", figure="used") == 2 * 4000.0
    assert sink.value("hier_sched_team_queue_memory_mib", team_queue="team-a", figure="nominal") is None
    assert sink.value("hier_sched_team_queue_memory_mib", team_queue="team-b", figure="nominal") == 20000.0
    assert sink.value("hier_sched_team_queue_waiting_jobs", team_queue="team-a") == 1
    assert sink.value("hier_sched_team_queue_share", team_queue="team-a") > 0


def test_oom_crash_and_recovery_are_counted_by_step_and_the_estimate_error_by_estimator(world):
    s, sink, publish = world
    publish(0.0)
    s.step([Submitted(_ticket("liar", need_mib=4000.0))], _idle(), 1.0)
    s.step([RunEnded("liar", 1, Failure("oom", "CUDA out of memory"), 1, 9000.0)], None, 5.0)
    publish(6.0)
    assert sink.value("hier_sched_oom_crashes_total", step="0") == 1
    assert sink.value("hier_sched_queue_depth", queue="recovery") == 1
    s.step([], _idle(), 7.0)
    s.step([RunEnded("liar", 2, None, 0, 8000.0)], None, 20.0)
    publish(21.0, {"liar": estimator_choice({"memory_mib": 4000.0, "estimator": "auto"})})
    assert sink.value("hier_sched_oom_recoveries_total", step="1") == 1
    assert sink.value("hier_sched_jobs_ended_total", state="succeeded") == 1
    assert sink.samples[("hier_sched_estimate_ratio", (("estimator", "declared"),))] == [9000.0 / 4000.0]
    publish(22.0)  # an ended job is counted once
    assert sink.value("hier_sched_jobs_ended_total", state="succeeded") == 1


def test_ended_jobs_stay_counted_by_state_while_later_submissions_join(world):
    s, sink, publish = world
    publish(0.0)
    s.step([Submitted(_ticket("a")), Submitted(_ticket("b"))], _idle(), 1.0)
    s.step([RunEnded("a", 1, None, 0, 1000.0), RunEnded("b", 1, Failure("crash", "exit 1"), 1)], None, 5.0)
    publish(6.0)
    s.step([Submitted(_ticket("c"))], None, 7.0)
    publish(8.0)
    publish(9.0)  # nothing changed: the same figures
    assert sink.value("hier_sched_jobs", state="succeeded") == 1 and sink.value("hier_sched_jobs", state="failed") == 1
    assert sink.value("hier_sched_jobs", state="queued") == 1 and sink.value("hier_sched_jobs_submitted_total") == 3
    assert sink.value("hier_sched_jobs_ended_total", state="failed") == 1


def test_checkpoints_and_slot_preemptions(world):
    s, sink, publish = world
    publish(0.0)
    s.step([Submitted(_ticket("long", slot_s=1000.0, slot_grace_s=100.0)), Submitted(_ticket("other")),
            Submitted(_ticket("third"))], _idle(), 0.0)
    s.step([], None, 950.0)  # the slot's checkpoint signal: a job waits
    s.step([RunEnded("long", 1, Failure("checkpoint_requeue", "saved"), 85)], None, 960.0)
    s.step([CheckpointRequested("other")], None, 961.0)  # asked by a user
    publish(962.0)
    assert sink.value("hier_sched_slot_preemptions_total") == 1
    assert sink.value("hier_sched_checkpoints_requested_total") == 2
    assert sink.value("hier_sched_checkpoints_completed_total") == 1


def test_a_restarted_publisher_does_not_count_the_past_again(world):
    s, sink, publish = world
    s.step([Submitted(_ticket("a"))], _idle(), 0.0)
    s.step([RunEnded("a", 1, Failure("oom", "oom"), 1, 9000.0)], None, 5.0)
    publish(6.0)  # first publication (a fresh actor over a rebuilt queue): gauges only
    assert sink.value("hier_sched_queue_depth", queue="recovery") == 1
    assert not any(sink.counters.values()) and not sink.samples.get(("hier_sched_wait_seconds", ()))


def test_every_counter_is_exported_at_zero_from_the_first_publication():
    """A Grafana panel over a counter that was never incremented would show "No data"."""
    sink, clock = MemorySink(), Clock()
    QueueMetrics(sink, interval_s=1.0, clock=clock).publish(Scheduler(preset("magm")), {}, 0.0)
    counters = [d for d in METRICS if d.kind == "counter"]
    assert counters and all(d.zero_tags for d in counters)
    for d in counters:
        for tags in d.zero_tags:
            assert sink.value(d.name, **tags) == 0.0, (d.name, tags)
            assert set(tags) == set(d.tags)


def test_ray_counters_can_record_zero():
    """``RaySink.zero`` records a 0 increment through a private call of Ray's metric classes:
    an upgrade of Ray that drops it must fail here, not silently leave panels empty."""
    import inspect

    from ray.util.metrics import Counter

    assert list(inspect.signature(Counter._record).parameters) == ["self", "value", "tags"]


def test_publications_are_throttled_but_latencies_always_recorded():
    s = Scheduler(preset("magm"))
    sink, clock = MemorySink(), Clock()
    metrics = QueueMetrics(sink, interval_s=1.0, clock=clock)
    assert metrics.publish(s, {}, 0.0, tick_s=0.01, step_s=0.001)
    clock.t = 0.5
    assert not metrics.publish(s, {}, 0.5, tick_s=0.02, step_s=0.002)
    assert sink.samples[("hier_sched_placement_seconds", ())] == [0.001, 0.002]
    assert len(sink.samples[("hier_sched_tick_seconds", ())]) == 2


@pytest.mark.parametrize("spec, source, label", [
    ({"memory_mib": 3000, "estimator": "horus"}, "declared memory_mib", "declared"),
    ({"memory_mib": None, "estimator": "horus"}, "estimator horus", "horus"),
    ({}, "estimator auto", "auto"),
    ({"memory_mib": None, "estimator": "auto"}, "measured peak of an earlier run of the same job (+5%)", "learned"),
])
def test_estimator_labels_are_few_and_stable(spec, source, label):
    assert estimator_label(estimator_choice(spec), source) == label
    assert estimator_label(None, source) == ("learned" if label == "learned" else "auto")  # a job it does not know


def test_node_metrics_per_gpu():
    sink = MemorySink()
    summary = {"running": ["a"], "free_mib": [30000, 40000],
               "gpu_detail": [{"index": 0, "total_mib": 40536, "used_mib": 9000, "reserved_mib": 10000,
                               "smact": 0.42, "power_w": 180.0, "residents": ["a"]},
                              {"index": 1, "total_mib": 40536, "used_mib": 0, "reserved_mib": 0,
                               "smact": 0.0, "power_w": 55.0, "residents": []}]}
    samples = [GpuSample(0, "u0", 40536, 9000, smact=0.5, energy_j=1234.0), None]
    NodeMetrics("node1", sink).publish(summary, samples)
    assert sink.value("hier_sched_gpu_memory_reserved_mib", node="node1", gpu="0") == 10000
    assert sink.value("hier_sched_gpu_memory_free_mib", node="node1", gpu="1") == 40000
    assert sink.value("hier_sched_gpu_smact_risk", node="node1", gpu="0") == 0.42
    assert sink.value("hier_sched_gpu_smact", node="node1", gpu="0") == 0.5
    assert sink.value("hier_sched_gpu_energy_joules", node="node1", gpu="0") == 1234.0
    assert sink.value("hier_sched_gpu_energy_joules", node="node1", gpu="1") is None  # no sample yet
    assert sink.value("hier_sched_gpu_jobs", node="node1", gpu="0") == 1
    assert sink.value("hier_sched_node_runs", node="node1") == 1


def test_every_metric_is_documented_and_on_the_grafana_dashboard():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    dashboard = json.dumps(json.loads((ROOT / "docs" / "grafana" / "hier_sched.json").read_text()))
    for m in METRICS:
        assert f"`{m.exported}`" in doc, f"{m.exported} missing from docs/metrics.md"
        assert m.exported in dashboard, f"{m.exported} missing from docs/grafana/hier_sched.json"
    documented = set(re.findall(r"`(ray_hier_sched_\w+)`", doc))
    assert documented <= {m.exported for m in METRICS}, documented - {m.exported for m in METRICS}
