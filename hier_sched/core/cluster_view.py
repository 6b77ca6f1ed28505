"""The cluster as the planner sees it: per-node GPU snapshots and the order to try nodes in.

``ClusterIndex`` keeps one row per node (idle GPUs, free memory of each GPU) in numpy arrays, updated one node at a time. ``candidates`` filters the nodes that can
possibly take a request (enough idle GPUs, or enough GPUs with the free memory the gate asks
for) and ranks them: best-fit least free memory first, first-fit/exclusive by position, the others
(MAGM, round-robin, LUG) most free memory first — LUG's lowest-SMACT choice is made among a
node's GPUs, on its snapshot. Node ranks use only what both shells keep current at no cost (free
memory, idle GPUs), so the simulator at 100,000 jobs and the live queue rank nodes alike. The live
global queue (a handful of nodes) and the simulator (thousands) use this same index;
``place_on_node`` then makes the exact decision on the first candidates.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

import numpy as np

from hier_sched.core.gpu import GpuState, SharingMode
from hier_sched.core.placement import NodeRoom, PlacementConfig, PlacementRequest, memory_requirement

__all__ = ["ClusterIndex"]


class ClusterIndex:
    """Per-node summaries for ranking nodes; snapshots are built lazily per node."""

    def __init__(self, node_gpus: Sequence[tuple[str, int]], snapshot: Callable[[str], list[GpuState]]):
        """``node_gpus``: (node name, GPU count) in cluster order; ``snapshot(node)`` builds the
        current ``GpuState`` list of one node (called only for candidate nodes)."""
        self.names = [n for n, _ in node_gpus]
        self.pos = {n: i for i, n in enumerate(self.names)}
        width = max((g for _, g in node_gpus), default=1)
        self.free = np.full((len(self.names), width), -np.inf)
        for i, (_, g) in enumerate(node_gpus):
            self.free[i, :g] = 0.0
        self.idle = np.zeros(len(self.names), dtype=np.int64)
        # Each row of ``free`` sorted, smallest first, but for the rows in ``_stale``: a shell updates
        # GPUs one at a time, many per planning cycle, and the cycle needs them sorted only once.
        self._free_asc = np.sort(self.free, axis=1)
        self._stale: set[int] = set()
        self._snapshot = snapshot
        self._rankings: dict[tuple[int, bool | None, bool], tuple[np.ndarray, int, list[float]]] = {}  # (cache)
        # The planner's memo of each node's room (``NodeRoom``, found by ``assess_node``), per row,
        # kept while the node's snapshots stay the same: a shell that replaces a node's snapshot
        # objects says so (``update``, ``update_gpu``, ``remove``, ``changed``) — one that builds
        # them lazily, by the time ``gpus`` returns them — so a cycle tells the nodes that changed
        # in numpy (comparing every GPU's snapshot object was a sixth of a decision). ``room_idle``
        # and ``room_free`` (``NodeRoom.idle`` and ``open_free`` padded with -inf) also let a
        # cycle filter its candidates on the rooms without converting them (``room_arrays``). A
        # room holds while no GPU left out for its post-launch grace left it (``NodeRoom.holds_at``):
        # the earliest such launch is kept (``_room_grace_from``, +inf without). The rooms
        # remembered since they were last read wait in ``_unwritten`` (row -> room; those kept for
        # later cycles also in ``_unkept``) and are written in one go: a cycle remembers ~20, and
        # one numpy write each cost more than the filtering they serve.
        self._room_idle = np.zeros(len(self.names), dtype=np.int64)
        self._room_free = np.full((len(self.names), width), -np.inf)
        self._room_kept = np.zeros(len(self.names), dtype=bool)  # measured on the row's current snapshots
        self._room_at = np.zeros(len(self.names))
        self._room_grace_from = np.full(len(self.names), np.inf)
        self._room_cfg: PlacementConfig | None = None  # the rooms hold for this configuration only
        self._unwritten: dict[int, NodeRoom] = {}
        self._unkept: dict[int, NodeRoom] = {}
        self.gpu_total_mib = 0.0
        self.sharing = SharingMode.MPS  # how the cluster's GPUs are shared (one mode per cluster)

    @classmethod
    def from_snapshots(cls, nodes: dict[str, Sequence[GpuState]]) -> "ClusterIndex":
        index = cls([(n, len(g)) for n, g in nodes.items()], lambda n: list(nodes[n]))
        for name, gpus in nodes.items():
            index.update(name, gpus)
        return index

    def update(self, node: str, gpus: Sequence[GpuState]) -> None:
        i = self.pos[node]
        row = self.free[i]
        self._rankings.clear()
        for j, g in enumerate(gpus):
            row[j] = g.memory_free_mib
            self.gpu_total_mib = max(self.gpu_total_mib, g.memory_total_mib)
            self.sharing = g.sharing
        self.idle[i] = sum(1 for g in gpus if g.idle)
        self._stale.add(i)
        self._changed(i)

    def update_gpu(self, node: str, gpu: int, free_mib: float, idle_delta: int = 0) -> None:
        """Cheap update of one GPU's free memory (and the node's idle count)."""
        i = self.pos[node]
        self.free[i, gpu] = free_mib
        self._rankings.clear()
        if idle_delta:
            self.idle[i] += idle_delta
        self._stale.add(i)
        self._changed(i)

    def remove(self, node: str) -> None:
        """The node is gone: it can hold nothing from now on (its row stays, empty)."""
        i = self.pos[node]
        self.free[i, :] = -np.inf
        self._rankings.clear()
        self.idle[i] = 0
        self._stale.add(i)
        self._changed(i)

    def changed(self, node: str) -> None:
        """The node's snapshot objects were replaced (``gpus`` returns new ones): a room measured
        on the old ones is no longer kept."""
        self._changed(self.pos[node])

    def _changed(self, row: int) -> None:
        self._room_kept[row] = False
        self._unkept.pop(row, None)

    def remember_room(self, row: int, cfg: PlacementConfig, room: NodeRoom, kept: bool = True) -> None:
        """Keep ``room``, measured on row ``row``'s snapshots under ``cfg``: for this cycle's
        ``room_arrays``, and while the node does not change for later cycles (``recallable``)
        unless not ``kept`` (it was measured on snapshots the cycle itself changed)."""
        if cfg is not self._room_cfg:  # the rooms kept so far hold for another configuration
            self._room_kept[:] = False
            self._unkept.clear()
            self._room_cfg = cfg
        self._unwritten[row] = room
        if kept:
            self._unkept[row] = room
        else:
            self._changed(row)

    def room_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row the remembered room's ``idle`` and its ``open_free`` padded with -inf (rows
        without a room: 0 and -inf)."""
        if self._unwritten:
            rows, rooms = list(self._unwritten), list(self._unwritten.values())
            self._unwritten.clear()
            width = self._room_free.shape[1]
            self._room_idle[rows] = [r.idle for r in rooms]
            self._room_free[rows] = [r.open_free + (-math.inf,) * (width - len(r.open_free)) for r in rooms]
        return self._room_idle, self._room_free

    def recallable(self, cfg: PlacementConfig, now_s: float) -> np.ndarray:
        """Per row whether the room kept for it still holds at ``now_s`` under ``cfg`` as long as
        the node does not change (``room_kept``): ``NodeRoom.holds_at`` for every row at once."""
        if cfg is not self._room_cfg:
            return np.zeros(len(self.names), dtype=bool)
        if self._unkept:
            rows, rooms = list(self._unkept), list(self._unkept.values())
            self._unkept.clear()
            self._room_kept[rows] = True
            self._room_at[rows] = [r.at_s for r in rooms]
            self._room_grace_from[rows] = [min(r.in_grace, default=math.inf) for r in rooms]
        # (``now - t < grace`` for every launch t in grace: the earliest decides, as the
        # subtraction is monotone in t, rounding included)
        return (self._room_at <= now_s) & (now_s - self._room_grace_from < cfg.launch_grace_s)

    @property
    def room_kept(self) -> np.ndarray:
        """Per row whether a room measured on its current snapshots is kept: current once
        ``recallable`` was called and, from a shell that builds snapshots lazily (and reports
        their changes then), once ``gpus`` returned the row's."""
        return self._room_kept

    def gpus(self, node: str) -> list[GpuState]:
        return self._snapshot(node)

    def candidates(self, req: PlacementRequest, cfg: PlacementConfig, limit: int | None = None) -> list[str]:
        """Nodes that may hold ``req``, best first under the policy."""
        return [self.names[i] for i in self.candidate_rows(req, cfg, limit).tolist()]

    def candidate_rows(self, req: PlacementRequest, cfg: PlacementConfig, limit: int | None = None) -> np.ndarray:
        """``candidates`` as row numbers (positions in ``names``)."""
        need_free, _ = memory_requirement(req, cfg)
        need_free += cfg.free_reserve_mib
        k = req.gpus
        exclusive = req.exclusive or cfg.policy == "exclusive"
        gated = cfg.policy != "round-robin" or req.min_free_mib is not None
        # by position (first-fit, exclusive), least room first (best-fit) or the most room (magm,
        # round-robin, lug: LUG then picks GPUs by SMACT); nodes with k idle GPUs first when asked
        by_room = None if exclusive or cfg.policy == "first-fit" else cfg.policy != "best-fit"
        idle_first = cfg.exclusive_first or exclusive
        ranked, idle, rest_room = self._ranking(k, by_room, idle_first)
        if idle_first and (exclusive or (gated and by_room is not None)):
            # The nodes with k idle GPUs come first and all pass; the others pass when their k-th
            # GPU has ``need_free``, and they are ranked by that very memory, so those that pass
            # are a prefix (most room first) or a suffix (least room first) of them: found by
            # bisection instead of a mask over every node (a cycle asks this for every job tried).
            if exclusive:
                ranked = ranked[:idle]
            elif by_room:  # ``rest_room`` is minus the k-th GPU's free memory, ascending
                ranked = ranked[:idle + bisect_right(rest_room, -need_free)]
            else:  # ``rest_room`` is the k-th GPU's free memory, ascending
                ranked = np.concatenate((ranked[:idle], ranked[idle + bisect_left(rest_room, need_free):]))
        else:
            can_idle = self.idle >= k
            if exclusive:
                mask = can_idle
            else:
                kth = self._kth(k)
                mask = can_idle | (kth >= need_free) if gated else can_idle | (kth > -np.inf)
            ranked = ranked[mask[ranked]]
        return ranked if limit is None else ranked[:limit]

    def _kth(self, k: int) -> np.ndarray:
        """Per node the free memory of its k-th freest GPU."""
        if self._stale:
            # Sorting every row costs ~0.03 us a row (8 GPUs), picking the stale rows out and back
            # in ~6 us whatever their number: small clusters, or many stale rows, sort every row.
            if len(self.names) <= 200 or len(self._stale) * 8 >= len(self.names):
                self._free_asc = np.sort(self.free, axis=1)
            else:
                rows = list(self._stale)
                self._free_asc[rows] = np.sort(self.free[rows], axis=1)
            self._stale.clear()
        width = self.free.shape[1]
        return self._free_asc[:, width - min(k, width)]

    def _ranking(self, k: int, most_room: bool | None, idle_first: bool) -> tuple[np.ndarray, int, list[float]]:
        """Every row in the order ``candidate_rows`` offers them: with ``idle_first`` the nodes with
        ``k`` idle GPUs first, then by ``_kth(k)`` (most first if ``most_room``, least if False, not
        at all if None), ties by position. Also how many rows lead with ``k`` idle GPUs (0 without
        ``idle_first``) and, when ranked by room, the sort key of the rows after them, ascending
        (``-_kth(k)`` for most room first, ``_kth(k)`` for least). Kept until the next update: the
        jobs of one cycle (and the cycles between two updates) ask for the same few."""
        key = (k, most_room, idle_first)
        ranking = self._rankings.get(key)
        if ranking is None:
            # one stable sort: the rows without k idle GPUs (``later``) after, then by room; ties
            # keep their position
            later = self.idle < k if idle_first else None
            if most_room is None:
                ranked = np.arange(len(self.names)) if later is None else np.argsort(later, kind="stable")
            else:
                room = -self._kth(k) if most_room else self._kth(k)
                ranked = np.argsort(room, kind="stable") if later is None else np.lexsort((room, later))
            idle = 0 if later is None else len(self.names) - int(np.count_nonzero(later))
            rest_room = room[ranked[idle:]].tolist() if idle_first and most_room is not None else []
            ranking = self._rankings[key] = (ranked, idle, rest_room)
        return ranking
