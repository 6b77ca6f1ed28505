"""What one planning cycle sees of the cluster (``CycleView``): each node's snapshots and room
(the most any job could get there) as this cycle's placements leave them, learnt once per cycle
and recalled across cycles while the node's snapshots do not change (``ClusterIndex.kept_rooms``).
"""

from __future__ import annotations

from collections.abc import Mapping

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState, Placement
from hier_sched.core.placement import NodeRoom, PlacementConfig

__all__ = ["CycleView"]


class CycleView:
    """Snapshots of the nodes looked at this cycle, with this cycle's placements applied.

    It also knows, per node, the most any job could get there (``NodeRoom``), learnt the first
    time a job is tried on the node and forgotten when a placement or hold changes it: one
    cycle tries many jobs on the same nodes, and on a busy cluster most nodes refuse every one
    of them, so each is asked once per cycle, not once per job. A room an earlier cycle found
    on snapshots that have not changed since is recalled (``ClusterIndex.kept_rooms``)."""

    def __init__(self, cluster: ClusterIndex):
        self.cluster = cluster
        self._nodes: dict[str, list[GpuState]] = {}
        self.known: dict[int, NodeRoom] = {}  # row -> its room this cycle
        # The rows met this cycle: a row met has its room recalled then or it cannot be (a node
        # placed on or held this cycle counts as met: its room is not that of the shell's snapshots).
        self.met: set[int] = set()
        self._changed: set[int] = set()  # the rows whose snapshots this cycle changed
        self._kept: Mapping[int, NodeRoom] | None = None  # ``ClusterIndex.kept_rooms`` (one configuration per cycle)

    def gpus(self, node: str) -> list[GpuState]:
        gpus = self._nodes.get(node)
        if gpus is None:
            gpus = self._nodes[node] = self.cluster.gpus(node)
        return gpus

    def recall(self, row: int, cfg: PlacementConfig, now_s: float) -> NodeRoom | None:
        """For a row not met yet this cycle: the room kept for it if the node did not change since
        (its snapshots are got first: a shell that builds them lazily reports their changes then)
        and it still holds at ``now_s``; it is then this cycle's room of the node."""
        self.met.add(row)
        name = self.cluster.names[row]
        if name not in self._nodes:  # (``gpus``, inlined: every candidate of the head comes here)
            self._nodes[name] = self.cluster.gpus(name)
        if self._kept is None:
            self._kept = self.cluster.kept_rooms(cfg)
        room = self._kept.get(row)
        if room is not None and room.holds_at(now_s, cfg):
            self.known[row] = room
            return room
        return None

    def learn(self, row: int, room: NodeRoom, cfg: PlacementConfig) -> None:
        """The node's room, just measured on this cycle's snapshots: kept for this cycle, and for
        later ones if they are the shell's."""
        self.known[row] = room
        if row not in self._changed:
            self.cluster.remember_room(row, cfg, room)

    def _forget(self, node: str) -> None:
        row = self.cluster.pos[node]
        self._changed.add(row)
        self.met.add(row)  # (its kept room, if any, is not this cycle's)
        self.known.pop(row, None)  # every job may fit until it is learnt again

    def reserve(self, p: Placement, now_s: float) -> None:
        gpus = self.gpus(p.node)
        for i, g in enumerate(gpus):
            if g.index in p.gpus:
                gpus[i] = g.with_job(p.job_id, p.reserved_mib, now_s)
        self._forget(p.node)

    def hold(self, hold: tuple[tuple[str, tuple[int, ...]], ...], job_id: str, now_s: float) -> None:
        """Show the held GPUs as full for the rest of this cycle, so nothing else lands there."""
        for node, indices in hold:
            if node not in self.cluster.pos:
                continue
            gpus = self.gpus(node)
            for i, g in enumerate(gpus):
                if g.index in indices:
                    gpus[i] = g.with_job(f"held-for:{job_id}", max(g.memory_free_mib, 0.0), now_s)
            self._forget(node)
