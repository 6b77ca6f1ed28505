"""Drains through the queue service: an operator's ``drain``/``undrain``, Ray's own drains taken in
from the node set, and a drain's decisions kept across a restart (the core's rules: ``core.drains``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from global_queue.service import RAY_DRAIN_REASON, QueueService
from tests.helpers.fake_nodes import Nodes, StoppedRunEnds


class DrainedNodes(Nodes):
    """The fake node, with the checkpoint signals it got and the drains Ray has of it; a run it
    stops ends with SIGTERM, and its end is in the node's next report."""

    def __init__(self):
        super().__init__()
        self.signals: list[str] = []
        self.ray_drains: dict[str, float | None] = {}
        self.ended = StoppedRunEnds()

    def draining(self):
        return dict(self.ray_drains)

    def reports(self, acks):
        reports = super().reports(acks)
        return {n: replace(r, events=self.ended.unacknowledged(n, acks)) for n, r in reports.items()}

    def call(self, node, method, *args):
        if method == "signal_checkpoint":
            self.signals.append(args[0])
            return True
        if method == "stop":
            run = self.runs.pop(args[0], None)
            if run is not None:
                self.ended.stopped(node, run)
            return True
        return super().call(node, method, *args)


def service(state: Path, nodes: Nodes, clock=lambda: 1000.0) -> QueueService:
    return QueueService(nodes, state_dir=state, policy="magm", estimator="none", clock=clock)


def spec(name: str, **kw) -> dict:
    return {"name": name, "command": ["true"], "memory_mib": 30000, "estimator": "none", **kw}


def test_a_drained_node_takes_no_job_its_checkpointing_jobs_are_signalled_and_the_drain_survives_a_restart(tmp_path):
    nodes = DrainedNodes()
    queue = service(tmp_path, nodes)
    saver = queue.submit(spec("saver", checkpoint_dir=str(tmp_path / "ckpt")))["job_id"]
    queue.tick()
    assert queue.drain_node("n9")["error"].startswith("no node 'n9' in this cluster")
    assert "deadline must be a number of seconds >= 0" in queue.drain_node("n0", -1.0)["error"]
    answer = queue.drain_node("n0", reason="kernel upgrade")
    assert answer | {"since": 0} == {"node": "n0", "state": "draining", "reason": "kernel upgrade", "since": 0,
                                     "deadline": None, "jobs": [saver]}
    assert nodes.signals == [saver] and queue.status(saver)["state"] == "checkpointing"
    waiting = queue.submit(spec("waiting"))["job_id"]
    queue.tick()
    assert queue.status(waiting)["state"] == "queued" and nodes.launches == 1
    assert queue.cluster()["drains"][0]["node"] == "n0"
    queue.journal.close()

    again = service(tmp_path, nodes)
    assert [d["node"] for d in again.scheduler.drained_nodes()] == ["n0"]
    assert again.undrain_node("n1")["error"] == "node 'n1' is not drained"
    assert again.undrain_node("n0") == {"node": "n0", "state": "open"}
    again.tick()
    assert again.status(waiting)["state"] == "running"
    again.journal.close()


def test_a_deadline_stops_what_still_runs_requeues_it_once_it_ended_and_a_restart_from_the_log_agrees(tmp_path):
    nodes = DrainedNodes()
    now = [1000.0]
    queue = service(tmp_path, nodes, clock=lambda: now[0])
    plain = queue.submit(spec("plain"))["job_id"]
    queue.tick()
    queue.drain_node("n0", deadline_s=30.0)
    now[0] += 31.0
    queue.tick()
    assert plain not in nodes.runs and queue.status(plain)["state"] == "running"  # stopped; its end not seen yet
    queue.tick()
    assert queue.status(plain)["state"] == "queued" and queue.status(plain)["lost_runs"] == 1
    queue.journal.close()
    again = service(tmp_path, nodes, clock=lambda: now[0])
    assert again.status(plain)["state"] == "queued" and again.status(plain)["lost_runs"] == 1
    again.journal.close()


def test_rays_drain_of_a_node_drains_it_with_rays_deadline_and_its_end_opens_it_again(tmp_path):
    nodes = DrainedNodes()
    queue = service(tmp_path, nodes)
    nodes.ray_drains = {"n0": 1000.0 + 120.0}  # a spot node's notice: two minutes
    queue.tick()
    (drain,) = queue.scheduler.drained_nodes()
    assert drain["reason"] == RAY_DRAIN_REASON and drain["deadline"] == queue._now() + 120.0
    queue.tick()
    assert len(queue.scheduler.drained_nodes()) == 1  # taken in once
    nodes.ray_drains = {}
    queue.tick()
    assert queue.scheduler.drained_nodes() == []
    queue.journal.close()
