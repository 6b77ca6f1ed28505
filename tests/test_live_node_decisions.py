"""The node actor decides exactly what the pure core decides on the same snapshots.

The global queue plans over the whole cluster with ``plan_cycle``; each chosen node then
re-decides locally (``NodeRuntime.offer``) on its own snapshot, with the launches of the same
cycle applied. Property: the node launches the very GPUs and reservation of the global plan
(for one node, and for a cluster of two), so the two levels never disagree for equal inputs.
No Ray: ``NodeRuntime`` is the actor's Ray-free body.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuSample
from hier_sched.core.presets import preset
from hier_sched.core.queueing import QueuedJob, plan_cycle
from node_actor.runtime import Assignment, NodeRuntime, RunningJob

TOTAL = 40536.0
NOW = 10_000.0


class FakeBackend:
    name = "fake"

    def __init__(self, samples: list[GpuSample]):
        self.samples = samples

    def gpu_count(self) -> int:
        return len(self.samples)

    def sample(self) -> list[GpuSample]:
        return self.samples

    def gpu_type(self) -> str:
        return "A100-40GB"

    def uuids(self) -> list[str]:
        return [s.uuid for s in self.samples]


class RecordingLauncher:
    def __init__(self):
        self.launched = []

    def launch(self, request, resources, env):
        self.launched.append((request, resources, env))
        return request.job_id

    def poll(self, handle):
        return None


gpu_reading = st.tuples(
    st.floats(0, TOTAL), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1),
    st.lists(st.tuples(st.floats(0, 20000), st.floats(0, 60)), max_size=2),  # resident jobs: (reserved, age s)
)
queued_job = st.tuples(
    st.integers(1, 2), st.one_of(st.none(), st.floats(100, 30000)), st.integers(0, 3), st.one_of(st.none(), st.floats(500, 30000)),
    st.integers(0, 2),
)


def _node(name: str, readings, state_dir: Path, policy: str) -> NodeRuntime:
    samples = [GpuSample(i, f"GPU-{name}-{i}", TOTAL, used, smact, smocc, drama) for i, (used, smact, smocc, drama, _) in enumerate(readings)]
    runtime = NodeRuntime(name, FakeBackend(samples), preset(policy), state_dir=state_dir / name, launcher=RecordingLauncher())
    runtime.sample(NOW)
    for i, (*_, residents) in enumerate(readings):
        for k, (reserved, age) in enumerate(residents):
            job_id = f"{name}-old{i}-{k}"
            runtime.running[job_id] = RunningJob(Assignment(QueuedJob(job_id, 0.0), {}, 0), (i,), reserved, NOW - age,
                                                 job_id, state_dir / "none.pid", state_dir / "none.log")
            runtime.last_launch_s[i] = max(runtime.last_launch_s[i] or 0.0, NOW - age)
    return runtime


def _queue(jobs) -> list[QueuedJob]:
    return [QueuedJob(f"new{i}", float(i), gpus=gpus, need_mib=need, oom_count=ooms, observed_peak_mib=peak if ooms else None,
                      priority=prio, seq=i) for i, (gpus, need, ooms, peak, prio) in enumerate(jobs)]


def _spec(job: QueuedJob) -> dict:
    return {"name": job.job_id, "command": ["true"], "gpus": job.gpus}


def _global_plan_then_node_offers(nodes: dict[str, NodeRuntime], queue: list[QueuedJob], policy: str) -> None:
    cfg = preset(policy)
    snapshots = {name: n.snapshot(NOW) for name, n in nodes.items()}
    plan = plan_cycle(queue, ClusterIndex.from_snapshots(snapshots), cfg.placement, cfg.queue, NOW, rr_cursor=1)
    cursor = 1  # as the global queue does: each offer continues from the previous node's cursor
    for job, (placement,) in plan.placements:
        reply = nodes[placement.node].offer(Assignment(job, _spec(job), 0, rr_cursor=cursor), NOW)
        assert reply["launched"], (placement, reply)
        assert tuple(reply["gpus"]) == placement.gpus
        assert reply["reserved_mib"] == placement.reserved_mib
        cursor = reply["rr_cursor"]
    assert cursor == plan.rr_cursor
    launched = {r.job_id for n in nodes.values() for r, _, _ in n.launcher.launched}
    assert launched == {job.job_id for job, _ in plan.placements}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(readings=st.lists(gpu_reading, min_size=1, max_size=4), jobs=st.lists(queued_job, min_size=1, max_size=4),
       policy=st.sampled_from(["magm", "lug", "best-fit", "first-fit", "exclusive", "round-robin", "auto"]))
def test_single_node_launches_what_plan_cycle_plans(readings, jobs, policy):
    with tempfile.TemporaryDirectory() as tmp:
        _global_plan_then_node_offers({"n0": _node("n0", readings, Path(tmp), policy)}, _queue(jobs), policy)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(gpu_reading, min_size=2, max_size=4), b=st.lists(gpu_reading, min_size=2, max_size=4),
       jobs=st.lists(queued_job, min_size=1, max_size=5), policy=st.sampled_from(["magm", "lug", "best-fit", "auto", "round-robin"]))
def test_cluster_plan_and_node_re_decisions_agree(a, b, jobs, policy):
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {"n0": _node("n0", a, Path(tmp), policy), "n1": _node("n1", b, Path(tmp), policy)}
        _global_plan_then_node_offers(nodes, _queue(jobs), policy)


def test_snapshot_counts_a_fresh_launch_as_pending_until_its_memory_shows():
    with tempfile.TemporaryDirectory() as tmp:
        node = _node("n0", [(1000.0, 0.1, 0.1, 0.1, [(8000.0, 5.0), (6000.0, 45.0)])], Path(tmp), "magm")
        (gpu,) = node.snapshot(NOW)
        assert gpu.pending_mib == 8000.0  # the 45 s old job is past the 30 s grace: its memory is in used
        assert set(gpu.resident_jobs) == {"n0-old0-0", "n0-old0-1"}
        assert gpu.memory_free_mib == TOTAL - 1000.0 - 8000.0
        assert gpu.last_launch_s == NOW - 5.0
