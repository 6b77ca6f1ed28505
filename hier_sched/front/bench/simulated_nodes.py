"""Simulated nodes for ``hier-sched bench control-plane``: many per process, speaking the node protocol.

The global queue reaches them through ``RayNodeSet``'s ``hosts``: one ``SimulatedNodes`` actor
answers for many nodes, each call naming its node first, and ``exchange_many`` answers for all
its nodes in one call. Each node answers with the real messages (``NodeReport``, ``LaunchReply``)
of the sizes a real node sends: a ``GpuState`` per GPU with its residents and their attempts, its
post-launch time and reserved memory, checks every order with the core's ``verify_placement``
as a real node does, numbers its run events and keeps them until the queue acknowledges them,
and answers "nothing changed" when its snapshot and runs are still the version the queue holds.
What it does not do is run anything: a run holds the memory its order reserved and ends, successful,
once its spec's emulated ``duration_s`` has passed on the queue's clock.

A node named in ``hung`` answers every call but ``exchange``, which it never answers; one named in
``stuck_starting`` answers until an ``exchange`` brings it launch orders, which never returns (the
tests of a hung node; ``tests/ray_clusters/test_node_set.py``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport, RunOnNode
from hier_sched.core.events import RunEnded
from hier_sched.core.gpu import GpuState, Placement, Risk
from hier_sched.core.gpu_types import GPU_TYPES
from hier_sched.core.placement import verify_placement
from hier_sched.core.presets import preset

__all__ = ["SimulatedNodes"]


@dataclass(slots=True)
class _Run:
    attempt: int
    placement: Placement
    started_s: float
    ends_s: float


@dataclass(slots=True)
class _Node:
    name: str
    gpus: int
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    runs: dict[str, _Run] = field(default_factory=dict)
    last_launch_s: dict[int, float] = field(default_factory=dict)
    outbox: list[tuple[int, RunEnded, None]] = field(default_factory=list)
    seq: int = 0
    version: int = 0
    reported: tuple | None = None


@ray.remote(num_cpus=0, max_concurrency=4)
class SimulatedNodes:
    def __init__(self, names: list[str], *, gpus: int = 8, gpu_type: str = "A100-40GB", time_scale: float = 1.0,
                 policy: str = "magm", hung: list[str] = (), stuck_starting: list[str] = ()):
        self.nodes = {n: _Node(n, gpus) for n in names}
        self.gpu_type = gpu_type
        self.total_mib = GPU_TYPES[gpu_type].memory_mib
        self.time_scale = time_scale
        self.config = preset(policy).placement
        self.hung = set(hung)
        self.stuck_starting = set(stuck_starting)
        self.launches: Counter[str] = Counter()  # job -> launch orders started (a job run twice shows 2)
        self.lock = threading.Lock()

    def _now(self) -> float:
        return time.time() / self.time_scale  # the queue's clock (``QueueService._now``)

    # ------------------------------------------------------------------ the node protocol
    def exchange_many(self, asks: dict[str, tuple[int, str, int, list[LaunchOrder]]]) -> dict[str, NodeReport]:
        """Each asked node's report, after it started the launch orders the ask carried: ``asks``
        maps a node to (the last event it logged, the incarnation that numbered it, the version
        of the picture it holds, its orders)."""
        if self.hung & asks.keys() or any(asks[n][3] for n in self.stuck_starting & asks.keys()):
            threading.Event().wait()  # never answers
        replies = {name: [self.launch(name, order) for order in ask[3]] for name, ask in asks.items()}
        with self.lock:
            now = self._now()
            return {name: replace(self._exchange(self.nodes[name], now, *ask[:3]), launched=replies[name])
                    for name, ask in asks.items()}

    def _exchange(self, node: _Node, now: float, ack: int, incarnation: str, version: int) -> NodeReport:
        if incarnation == node.incarnation:
            node.outbox = [e for e in node.outbox if e[0] > ack]
        for job_id, run in list(node.runs.items()):
            if run.ends_s <= now:
                del node.runs[job_id]
                node.seq += 1
                node.outbox.append((node.seq, RunEnded(job_id, run.attempt, None, 0, run.placement.reserved_mib), None))
        picture = (self._snapshot(node), [RunOnNode(j, r.attempt, r.placement) for j, r in node.runs.items()])
        if picture != node.reported:
            node.reported = picture
            node.version += 1
        if incarnation == node.incarnation and version == node.version:
            return NodeReport(node.name, now, None, node.incarnation, list(node.outbox), None, node.version)
        return NodeReport(node.name, now, picture[0], node.incarnation, list(node.outbox), picture[1], node.version)

    def _snapshot(self, node: _Node) -> list[GpuState]:
        states = []
        for i in range(node.gpus):
            residents = [(j, r) for j, r in node.runs.items() if i in r.placement.gpus]
            used = sum(r.placement.reserved_mib for _, r in residents)
            states.append(GpuState(node.name, i, self.total_mib, used, self.gpu_type, f"GPU-{node.name}-{i}",
                                   Risk(0.3 * len(residents), 0.2 * len(residents), 0.1 * len(residents)),
                                   90.0 + 100.0 * len(residents), tuple(j for j, _ in residents),
                                   last_launch_s=node.last_launch_s.get(i),
                                   resident_attempts=tuple(r.attempt for _, r in residents)))
        return states

    def launch(self, name: str, order: LaunchOrder) -> LaunchReply:
        with self.lock:
            node, now = self.nodes[name], self._now()
            running = node.runs.get(order.job_id)
            if running is not None:
                return LaunchReply(running.attempt == order.launch.attempt, f"{order.job_id} already runs on {name}")
            placement = order.placement
            problem = verify_placement(order.launch.request, self._snapshot(node), placement.gpus, self.config, now)
            if problem is not None:
                return LaunchReply(False, problem)
            emulation = order.spec.emulation
            duration = emulation.duration_s if emulation is not None else 0.0
            node.runs[order.job_id] = _Run(order.launch.attempt, placement, now, now + duration)
            for i in placement.gpus:
                node.last_launch_s[i] = now
            self.launches[order.job_id] += 1
            return LaunchReply(True, placement.reason)

    def stop(self, name: str, job_id: str, attempt: int, kill_after_s: float) -> bool:
        with self.lock:
            run = self.nodes[name].runs.get(job_id)
            if run is None or run.attempt != attempt:
                return False
            run.ends_s = self._now()  # ends at its node's next exchange
            return True

    def signal_checkpoint(self, name: str, job_id: str, attempt: int) -> bool:
        return False  # nothing runs that could checkpoint

    def summary(self, name: str) -> dict[str, Any]:
        with self.lock:
            node = self.nodes[name]
            return {"node": name, "gpu_type": self.gpu_type, "backend": "simulated", "gpus": node.gpus,
                    "running": sorted(node.runs)}

    def gpu_totals(self, name: str) -> list[float]:
        return [self.total_mib] * self.nodes[name].gpus

    def gpu_types(self, name: str) -> list[str]:
        return [self.gpu_type] * self.nodes[name].gpus

    def address(self, name: str) -> str:
        return "127.0.0.1"

    # ------------------------------------------------------------------ what the benchmark reads
    def launch_counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.launches)
