"""A node carries out exactly what the core plans on the same snapshots.

The global queue plans over the whole cluster (``Scheduler.step``); each chosen node then checks
the order against its own snapshot, with the launches of the same cycle applied, using the
core's fit rule (``verify_placement``). Property: for equal inputs the node accepts every order
of the plan (for one node, and for a cluster of two), so the two levels never disagree.
No Ray: ``NodeRuntime`` is the actor's Ray-free body.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import JobTicket, Launch, NodeJoined, Submitted
from hier_sched.core.gpu import GpuSample, Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.presets import preset
from hier_sched.core.scheduler import Scheduler
from node_actor.runtime import NodeRuntime
from node_actor.supervision import Run

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

    def failed(self, handle):
        return None

    def ended(self, handle):
        pass


gpu_reading = st.tuples(
    st.floats(0, TOTAL), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1),
    st.lists(st.tuples(st.floats(0, 20000), st.floats(0, 60)), max_size=2),  # resident jobs: (reserved, age s)
)
queued_job = st.tuples(
    st.integers(1, 2), st.one_of(st.none(), st.floats(100, 30000)), st.integers(0, 3), st.one_of(st.none(), st.floats(500, 30000)),
    st.integers(0, 2),
)


def _node(name: str, readings, state_dir: Path, policy: str) -> NodeRuntime:
    """A node whose GPUs show ``readings``; each listed resident runs there, and one launched
    longer ago than the grace has its process on the GPU (its memory is part of ``used``)."""
    shown = {i: tuple((10_000 + 10 * i + k, reserved) for k, (reserved, age) in enumerate(res) if age >= 30)
             for i, (*_, res) in enumerate(readings)}
    samples = [GpuSample(i, f"GPU-{name}-{i}", TOTAL, used, smact, smocc, drama, processes=shown[i])
               for i, (used, smact, smocc, drama, _) in enumerate(readings)]
    runtime = NodeRuntime(name, FakeBackend(samples), preset(policy), state_dir=state_dir / name, launcher=RecordingLauncher())
    runtime.tick(NOW)
    for i, (*_, residents) in enumerate(readings):
        for k, (reserved, age) in enumerate(residents):
            job_id = f"{name}-old{i}-{k}"
            run = Run(job_id, 1, Placement(job_id, name, (i,), reserved), runtime.runs.files(job_id, 1), NOW - age,
                      False, False, pid=10_000 + 10 * i + k if age >= 30 else None)
            runtime.runs.runs[job_id] = run
            runtime.monitor.launched((i,), max(runtime.monitor.last_launch_s[i] or 0.0, NOW - age))
    return runtime


def _schedule(jobs, nodes: dict[str, NodeRuntime], policy: str) -> Scheduler:
    """The queue's core with these jobs waiting (OOM recovery state set as earlier runs left it)."""
    s = Scheduler(preset(policy))
    s.apply([NodeJoined(n, (TOTAL,) * len(node.monitor.monitors)) for n, node in nodes.items()], NOW)
    for i, (gpus, need, ooms, peak, prio) in enumerate(jobs):
        job_id = f"new{i}"
        s.apply([Submitted(JobTicket(job_id, job_id, gpus=gpus, need_mib=need, priority=prio))], float(i))
        queued = s.jobs[job_id].queued
        s.lifecycle.dequeue(job_id)  # its place in the queue follows its recovery state: set it as a crash would
        queued.oom_count, queued.observed_peak_mib = ooms, peak if ooms else None
        s.lifecycle.enqueue(queued)
    return s


def _global_plan_then_node_orders(nodes: dict[str, NodeRuntime], jobs, policy: str) -> None:
    s = _schedule(jobs, nodes, policy)
    snapshots = {name: n.snapshot(NOW) for name, n in nodes.items()}
    result = s.step([], ClusterIndex.from_snapshots(snapshots), NOW)
    launches = [c for c in result.commands if isinstance(c, Launch)]
    for launch in launches:
        spec = LaunchSpec(command=("true",))
        for rank, placement in enumerate(launch.placements):
            reply = nodes[placement.node].launch(LaunchOrder(launch, rank, spec), NOW)
            assert reply.launched, (placement, reply)
    launched = {r.job_id for n in nodes.values() for r, _, _ in n.runs.launcher.launched}
    assert launched == {launch.job_id for launch in launches}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(readings=st.lists(gpu_reading, min_size=1, max_size=4), jobs=st.lists(queued_job, min_size=1, max_size=4),
       policy=st.sampled_from(["magm", "lug", "best-fit", "first-fit", "exclusive", "round-robin", "auto"]))
def test_single_node_launches_what_plan_cycle_plans(readings, jobs, policy):
    with tempfile.TemporaryDirectory() as tmp:
        _global_plan_then_node_orders({"n0": _node("n0", readings, Path(tmp), policy)}, jobs, policy)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(gpu_reading, min_size=2, max_size=4), b=st.lists(gpu_reading, min_size=2, max_size=4),
       jobs=st.lists(queued_job, min_size=1, max_size=5), policy=st.sampled_from(["magm", "lug", "best-fit", "auto", "round-robin"]))
def test_cluster_plan_and_node_re_decisions_agree(a, b, jobs, policy):
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {"n0": _node("n0", a, Path(tmp), policy), "n1": _node("n1", b, Path(tmp), policy)}
        _global_plan_then_node_orders(nodes, jobs, policy)


def test_snapshot_counts_a_fresh_launch_as_pending_until_its_memory_shows():
    with tempfile.TemporaryDirectory() as tmp:
        node = _node("n0", [(1000.0, 0.1, 0.1, 0.1, [(8000.0, 5.0), (6000.0, 45.0)])], Path(tmp), "magm")
        (gpu,) = node.snapshot(NOW)
        assert gpu.pending_mib == 8000.0  # the 45 s old job's process holds its 6000 MiB: in used
        assert set(gpu.resident_jobs) == {"n0-old0-0", "n0-old0-1"}
        assert gpu.memory_free_mib == TOTAL - 1000.0 - 8000.0
        assert gpu.last_launch_s == NOW - 5.0


def test_a_job_keeps_its_whole_reservation_after_the_grace_while_it_holds_less():
    """A job past its post-launch grace that holds less than it reserved (its process started
    late, it loads data before it allocates its peak) keeps the rest: a neighbour placed on the
    memory it has not allocated yet would meet its peak (the double booking of RELIABILITY.md)."""
    with tempfile.TemporaryDirectory() as tmp:
        node = _node("n0", [(500.0, 0.1, 0.1, 0.1, [(25000.0, 45.0)])], Path(tmp), "magm")
        job = next(iter(node.runs.runs.values()))
        node.monitor.monitors[0].last = replace(node.monitor.monitors[0].last, memory_used_mib=500.0,
                                                processes=((job.pid, 500.0),))  # its CUDA context only
        (gpu,) = node.snapshot(NOW)
        assert gpu.pending_mib == 24500.0 and gpu.memory_free_mib == TOTAL - 25000.0
        late = Launch("late", 1, (Placement("late", "n0", (0,), 30000.0),), None,
                      PlacementRequest("late", 1, need_mib=30000.0))
        reply = node.launch(LaunchOrder(late, 0, LaunchSpec(command=("true",))), NOW)
        assert not reply.launched and "needed" in reply.reason
