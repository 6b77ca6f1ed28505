"""What one planning cycle sees of the cluster (``CycleView``), and the refusal it may recall from
the cycle before (``KeptRefusal``).

A cycle tries many jobs on the same nodes; the view holds each node's snapshots and room (the
most any job could get there) as this cycle's placements leave them, learnt once per cycle and
recalled across cycles while the node's snapshots do not change (``ClusterIndex.kept_rooms``).

A queue whose head cannot start puts the same head to the same candidate nodes cycle after
cycle, and on a busy cluster most refuse it by a room kept from before: at 25,000 GPUs that
walk was two fifths of a decision (BENCHMARKS.md). ``KeptRefusal`` remembers which nodes did;
the next cycle that tries the same request first skips those whose rooms are the same kept
objects and still hold, and walks only the others (a node that changed, or a new candidate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState, Placement
from hier_sched.core.placement import NodeRoom, PlacementConfig, PlacementRequest

__all__ = ["CycleView", "KeptRefusal"]


@dataclass(frozen=True, slots=True)
class KeptRefusal:
    """A request that candidate rows refused by their kept rooms alone (each room rules it out
    before any GPU is looked at), as the first job a cycle tried and could not start."""

    req: PlacementRequest
    cfg: PlacementConfig
    rooms: dict[int, NodeRoom]  # row -> its kept room that rules the request out (the index's own object)
    since_s: float  # the rooms hold from the latest of their measurements ...
    grace_since_s: float  # ... until the first of their GPUs in grace leaves it (``NodeRoom.holds_at``)


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


    def refused_before(self, req: PlacementRequest, cfg: PlacementConfig, now_s: float) -> Mapping[int, NodeRoom]:
        """For the first job this cycle tries: the rows that refused ``req`` in the last cycle by
        their kept rooms alone (``keep_refusal``) and must again, their rooms the same objects and
        holding at ``now_s``; those rooms are this cycle's, as ``recall`` would find them. Not for a
        shell that builds snapshots on demand: it learns of a change only as it builds them."""
        kept = self.cluster.kept_refusal
        if kept is None or kept.cfg is not cfg or kept.req != req:
            return {}
        # (``holds_at`` of every room: the clock minus the earliest grace is the largest of the differences)
        if now_s < kept.since_s or now_s - kept.grace_since_s >= cfg.launch_grace_s:
            return {}
        rooms = self.cluster.kept_rooms(cfg)
        same = {row: room for row, room in kept.rooms.items() if rooms.get(row) is room}
        self.met.update(same)
        self.known.update(same)
        return same

    def keep_refusal(self, req: PlacementRequest, cfg: PlacementConfig, rows: list[int],
                     refused: Mapping[int, NodeRoom], walked: list[int], need_free: float | None,
                     collocate: bool) -> None:
        """The first job this cycle tried was refused on each of ``rows``: ``refused`` by rooms
        recalled as ruling it out (``refused_before``), the ``walked`` others one by one. The rows
        whose rooms, kept across cycles, rule it out alone are kept for the next cycle."""
        cluster = self.cluster
        kept, known, k = cluster.kept_rooms(cfg), self.known, req.gpus
        rooms = {row: refused[row] for row in rows if row in refused}
        since_s, grace_since_s = (cluster.kept_refusal.since_s, cluster.kept_refusal.grace_since_s) if rooms \
            else (0.0, math.inf)  # (the carried rooms': a bound as safe for those among them still kept)
        for row in walked:
            room = known.get(row)
            if room is not None and kept.get(row) is room and not room.may_fit(k, need_free, collocate):
                rooms[row] = room
                since_s, grace_since_s = max(since_s, room.at_s), min(grace_since_s, room.grace_since_s)
        cluster.kept_refusal = KeptRefusal(req, cfg, rooms, since_s, grace_since_s) if rooms else None
