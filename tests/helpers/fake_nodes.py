"""A stand-in for the node actors behind ``QueueService``: no Ray, no processes."""

from __future__ import annotations

from global_queue.service import CallsOneAtATime
from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport, RunOnNode
from hier_sched.core.events import RunEnded
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState

GPU = 40536.0


class Nodes(CallsOneAtATime):
    """One node of two GPUs that launches what it is told and reports what it runs."""

    def __init__(self):
        super().__init__()
        self.names = ["n0"]
        self.runs: dict[str, RunOnNode] = {}
        self.orders: list[LaunchOrder] = []  # every launch order received, in order

    silent = False  # the node does not answer (restarting, or slow)

    def reports(self, acks):
        if self.silent:
            return {}
        busy = {g for r in self.runs.values() for g in r.placement.gpus}
        snapshot = [GpuState("n0", i, GPU, 10000.0 if i in busy else 0.0,
                             resident_jobs=tuple(j for j, r in self.runs.items() if i in r.placement.gpus))
                    for i in range(2)]
        return {"n0": NodeReport("n0", 0.0, snapshot, "inc", [], list(self.runs.values()))}

    @property
    def launches(self) -> int:
        return len(self.orders)

    def call(self, node, method, *args):
        if method == "gpu_totals":
            return [GPU, GPU]
        if method == "gpu_types":
            return ["A100-40GB", "A100-40GB"]
        if method == "launch":
            (order,) = args
            self.orders.append(order)
            self.runs[order.job_id] = RunOnNode(order.job_id, order.launch.attempt, order.placement)
            return LaunchReply(True, "ok")
        raise AssertionError(method)


class StoppedRunEnds:
    """What fake nodes report of the runs they stopped, as a node actor does: each ends with
    SIGTERM, numbered, and is reported until the queue acknowledges it."""

    def __init__(self):
        self.sequence = 0  # one count for every node: each node's numbers still rise
        self.pending: dict[str, list[tuple[int, RunEnded, None]]] = {}

    def stopped(self, node: str, run: RunOnNode) -> None:
        self.sequence += 1
        ended = RunEnded(run.job_id, run.attempt, Failure("killed", "SIGTERM"), -15, node=node)
        self.pending.setdefault(node, []).append((self.sequence, ended, None))

    def unacknowledged(self, node: str, acks) -> list[tuple[int, RunEnded, None]]:
        seen = acks.get(node, ("", 0))[1]
        self.pending[node] = [e for e in self.pending.get(node, []) if e[0] > seen]
        return list(self.pending[node])
