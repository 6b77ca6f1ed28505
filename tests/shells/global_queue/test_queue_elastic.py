"""The queue on a cluster whose GPU nodes an autoscaler adds and removes, without Ray: admission
counts the nodes the autoscaler may add, the demand it is asked for, nodes that join and nodes
Ray's node table says are dead, and a restart after nodes went away."""

from __future__ import annotations

from global_queue.service import CallsOneAtATime, QueueService
from hier_sched.common.messages import LaunchReply, NodeReport, RunOnNode
from hier_sched.core.gpu import GpuState
from tests.helpers.fake_nodes import GPU, StoppedRunEnds

WORKER = {"name": "gpu-worker", "gpu_type": "A100-40GB", "gpus": 2, "max_count": 3}


class ElasticNodes(CallsOneAtATime):
    """Node actors that exist once their node is up (``up``); each has two GPUs and runs what it is
    told; a run it stops ends with SIGTERM, reported until the queue acknowledges it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.up: set[str] = set()
        self.runs: dict[str, dict[str, RunOnNode]] = {}
        self.ended = StoppedRunEnds()

    def reports(self, acks):
        reports = {}
        for node in self.names:
            if node not in self.up:
                continue
            runs = self.runs.setdefault(node, {})
            snapshot = [GpuState(node, i, GPU, 10000.0 if any(i in r.placement.gpus for r in runs.values()) else 0.0,
                                 resident_jobs=tuple(j for j, r in runs.items() if i in r.placement.gpus))
                        for i in range(2)]
            reports[node] = NodeReport(node, 0.0, snapshot, "inc", self.ended.unacknowledged(node, acks),
                                       list(runs.values()))
        return reports

    def call(self, node, method, *args):
        if node not in self.up:
            raise ConnectionError(f"no node {node}")
        if method == "gpu_totals":
            return [GPU, GPU]
        if method == "gpu_types":
            return ["A100-40GB", "A100-40GB"]
        if method == "launch":
            (order,) = args
            self.runs.setdefault(node, {})[order.job_id] = RunOnNode(order.job_id, order.launch.attempt,
                                                                      order.placement)
            return LaunchReply(True, "ok")
        if method == "stop":
            run = self.runs.get(node, {}).pop(args[0], None)
            if run is not None:
                self.ended.stopped(node, run)
            return True
        raise AssertionError(method)


def gang(name: str = "gang", gpus: int = 4, per_node: int = 2) -> dict:
    return {"name": name, "command": ["true"], "gpus": gpus, "gpus_per_node": per_node, "memory_mib": 8000,
            "estimator": "none"}


def queue(tmp_path, nodes: ElasticNodes, clock=lambda: 1000.0) -> QueueService:
    return QueueService(nodes, state_dir=tmp_path, policy="magm", estimator="none", clock=clock,
                        autoscaled_node_types=[WORKER])


def demand(q: QueueService) -> list[dict]:
    return q.observe_nodes([], [])["demand"]


def test_a_gang_for_nodes_the_autoscaler_may_add_is_admitted_and_asked_for(tmp_path):
    nodes = ElasticNodes()
    q = queue(tmp_path, nodes)
    job = q.submit(gang())["job_id"]
    q.tick()
    assert q.status(job)["state"] == "queued"
    assert demand(q) == [{"GPU": 2.0}, {"GPU": 2.0}]  # one bundle per node of the gang
    too_big = q.submit(gang("wide", gpus=8, per_node=4))  # no node type has 4 GPUs
    assert "error" in too_big and "4 GPU" in too_big["error"], too_big
    q.journal.close()


def test_nodes_that_join_run_the_gang_and_a_dead_one_is_lost_at_once(tmp_path):
    nodes = ElasticNodes()
    q = queue(tmp_path, nodes)
    job = q.submit(gang())["job_id"]
    nodes.up |= {"w1", "w2"}
    assert q.observe_nodes(["w1", "w2"], [])["demand"] == [{"GPU": 2.0}, {"GPU": 2.0}]
    q.tick()  # they answer: joined, and the gang placed
    assert q.status(job)["state"] == "running"
    assert demand(q) == [{"GPU": 2.0}, {"GPU": 2.0}]  # now the GPUs its ranks hold: still asked for
    nodes.up.discard("w2")
    q.observe_nodes(["w1"], ["w2"])  # lost with the node, not after a silence: its rank on w1 is stopped
    assert "w2" not in q.node_names and "w2" not in nodes.names and not nodes.runs["w1"]
    q.tick()  # w1 reports its rank's end
    assert q.status(job)["state"] == "queued" and q.status(job)["lost_runs"] == 1
    q.journal.close()


def test_a_queue_restarted_after_nodes_went_away_comes_back_and_knows_them(tmp_path):
    nodes = ElasticNodes()
    first = queue(tmp_path, nodes)
    job = first.submit(gang())["job_id"]
    nodes.up |= {"w1", "w2"}
    first.observe_nodes(["w1", "w2"], [])
    first.tick()
    assert first.status(job)["state"] == "running"
    first.journal.close()
    nodes.up.clear()  # the autoscaler removed both while the queue was down

    again = ElasticNodes()
    second = queue(tmp_path, again)  # with no node known at its start, as a restarted actor is
    assert sorted(second.node_names) == ["w1", "w2"]
    second.observe_nodes([], ["w1", "w2"])
    assert second.status(job)["state"] == "queued"  # its run was lost with the nodes
    assert second.node_names == [] and demand(second) == [{"GPU": 2.0}, {"GPU": 2.0}]
    second.journal.close()


def test_an_idle_node_is_handed_back_once_nothing_waits_and_not_before(tmp_path):
    now = [1000.0]
    nodes = ElasticNodes()
    q = queue(tmp_path, nodes, clock=lambda: now[0])
    nodes.up |= {"w1", "w2", "w3"}
    q.observe_nodes(["w1", "w2", "w3"], [])
    q.tick()  # all three joined, nothing runs
    job = q.submit({"name": "one", "command": ["true"], "gpus": 1, "memory_mib": 8000, "estimator": "none"})["job_id"]
    assert q.observe_nodes(["w1", "w2", "w3"], [], release_after_s=5)["release"] == []  # a job waits
    q.tick()
    (where,) = {p.node for p in q.scheduler.view(job).placements}
    now[0] += 4
    assert q.observe_nodes(["w1", "w2", "w3"], [], release_after_s=5)["release"] == []  # idle, not for long
    now[0] += 2
    answer = q.observe_nodes(["w1", "w2", "w3"], [], release_after_s=5)
    assert sorted(answer["release"]) == sorted({"w1", "w2", "w3"} - {where})  # the one running a job stays
    assert answer["demand"] == [{"GPU": 1.0}] and not answer["waiting"]
    assert q.node_names == [where]
    q.journal.close()


def test_a_gang_ranks_end_waits_in_its_nodes_report_until_every_rank_has_replied_to_its_launch(tmp_path):
    """The replies to a gang's launch orders come with each node's report: until the slower node's
    has come, what the faster node reports of its rank waits there, unacknowledged, so the log
    has the gang's start before its rank's end (a rebuild replays them in that order)."""
    nodes = ElasticNodes()
    q = queue(tmp_path, nodes)
    job = q.submit(gang())["job_id"]
    nodes.up |= {"w1", "w2"}
    q.observe_nodes(["w1", "w2"], [])
    q.tick()  # placed; the orders went with the asks, and both nodes started their ranks
    assert {n for n, runs in nodes.runs.items() if job in runs} == {"w1", "w2"}
    nodes.up.discard("w2")  # slow: no report from it this tick
    nodes.ended.stopped("w1", nodes.runs["w1"].pop(job))  # the rank on w1 ends at once
    q.tick()
    kinds = logged_kinds(q, job)
    assert kinds == ["Submitted"] and q.status(job)["state"] == "running"
    assert q.acks["w1"][1] == 0  # its end not acknowledged: w1 sends it again
    nodes.up.add("w2")
    q.tick()  # w2's reply: the launch settles, then w1's event is taken in
    kinds = logged_kinds(q, job)
    assert kinds[:3] == ["Submitted", "RunStarted", "RunEnded"]
    q.journal.close()


def logged_kinds(q: QueueService, job: str) -> list[str]:
    """The kinds of the log's records of ``job``, in order."""
    return [r["e"]["type"] for r in q.journal.records
            if job in (r["e"].get("job_id"), r["e"].get("ticket", {}).get("job_id"))]
