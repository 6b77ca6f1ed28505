"""The order to try nodes in (``NodeRanking``), over ``ClusterIndex``'s rows.

``candidates`` filters the nodes that can possibly take a request (enough idle GPUs, or enough
GPUs with the free memory the gate asks for) and ranks them: best-fit least free memory first,
first-fit/exclusive by position, the others (MAGM, round-robin, LUG) most free memory first --
LUG's lowest-SMACT choice is made among a node's GPUs, on its snapshot. A ranking is kept until
the rows change (``ClusterIndex`` clears ``_rankings`` on every update), except the planner's
leading candidates (``_leaders``), which are carried over the rows that changed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from hier_sched.core.placement import PlacementConfig, PlacementRequest, memory_requirement

__all__ = ["NodeRanking"]


class NodeRanking:
    """Ranking of the rows of a ``ClusterIndex`` (its base): the arrays it reads are the index's."""

    names: list[str]
    free: np.ndarray  # row -> each GPU's free memory (-inf: no GPU there, or the node offers none)
    idle: np.ndarray  # row -> its idle GPUs
    type_names: list[str]
    _type_code: np.ndarray
    _free_asc: np.ndarray
    _stale: set[int]
    _rankings: dict[tuple, tuple]
    _tops: dict[tuple, "_Tops"]  # (k, limit, GPU type) -> the leaders' parts, carried over changes
    _moved: list[int]  # the rows whose room or idle GPUs changed, in turn (``_tops`` read it from their ``seen``)
    _unread_moves: set[int]  # rows listed in ``_moved`` since leaders last read it (listed once till then)
    _ascending: dict[int, list[float]]  # (cache: ``_row_ascending``'s)

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
        return self._free_asc[:, self._kth_column(k)]

    def _kth_column(self, k: int) -> int:
        """Where a row sorted smallest first holds its k-th freest GPU (its last, for k wider than it)."""
        width = self.free.shape[1]
        return width - min(k, width)

    def _row_ascending(self, row: int) -> list[float]:
        """Row ``row``'s free memory, smallest first, as Python floats: kept until the row moves
        (``_moved_row``), as the leaders of every GPU count ask it of the same few changed rows.
        Not ``_kth(k)[rows]``: that sorts every stale row, the whole matrix once a few hundred are;
        nor numpy on the changed rows: a numpy call costs a microsecond or more however small its
        array, and was two thirds of a carry (py-spy, 150,000 jobs on 3,125 nodes)."""
        asc = self._ascending.get(row)
        if asc is None:
            asc = self._ascending[row] = sorted(self.free[row].tolist())
        return asc

    def _leaders(self, k: int, limit: int, gpu_type: str | None) -> tuple[list[int], list[int], list[float]]:
        """The first ``limit`` rows of ``_ranking(k, True, True, gpu_type)``'s two parts: the rows
        with ``k`` idle GPUs and the others, each most room first (ties by position), with the
        others' sort keys (minus the k-th GPU's free memory, ascending). The same rows in the same
        order as ``_ranking``'s. A cluster's rows change every cycle, a few at a time, so the first
        ``2 * limit`` rows of each part are kept and carried over the rows that changed (``_carry``:
        time in those rows and the ones kept); they are found again among every row (a partial
        selection, not a sort of them all) only when the changes leave fewer than ``limit``."""
        key = (k, limit, gpu_type)
        leaders = self._rankings.get(key)
        if leaders is None:
            tops = self._tops.get(key)
            if tops is None or not self._carry(tops, k, limit, gpu_type):
                tops = self._tops[key] = self._top_rows(k, 2 * limit, gpu_type)
            lead, rest = tops.lead.rows[:limit], tops.rest.rows[:limit]
            leaders = self._rankings[key] = ([r for _, r in lead], [r for _, r in rest], [v for v, _ in rest])
        return leaders

    def _top_rows(self, k: int, depth: int, gpu_type: str | None) -> "_Tops":
        """The first ``depth`` rows of each part of the leaders' order, from every row."""
        room = -self._kth(k)
        in_type = None if gpu_type is None else self._type_code == self.type_names.index(gpu_type)
        lead_mask = self.idle >= k
        lead = lead_mask if in_type is None else lead_mask & in_type
        rest = ~lead_mask if in_type is None else ~lead_mask & in_type
        parts = []
        for mask in (lead, rest):
            rows = np.flatnonzero(mask)
            best, keys = _best(rows, room, depth)
            entries = list(zip(keys.tolist(), best.tolist()))
            parts.append(_Top(entries, {entry[1]: entry for entry in entries}, len(rows) <= depth))
        return _Tops(parts[0], parts[1], self._read_moves())

    def _read_moves(self) -> int:
        """How much of ``_moved`` leaders made or carried now have taken in: a row that changes
        again after this is listed again, for them, while between two reads it is listed once
        (a shell's updates come GPU by GPU, eight to a node, each changing its row)."""
        self._unread_moves.clear()
        return len(self._moved)

    def _carry(self, tops: "_Tops", k: int, limit: int, gpu_type: str | None) -> bool:
        """Bring ``tops`` up to date with the rows changed since it was made, in time in those rows:
        False when it cannot say the first ``limit`` of a part any more (too many of them left it)."""
        moved = set(self._moved[tops.seen:])
        tops.seen = self._read_moves()
        if not moved:
            return True
        rows = moved
        if gpu_type is not None:
            code = self.type_names.index(gpu_type)
            rows = [row for row in moved if self._type_code.item(row) == code]
        column = self._kth_column(k)
        idle = self.idle
        now = [((-self._row_ascending(row)[column], row), idle.item(row) >= k) for row in rows]
        depth = 2 * limit
        for part, leads in ((tops.lead, True), (tops.rest, False)):
            listed, where = part.rows, part.where
            # A row not listed comes after the last one listed: a changed row that now comes after
            # it is left out too, as its place among those is unknown.
            bound = None if part.complete else listed[-1]
            for row in where.keys() & moved:
                del listed[bisect_left(listed, where.pop(row))]
            for entry, lead in now:
                if lead is leads and (bound is None or entry < bound):
                    insort(listed, entry)
                    where[entry[1]] = entry
            if bound is not None and len(listed) < limit:
                return False
            if len(listed) > depth:
                for _, row in listed[depth:]:
                    del where[row]
                del listed[depth:]
                part.complete = False
        return True

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
class _Top:
    """The first rows of one part of the leaders' order, as (sort key, row), ascending; a row not
    listed comes after the last one, unless ``complete`` (every row of the part is listed)."""

    rows: list[tuple[float, int]]
    where: dict[int, tuple[float, int]]  # row -> its entry in ``rows``
    complete: bool


@dataclass(slots=True)
class _Tops:
    """The two parts of ``NodeRanking._leaders``' order (rows with ``k`` idle GPUs, the others),
    kept twice as deep as asked, so that the rows that change between two cycles seldom empty
    them; ``seen``: how much of ``_moved`` they have taken in."""

    lead: _Top
    rest: _Top
    seen: int
