"""The queue's reach to its nodes through Ray (``global_queue.actor.RayNodeSet``): every node is asked
at once and waited on with one budget per tick, so a hung node sits ticks out without slowing the
others; a node whose picture did not change says so in a few bytes.

One local Ray cluster for the module (this process's own, ended with it). The nodes are
``SimulatedNodes`` (``hier-sched bench control-plane``'s): the real messages, no processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

from global_queue.actor import RayNodeSet
from global_queue.service import QueueService
from hier_sched.common.actor_names import NAMESPACE
from hier_sched.front.bench.simulated_nodes import SimulatedNodes

TIME_SCALE = 0.001  # an emulated second is a wall millisecond: a 500 s job takes 0.5 s
SPEC = {"name": "short", "gpus": 1, "memory_mib": 4000, "estimator": "none",
        "emulation": {"peak_mib": 4000, "duration_s": 500}}


@pytest.fixture(scope="module")
def local_ray():
    temp = tempfile.mkdtemp(prefix="hsn-")  # short: Ray's socket paths must stay below 107 bytes
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, _temp_dir=temp, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _hosts(prefix: str, healthy: list[str], hung: list[str]) -> tuple[dict[str, str], list]:
    """Two host actors: one for the healthy nodes, one whose nodes never answer ``exchange``."""
    actors = [SimulatedNodes.options(name=f"{prefix}:ok").remote(healthy, gpus=2, time_scale=TIME_SCALE),
              SimulatedNodes.options(name=f"{prefix}:hung").remote(hung, gpus=2, time_scale=TIME_SCALE, hung=hung)]
    ray.get([a.gpu_totals.remote(n) for a, n in zip(actors, (healthy[0], hung[0]))])
    return {**{n: f"{prefix}:ok" for n in healthy}, **{n: f"{prefix}:hung" for n in hung}}, actors


def _tick_until(service: QueueService, finished, timeout_s: float = 60.0) -> list[float]:
    """Tick the queue every 50 ms until ``finished()`` (or ``timeout_s``); each tick's seconds."""
    ticks: list[float] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        service.tick()
        ticks.append(time.perf_counter() - started)
        if finished():
            break
        time.sleep(0.05)
    return ticks


def test_a_hung_node_does_not_slow_the_other_nodes_ticks(local_ray, tmp_path):
    hosts, (_, hung_host) = _hosts("hung-test", ["n0", "n1"], ["stuck"])
    nodes = RayNodeSet(["n0", "n1", "stuck"], hosts, exchange_budget_s=1.0)
    service = QueueService(nodes, state_dir=tmp_path, time_scale=TIME_SCALE, node_timeout_s=3600)
    jobs = [a["job_id"] for a in service.submit_many([SPEC] * 6)]
    ticks = _tick_until(service, lambda: all(s == "succeeded" for s in service.states(jobs).values()))
    states = service.states(jobs)
    assert all(s == "succeeded" for s in states.values()), states  # the healthy nodes ran every job
    # the hung node cost the first tick the budget (1 s), never a call's timeout (10 s), and the
    # later ticks nothing: its exchange stays in flight, looked at, not waited for
    assert len(ticks) >= 3 and max(ticks) < 5.0, ticks
    assert sorted(ticks)[len(ticks) // 2] < 1.0, ticks
    assert {n for j in jobs for n in service.scheduler.view(j).nodes_ran} <= {"n0", "n1"}
    # one exchange stays in flight to the hung node: its threads are not all taken by calls piling up
    assert len(ray.get(hung_host.gpu_totals.remote("stuck"), timeout=10)) == 2
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match="not answering"):
        nodes.call("stuck", "summary")  # not waited on: its exchange is still in flight
    assert time.perf_counter() - started < 1.0


def test_a_node_stuck_starting_its_runs_does_not_slow_the_other_nodes_ticks(local_ray, tmp_path):
    """Launch orders ride on the asks: a node that hangs while it starts a run is a node that does
    not answer, sitting ticks out (before, every tick waited up to 30 s for its launch answers)."""
    ok = SimulatedNodes.options(name="start-test:ok").remote(["s0", "s1"], gpus=2, time_scale=TIME_SCALE)
    stuck = SimulatedNodes.options(name="start-test:stuck").remote(["slow"], gpus=2, time_scale=TIME_SCALE,
                                                                  stuck_starting=["slow"])
    ray.get([ok.gpu_totals.remote("s0"), stuck.gpu_totals.remote("slow")])
    hosts = {"s0": "start-test:ok", "s1": "start-test:ok", "slow": "start-test:stuck"}
    nodes = RayNodeSet(["s0", "s1", "slow"], hosts, exchange_budget_s=1.0)
    service = QueueService(nodes, state_dir=tmp_path, time_scale=TIME_SCALE, node_timeout_s=3600)
    jobs = [a["job_id"] for a in service.submit_many([SPEC] * 12)]

    def done() -> set[str]:
        return {j for j, s in service.states(jobs).items() if s == "succeeded"}

    def on_slow() -> set[str]:
        return {j for j in jobs if "slow" in service.scheduler.view(j).nodes_ran}

    ticks = _tick_until(service, lambda: bool(on_slow()) and done() == set(jobs) - on_slow())
    assert on_slow(), "no job was placed on the stuck node"
    assert done() == set(jobs) - on_slow()  # every job placed elsewhere ran, the stuck node's still start
    assert len(ticks) >= 3 and max(ticks) < 5.0, ticks
    assert sorted(ticks)[len(ticks) // 2] < 1.0, ticks


def test_an_unchanged_node_answers_in_a_few_bytes_and_the_queue_sees_its_whole_picture(local_ray):
    hosts, (host, _) = _hosts("same-test", ["m0"], ["m-stuck"])
    nodes = RayNodeSet(["m0"], hosts, exchange_budget_s=5.0)
    first = nodes.exchange_all({})["m0"]
    acks = {"m0": (first.incarnation, 0)}
    second = nodes.exchange_all(acks)["m0"]
    assert not first.unchanged and second.snapshot == first.snapshot and second.runs == first.runs
    direct = ray.get(host.exchange_many.remote({"m0": (0, first.incarnation, first.version, [])}))["m0"]
    assert direct.unchanged and direct.snapshot is None and direct.runs is None
    stale = ray.get(host.exchange_many.remote({"m0": (0, first.incarnation, first.version - 1, [])}))["m0"]
    assert not stale.unchanged and stale.snapshot == first.snapshot


def test_a_tick_asks_for_the_next_reports_as_it_ends_and_the_next_tick_reads_them_without_waiting(local_ray, tmp_path):
    hosts, _ = _hosts("ahead-test", ["a0", "a1"], ["a-stuck"])
    host = hosts["a0"]
    nodes = RayNodeSet(["a0", "a1"], hosts, exchange_budget_s=5.0)
    service = QueueService(nodes, state_dir=tmp_path, time_scale=TIME_SCALE, node_timeout_s=3600)
    service.tick()
    asked = nodes.in_flight[host]  # sent as the tick ended, with its acks
    # a node asked just now is not a node that does not answer: calls to it go through
    assert nodes.call("a0", "summary") is not None
    ray.wait([asked], timeout=10)
    started = time.perf_counter()
    reports = nodes.exchange_all(dict(service.acks))
    assert time.perf_counter() - started < 1.0  # read, not asked again and waited for (the budget is 5 s)
    assert set(reports) == {"a0", "a1"} and host not in nodes.in_flight
    service.tick()  # a whole tick: it too reads its predecessor's answers at once, and asks again
    assert host in nodes.in_flight and nodes.in_flight[host] is not asked
    # an answer that came and waits for the next tick is a node that answers, however long it waits
    nodes.exchange_budget_s = 0.2
    ray.wait([nodes.in_flight[host]], timeout=10)
    time.sleep(0.5)
    assert nodes.call("a1", "summary") is not None


def test_bench_control_plane_runs_every_job_once_at_a_small_size():
    """The benchmark's own Ray cluster, in a process of its own (this module's is this process's)."""
    hs = str(Path(sys.executable).parent / "hier-sched")
    run = subprocess.run([hs, "bench", "control-plane", "--nodes", "4", "--gpus-per-node", "2", "--queued", "40",
                          "--batch", "10", "--nodes-per-host", "2", "--duration", "200", "--json"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout)
    assert figures["states"] == {"succeeded": 40} and figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["ticks"] > 0 and figures["submit_p50_ms"] > 0 and figures["queue_rss_mib"] > 0


def _where(nodes: RayNodeSet, actor: str) -> str:
    """The Ray node ``actor`` said it runs on, once its answer is in (the node table read each time)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        nodes._table_read = 0.0
        nodes.dead()
        if isinstance(known := nodes.ray_nodes.get(actor), str):
            return known
        time.sleep(0.05)
    raise AssertionError(f"{actor} never said where it runs")


def test_a_node_back_on_a_new_ray_node_is_not_lost_when_ray_marks_its_old_one_dead(local_ray, monkeypatch):
    """A machine that died and came back under its name: Ray marks its old Ray node dead only when
    that node's health checks have failed (~15 s), by when the name's new actor runs on the new
    one. Lost then, the node's new runs were requeued while they ran (the chaos test's "ran twice")."""
    host = SimulatedNodes.options(name="back:host").remote(["b1"], gpus=2, time_scale=TIME_SCALE)
    ray.get(host.gpu_totals.remote("b1"))
    nodes = RayNodeSet(["b1"], hosts={"b1": "back:host"})
    here = _where(nodes, "back:host")
    old = "f" * len(here)
    table = ray.nodes
    old_is_dead = lambda: [*table(), {"NodeID": old, "Alive": False}]  # noqa: E731
    monkeypatch.setattr(ray, "nodes", old_is_dead)
    nodes.ray_nodes["back:host"] = old  # its actor ran on a machine that died...
    nodes._table_read = 0.0
    assert nodes.dead() == {"b1"}  # ...and nothing says it is back: lost at once
    monkeypatch.setattr(ray, "nodes", table)  # Ray has not marked the old machine dead yet...
    nodes.ray_nodes["back:host"] = old
    nodes._silent("back:host", RuntimeError("died with its machine"))
    nodes._handle("back:host")  # ...when the next call looks the name up again: it came back
    assert _where(nodes, "back:host") == here
    monkeypatch.setattr(ray, "nodes", old_is_dead)
    nodes._table_read = 0.0
    assert nodes.dead() == set()  # the old machine's death, read late, loses nothing
    ray.kill(host)
