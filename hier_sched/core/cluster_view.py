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

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hier_sched.core.gpu import GpuState, Placement, SharingMode, run_shown
from hier_sched.core.gpu_types import GPU_TYPES
from hier_sched.core.placement import NodeRoom, PlacementConfig, PlacementRequest, memory_requirement

__all__ = ["ClusterIndex"]


class ClusterIndex:
    """Per-node summaries for ranking nodes; snapshots are built lazily per node."""

    def __init__(self, node_gpus: Sequence[tuple[str, int]], snapshot: Callable[[str], list[GpuState]],
                 residents: Callable[[str], Mapping[int, tuple[tuple[str, int], ...]]] | None = None,
                 gpu_types: Sequence[str] | None = None):
        """``node_gpus``: (node name, GPU count) in cluster order; ``snapshot(node)`` builds the
        current ``GpuState`` list of one node (called only for candidate nodes); ``residents(node)``
        (optional, when the shell has it cheaper than a snapshot): GPU index -> the runs resident
        there, (job id, attempt), as the snapshots show them (``GpuState.runs``); ``gpu_types``:
        each node's GPU type, in the order of ``node_gpus`` (else learnt from its snapshots)."""
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
        self._residents = residents or (lambda node: {g.index: g.runs() for g in snapshot(node)})
        self._rankings: dict[tuple, tuple] = {}  # (cache: ``_ranking``'s and ``_leaders``')
        # The planner's memo: per row the room (``NodeRoom``, found by ``assess_node``) measured on
        # the row's current snapshots under ``_room_cfg``. A shell that replaces a node's snapshot
        # objects says so (``update``, ``update_gpu``, ``remove``, ``changed``; one that builds them
        # lazily, by the time ``gpus`` returns them), which drops it: a cycle knows the nodes that
        # did not change without comparing their snapshots GPU by GPU (a sixth of a decision).
        self._rooms: dict[int, NodeRoom] = {}
        self._room_cfg: PlacementConfig | None = None
        # The scheduler's own launches that a node's snapshots do not show yet (``assume``), per
        # node; dropped with the snapshots they were placed on when the shell replaces them.
        self._assumed: dict[str, _Assumed] = {}
        self.gpu_total_mib = 0.0
        self.sharing = SharingMode.MPS  # how the cluster's GPUs are shared (one mode per cluster)
        # Each row's GPU type, as a code into ``type_names`` (first seen, first): the planner asks
        # for one type's rows at a time on a cluster of several (``candidate_rows``).
        self.type_names: list[str] = []
        self._type_code = np.zeros(len(self.names), dtype=np.int64)
        self.type_capacity: dict[str, float] = {}  # type -> its largest GPU's memory seen
        for i, name in enumerate(gpu_types or ()):
            self._set_type(i, name)

    def _set_type(self, row: int, name: str) -> None:
        if name not in self.type_names:
            self.type_names.append(name)
            self.type_capacity[name] = float(GPU_TYPES[name].memory_mib) if name in GPU_TYPES else 0.0
        code = self.type_names.index(name)
        if self._type_code[row] != code:
            self._type_code[row] = code
            self._rankings.clear()

    def type_of(self, row: int) -> str:
        return self.type_names[self._type_code[row]] if self.type_names else ""

    def idle_by_type(self) -> dict[str, int]:
        """GPU type -> idle GPUs on its nodes."""
        counts = np.bincount(self._type_code, weights=self.idle, minlength=len(self.type_names))
        return {name: int(counts[i]) for i, name in enumerate(self.type_names)}

    @classmethod
    def from_snapshots(cls, nodes: dict[str, Sequence[GpuState]]) -> "ClusterIndex":
        index = cls([(n, len(g)) for n, g in nodes.items()], lambda n: list(nodes[n]))
        for name, gpus in nodes.items():
            index.update(name, gpus)
        return index

    def update(self, node: str, gpus: Sequence[GpuState]) -> None:
        self._unassume(node)
        i = self.pos[node]
        row = self.free[i]
        self._rankings.clear()
        for j, g in enumerate(gpus):
            row[j] = g.memory_free_mib
            self.gpu_total_mib = max(self.gpu_total_mib, g.memory_total_mib)
            self.sharing = g.sharing
        if gpus:
            self._set_type(i, gpus[0].gpu_type)
            kind = gpus[0].gpu_type
            self.type_capacity[kind] = max(self.type_capacity[kind], max(g.memory_total_mib for g in gpus))
        self.idle[i] = sum(1 for g in gpus if g.idle)
        self._stale.add(i)
        self._rooms.pop(i, None)

    def update_gpu(self, node: str, gpu: int, free_mib: float, idle_delta: int = 0) -> None:
        """Cheap update of one GPU's free memory (and the node's idle count)."""
        self._unassume(node)
        i = self.pos[node]
        self.free[i, gpu] = free_mib
        self._rankings.clear()
        if idle_delta:
            self.idle[i] += idle_delta
        self._stale.add(i)
        self._rooms.pop(i, None)

    def remove(self, node: str) -> None:
        """The node is gone: it can hold nothing from now on (its row stays, empty)."""
        self._unassume(node)
        i = self.pos[node]
        self.free[i, :] = -np.inf
        self._rankings.clear()
        self.idle[i] = 0
        self._stale.add(i)
        self._rooms.pop(i, None)

    def forget_assumed(self, runs: set[tuple[str, int]]) -> None:
        """Drop what ``assume`` placed for any (job, attempt) not in ``runs`` (it ended, or was
        declined): its node's row is the shell's again, the others assumed there are placed anew."""
        for node, assumed in list(self._assumed.items()):
            if not assumed.runs <= runs:
                self._unassume(node)

    def _unassume(self, node: str) -> None:
        """The shell replaces the node's snapshots: what ``assume`` placed on them goes, and the
        node's row is the shell's again."""
        assumed = self._assumed.pop(node, None)
        if assumed is not None:
            i = self.pos[node]
            self.free[i] = assumed.free
            self.idle[i] = assumed.idle
            self._rankings.clear()
            self._stale.add(i)

    def changed(self, node: str) -> None:
        """The node's snapshot objects were replaced (``gpus`` returns new ones): a room measured
        on the old ones is no longer kept."""
        self._unassume(node)
        self._rooms.pop(self.pos[node], None)

    def remember_room(self, row: int, cfg: PlacementConfig, room: NodeRoom) -> None:
        """Keep ``room``, measured on row ``row``'s current snapshots under ``cfg``, until the
        node changes."""
        if cfg is not self._room_cfg:  # the rooms kept so far hold for another configuration
            self._rooms.clear()
            self._room_cfg = cfg
        self._rooms[row] = room

    def kept_rooms(self, cfg: PlacementConfig) -> Mapping[int, NodeRoom]:
        """Row -> the room kept for it under ``cfg`` (``remember_room``), while the node did not
        change: current, from a shell that builds snapshots lazily, once ``gpus`` returned the
        row's. Whether a room still holds later is ``NodeRoom.holds_at``."""
        return self._rooms if cfg is self._room_cfg else {}

    def gpus(self, node: str) -> list[GpuState]:
        assumed = self._assumed.get(node)
        return list(assumed.gpus) if assumed is not None else self._snapshot(node)

    def shows(self, p: Placement, attempt: int) -> bool:
        """Whether the node's snapshots (the shell's, not ``assume``'s) show run ``attempt`` of
        ``p``'s job resident on every GPU of ``p`` (``run_shown``)."""
        residents = self._residents(p.node)
        return all(run_shown(residents.get(i, ()), p.job_id, attempt) for i in p.gpus)

    def assume(self, p: Placement, attempt: int, launched_s: float) -> None:
        """Count placement ``p`` of a run launched at ``launched_s`` on its GPUs, where the
        node's snapshots do not show it yet (Kubernetes' "assume"): its reservation is taken
        and the GPUs are in their post-launch grace, as if the node had reported it. Once per
        run and set of snapshots: the shell's next snapshots of the node drop it (``update``,
        ``update_gpu``, ``remove``, ``changed``) and the scheduler assumes again until they
        show the run."""
        i = self.pos[p.node]
        assumed = self._assumed.get(p.node)
        if assumed is None:
            assumed = self._assumed[p.node] = _Assumed(self._snapshot(p.node), set(), self.free[i].copy(),
                                                       int(self.idle[i]))
        if (p.job_id, attempt) in assumed.runs:
            return
        assumed.runs.add((p.job_id, attempt))
        gpus = assumed.gpus
        for j, g in enumerate(gpus):
            if g.index in p.gpus and not g.shows_run(p.job_id, attempt):
                if not g.resident_jobs:
                    self.idle[i] -= 1
                gpus[j] = g.with_job(p.job_id, p.reserved_mib, launched_s, attempt)
                self.free[i, j] -= p.reserved_mib
        self._rankings.clear()
        self._stale.add(i)
        self._rooms.pop(i, None)

    def candidates(self, req: PlacementRequest, cfg: PlacementConfig, limit: int | None = None,
                   gpu_type: str | None = None) -> list[str]:
        """Nodes that may hold ``req``, best first under the policy."""
        return [self.names[i] for i in self.candidate_rows(req, cfg, limit, gpu_type)]

    def candidate_rows(self, req: PlacementRequest, cfg: PlacementConfig, limit: int | None = None,
                       gpu_type: str | None = None) -> list[int]:
        """``candidates`` as row numbers (positions in ``names``); a list, as the planner walks them
        one by one (numpy pays off on all the rows, not on the few dozen candidates). With
        ``gpu_type``: only the nodes of that GPU type (none when the cluster has no such node)."""
        if gpu_type is not None and gpu_type not in self.type_names:
            return []
        need_free, _ = memory_requirement(req, cfg)
        need_free += cfg.free_reserve_mib
        k = req.gpus
        pol = cfg.rules
        exclusive = req.exclusive or not pol.collocates
        gated = pol.memory_gate or req.min_free_mib is not None
        # by position, most room first or least room first (the policy's node order; LUG then
        # picks GPUs by SMACT); nodes with k idle GPUs first when asked
        by_room = None if exclusive or pol.node_order == "position" else pol.node_order == "most_room"
        idle_first = cfg.exclusive_first or exclusive
        if limit and idle_first and gated and by_room and not exclusive:
            # The planner's case (most room first, gated, a few dozen nodes tried): only the best
            # ``limit`` nodes of each part of the ranking are ever read, found without sorting all.
            lead, rest, rest_room = self._leaders(k, limit, gpu_type)
            return (lead + rest[:bisect_right(rest_room, -need_free)])[:limit]
        ranked, idle, rest_room = self._ranking(k, by_room, idle_first, gpu_type)
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
                ranked = ranked[:idle] + ranked[idle + bisect_left(rest_room, need_free):]
        else:
            can_idle = self.idle >= k
            if exclusive:
                mask = can_idle
            else:
                kth = self._kth(k)
                mask = can_idle | (kth >= need_free) if gated else can_idle | (kth > -np.inf)
            passes = mask.tolist()
            ranked = [row for row in ranked if passes[row]]
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

    def _leaders(self, k: int, limit: int, gpu_type: str | None) -> tuple[list[int], list[int], list[float]]:
        """The first ``limit`` rows of ``_ranking(k, True, True, gpu_type)``'s two parts: the rows
        with ``k`` idle GPUs and the others, each most room first (ties by position), with the
        others' sort keys (minus the k-th GPU's free memory, ascending). The same rows in the same
        order as ``_ranking``'s, in time linear in the rows (a partial selection, not a sort of
        them all): on a large cluster the ranking is rebuilt after every update, i.e. every cycle.
        Kept until the next update, as ``_ranking``'s are."""
        key = (k, limit, gpu_type)
        leaders = self._rankings.get(key)
        if leaders is None:
            room = -self._kth(k)
            in_type = None if gpu_type is None else self._type_code == self.type_names.index(gpu_type)
            lead_mask = self.idle >= k
            lead = lead_mask if in_type is None else lead_mask & in_type
            rest = ~lead_mask if in_type is None else ~lead_mask & in_type
            lead_rows, _ = _best(np.flatnonzero(lead), room, limit)
            rest_rows, rest_room = _best(np.flatnonzero(rest), room, limit)
            leaders = self._rankings[key] = (lead_rows.tolist(), rest_rows.tolist(), rest_room.tolist())
        return leaders

    def _ranking(self, k: int, most_room: bool | None, idle_first: bool,
                 gpu_type: str | None = None) -> tuple[list[int], int, list[float]]:
        """Every row (of ``gpu_type``, when given) in the order ``candidate_rows`` offers them:
        with ``idle_first`` the nodes with ``k`` idle GPUs first, then by ``_kth(k)`` (most first
        if ``most_room``, least if False, not at all if None), ties by position. Also how many rows
        lead with ``k`` idle GPUs (0 without ``idle_first``) and, when ranked by room, the sort key
        of the rows after them, ascending (``-_kth(k)`` for most room first, ``_kth(k)`` for
        least). Kept until the next update: the jobs of one cycle (and the cycles between two
        updates) ask for the same few."""
        key = (k, most_room, idle_first, gpu_type)
        ranking = self._rankings.get(key)
        if ranking is None:
            rows = None if gpu_type is None else np.flatnonzero(self._type_code == self.type_names.index(gpu_type))
            idle_now = self.idle if rows is None else self.idle[rows]
            # one stable sort: the rows without k idle GPUs (``later``) after, then by room; ties
            # keep their position
            later = idle_now < k if idle_first else None
            if most_room is None:
                ranked = np.arange(len(idle_now)) if later is None else np.argsort(later, kind="stable")
            else:
                kth = self._kth(k) if rows is None else self._kth(k)[rows]
                room = -kth if most_room else kth
                ranked = np.argsort(room, kind="stable") if later is None else np.lexsort((room, later))
            idle = 0 if later is None else len(idle_now) - int(np.count_nonzero(later))
            rest_room = room[ranked[idle:]].tolist() if idle_first and most_room is not None else []
            ranking = self._rankings[key] = ((ranked if rows is None else rows[ranked]).tolist(), idle, rest_room)
        return ranking


def _best(rows: np.ndarray, key: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``limit`` of ``rows`` (ascending) with the smallest ``key[row]``, in that order, ties by
    row, and their keys: what a stable sort of all of them would put first."""
    keys = key[rows]
    if len(rows) > limit:  # keep the ``limit`` smallest and every row that ties with the largest of them
        largest = keys[np.argpartition(keys, limit - 1)[:limit]].max()
        within = keys <= largest
        rows, keys = rows[within], keys[within]
    order = np.argsort(keys, kind="stable")[:limit]
    return rows[order], keys[order]


@dataclass(slots=True)
class _Assumed:
    """A node's snapshots with the scheduler's unreported runs placed on them (``assume``)."""

    gpus: list[GpuState]
    runs: set[tuple[str, int]]  # (job, attempt) placed
    free: np.ndarray  # the node's row as the shell left it
    idle: int
