"""The cluster as the planner sees it: per-node GPU snapshots, and the rows the order to try
nodes in is found from (``node_ranking``).

``ClusterIndex`` keeps one row per node (idle GPUs, free memory of each GPU) in numpy arrays,
updated one node at a time; closed nodes (drained) show no room. Node ranks use only what both
shells keep current at no cost (free memory, idle GPUs), so the simulator at 100,000 jobs and the
live queue rank nodes alike: both use this same index, and ``place_on_node`` then makes the exact
decision on the first candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hier_sched.core.gpu import GpuState, Placement, SharingMode, run_shown
from hier_sched.core.gpu_types import GPU_TYPES
from hier_sched.core.node_ranking import NodeRanking
from hier_sched.core.placement import NodeRoom, PlacementConfig

__all__ = ["ClusterIndex"]

# Rows changed (``_moved``) kept for the leaders to catch up on; past that they are ranked anew.
_MOVED_KEPT = 4096


class ClusterIndex(NodeRanking):
    """Per-node summaries for ranking nodes; snapshots are built lazily per node."""

    def __init__(self, node_gpus: Sequence[tuple[str, int]], snapshot: Callable[[str], list[GpuState]],
                 runs_on: Callable[[str, int], Iterable[tuple[str, int]]] | None = None,
                 gpu_types: Sequence[str] | None = None):
        """``node_gpus``: (node name, GPU count) in cluster order; ``snapshot(node)`` builds the
        current ``GpuState`` list of one node (called only for candidate nodes); ``runs_on(node, gpu)``
        (optional, when the shell has it cheaper than a snapshot): the runs resident on GPU index
        ``gpu``, (job id, attempt), as the snapshots show them (``GpuState.runs``); ``gpu_types``:
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
        self._runs_on = runs_on or (lambda node, gpu: next((g.runs() for g in snapshot(node) if g.index == gpu), ()))
        self._rankings: dict[tuple, tuple] = {}  # (cache: ``_ranking``'s and ``_leaders``')
        self._tops = {}  # (``_leaders``' parts, carried over the rows in ``_moved``)
        self._moved = []
        self._unread_moves = set()
        self._ascending = {}
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
        # Rows of closed nodes (``close``: drained), offered as empty: ``free`` and ``idle`` show
        # them with no room, and what the shell keeps telling of them waits here until they open.
        self._closed: dict[int, _Closed] = {}
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
            self._tops.clear()

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
        closed = self._closed.get(i)
        row = self.free[i] if closed is None else closed.free
        for j, g in enumerate(gpus):
            row[j] = g.memory_free_mib
            self.gpu_total_mib = max(self.gpu_total_mib, g.memory_total_mib)
            self.sharing = g.sharing
        if gpus:
            self._set_type(i, gpus[0].gpu_type)
            kind = gpus[0].gpu_type
            self.type_capacity[kind] = max(self.type_capacity[kind], max(g.memory_total_mib for g in gpus))
        idle = sum(1 for g in gpus if g.idle)
        if closed is None:
            self.idle[i] = idle
        else:
            closed.idle = idle
        self._reranked(i)

    def update_gpu(self, node: str, gpu: int, free_mib: float, idle_delta: int = 0) -> None:
        """Cheap update of one GPU's free memory (and the node's idle count)."""
        self._unassume(node)
        i = self.pos[node]
        closed = self._closed.get(i)
        if closed is not None:
            closed.free[gpu] = free_mib
            closed.idle += idle_delta
            return
        self.free[i, gpu] = free_mib
        if idle_delta:
            self.idle[i] += idle_delta
        self._reranked(i)

    def remove(self, node: str) -> None:
        """The node is gone: it can hold nothing from now on (its row stays, empty)."""
        self._unassume(node)
        i = self.pos[node]
        self.free[i, :] = -np.inf
        self.idle[i] = 0
        if (closed := self._closed.get(i)) is not None:
            closed.free[:] = -np.inf
            closed.idle = 0
        self._reranked(i)

    def forget_assumed(self, runs: set[tuple[str, int]]) -> None:
        """Drop what ``assume`` placed for any (job, attempt) not in ``runs`` (it ended, or was
        declined): its node's row is the shell's again, the others assumed there are placed anew."""
        for node, assumed in list(self._assumed.items()):
            if not assumed.runs <= runs:
                self._unassume(node)

    def _unassume(self, node: str) -> None:
        """The shell replaces the node's snapshots: what ``assume`` placed on them goes, and the
        node's row is the shell's again, as is its room (one kept was measured with the assumed runs)."""
        assumed = self._assumed.pop(node, None)
        if assumed is not None:
            i = self.pos[node]
            if (closed := self._closed.get(i)) is not None:
                closed.free[:] = assumed.free
                closed.idle = assumed.idle
                return
            self.free[i] = assumed.free
            self.idle[i] = assumed.idle
            self._reranked(i)

    def close(self, nodes: Collection[str]) -> None:
        """Offer none of ``nodes`` from now on (drained: ``drains``), and every other node again.
        A closed node's row shows no room and no idle GPU, so no ranking, hold or reclaim picks
        it; what its snapshots say is kept for the day it opens."""
        rows = {self.pos[n] for n in nodes if n in self.pos}
        if rows == self._closed.keys():
            return
        for i in rows - self._closed.keys():
            self._closed[i] = _Closed(self.free[i].copy(), int(self.idle[i]))
            self.free[i, :] = -np.inf
            self.idle[i] = 0
            self._reranked(i)
        for i in self._closed.keys() - rows:
            closed = self._closed.pop(i)
            self.free[i] = closed.free
            self.idle[i] = closed.idle
            self._reranked(i)

    def offers(self, node: str) -> bool:
        """Whether the node may take work: known, not closed, not lost."""
        i = self.pos.get(node)
        return i is not None and i not in self._closed and bool(self.free[i].max() > -np.inf)

    def _reranked(self, i: int) -> None:
        """Row ``i``'s room changed: rankings, its sorted row and its kept room are out of date."""
        self._moved_row(i)
        self._rooms.pop(i, None)

    def _moved_row(self, i: int) -> None:
        """Row ``i``'s free memory or idle GPUs changed: rankings and its sorted row are out of
        date, and the leaders kept across changes (``_tops``) take it in when next asked."""
        self._rankings.clear()
        self._stale.add(i)
        self._ascending.pop(i, None)
        if i in self._unread_moves:
            return
        if len(self._moved) >= _MOVED_KEPT:  # (ranking every row again then costs less than carrying)
            self._moved.clear()
            self._unread_moves.clear()
            self._tops.clear()
        self._moved.append(i)
        self._unread_moves.add(i)

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
        runs_on, node = self._runs_on, p.node
        return all(run_shown(runs_on(node, i), p.job_id, attempt) for i in p.gpus)

    def assume(self, p: Placement, attempt: int, launched_s: float) -> None:
        """Count placement ``p`` of a run launched at ``launched_s`` on its GPUs, where the
        node's snapshots do not show it yet (Kubernetes' "assume"): its reservation is taken
        and the GPUs are in their post-launch grace, as if the node had reported it. Once per
        run and set of snapshots: the shell's next snapshots of the node drop it (``update``,
        ``update_gpu``, ``remove``, ``changed``) and the scheduler assumes again until they
        show the run."""
        i = self.pos[p.node]
        if i in self._closed:
            return  # offered to nobody: counted again once the node opens (every plan assumes anew)
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
        self._reranked(i)

@dataclass(slots=True)
class _Assumed:
    """A node's snapshots with the scheduler's unreported runs placed on them (``assume``)."""

    gpus: list[GpuState]
    runs: set[tuple[str, int]]  # (job, attempt) placed
    free: np.ndarray  # the node's row as the shell left it
    idle: int


@dataclass(slots=True)
class _Closed:
    """A closed node's row as the shell keeps telling it (``ClusterIndex.close``)."""

    free: np.ndarray
    idle: int
