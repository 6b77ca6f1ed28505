"""A stand-in for the node actors behind ``QueueService``: no Ray, no processes."""

from __future__ import annotations

from global_queue.service import CallsOneAtATime
from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport, RunOnNode
from hier_sched.core.gpu import GpuState

GPU = 40536.0


class Nodes(CallsOneAtATime):
    """One node of two GPUs that launches what it is told and reports what it runs."""

    def __init__(self):
        self.names = ["n0"]
        self.runs: dict[str, RunOnNode] = {}
        self.orders: list[LaunchOrder] = []  # every launch order received, in order

    silent = False  # the node does not answer (restarting, or slow)

    def exchange_all(self, acks):
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
