"""Where a reclaim makes fit: each GPU's usable memory as the cluster will have it once the runs
asked to leave are gone, so that a reclaim preempts runs only if the job it is for then fits.

Without it a reclaim could free GPUs the waiting job cannot use (a gang that needs whole nodes,
a job restricted to another GPU type, or room spread over nodes), and the freed GPUs would go to
another borrower, whose run would be preempted again a minute later, and again. ``ReclaimFit`` starts
from the plan's picture (the snapshots, the runs the scheduler assumes, minus what this cycle
placed), counts every run already asked to leave as gone, and places the jobs it makes room for
one after another. It judges memory only, as the memory gate does: the utilization gate reads
monitoring windows no plan can foresee, and a job that needs idle GPUs (exclusive, the last
recovery step) is never reclaimed for, since memory cannot tell an idle GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import Placement
from hier_sched.core.gpu_types import allows
from hier_sched.core.placement import PlacementConfig, memory_requirement
from hier_sched.core.queueing import QueueConfig, QueuedJob, placement_request

__all__ = ["ReclaimFit", "Grown"]

T = TypeVar("T")


class ReclaimFit:
    def __init__(self, cluster: ClusterIndex, cfg: PlacementConfig, qcfg: QueueConfig, taken: Iterable[Placement],
                 gone: Iterable[Placement]):
        """``taken``: what this cycle placed (not in the snapshots yet); ``gone``: what the runs asked
        to leave hold."""
        self.cluster, self.cfg, self.qcfg = cluster, cfg, qcfg
        self.free = cluster.free - cfg.free_reserve_mib
        self._need_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._add(self.free, taken, -1.0)
        self._add(self.free, gone, 1.0)

    def _add(self, free: np.ndarray, placements: Iterable[Placement], sign: float) -> None:
        for p in placements:
            row = self.cluster.pos.get(p.node)
            if row is not None:
                for gpu in p.gpus:
                    free[row, gpu] += sign * p.reserved_mib

    def _needs(self, job: QueuedJob) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the usable memory each of the job's GPUs must have there, and what it reserves
        (inf where it may not run, or needs idle GPUs)."""
        cached = self._need_rows.get(job.job_id)
        if cached is not None:
            return cached
        cluster = self.cluster
        by_type: dict[str, tuple[float, float]] = {}
        for name in cluster.type_names or [""]:
            by_type[name] = (np.inf, np.inf)
            if job.gpu_types and not allows(job.gpu_types, name):
                continue
            capacity = cluster.type_capacity.get(name) or cluster.gpu_total_mib
            req = placement_request(job, capacity, self.qcfg, name or None)
            if not req.exclusive:
                by_type[name] = memory_requirement(req, self.cfg)
        rows = [by_type[cluster.type_of(row) if cluster.type_names else ""] for row in range(len(cluster.names))]
        cached = self._need_rows[job.job_id] = (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]))
        return cached

    def _fits_on(self, job: QueuedJob, free: np.ndarray) -> np.ndarray:
        """Per row, whether the job's part fits on ``free`` there."""
        need, _ = self._needs(job)
        return (free >= need[:, None]).sum(axis=1) >= job.per_node

    def _rows(self, job: QueuedJob, free: np.ndarray) -> np.ndarray | None:
        """The rows where the job's part fits on ``free``, or None when fewer than its nodes."""
        rows = np.flatnonzero(self._fits_on(job, free))
        return rows if len(rows) >= job.nodes else None

    def fits(self, job: QueuedJob, freed: Iterable[Placement] = ()) -> bool:
        """Whether the job fits once ``freed`` is gone too."""
        free = self.free.copy()
        self._add(free, freed, 1.0)
        return self._rows(job, free) is not None

    def arrange(self, job: QueuedJob, candidates: Sequence[tuple[T, Sequence[Placement]]]) -> list[T]:
        """The candidates (each with what it holds), in their order but those on the nodes where
        the job fits soonest first: for each node, how many of its candidates, taken in order, the
        job's part needs gone (none where it fits already); the job's nodes with the fewest."""
        need, _ = self._needs(job)
        on_row: dict[int, list[int]] = {}
        for i, (_, placements) in enumerate(candidates):
            for p in placements:
                row = self.cluster.pos.get(p.node)
                if row is not None and i not in on_row.setdefault(row, []):
                    on_row[row].append(i)
        # (how many go, the last one's place, which): none on the nodes where the job fits already,
        # found for every node at once; a node where it does not is walked only if candidates hold
        # some of it (without, nothing there makes room)
        fits_now = self._fits_on(job, self.free)
        costs: list[tuple[int, int, list[int]]] = [(0, -1, [])] * int(fits_now.sum())
        for row, held in on_row.items():
            if fits_now[row]:
                continue
            # (one node's few GPUs: Python floats, where each numpy call would cost more than its work)
            free, need_here, node = self.free[row].tolist(), float(need[row]), self.cluster.names[row]
            for k, i in enumerate(held):
                for p in candidates[i][1]:
                    if p.node == node:
                        for gpu in p.gpus:
                            free[gpu] += p.reserved_mib
                if sum(f >= need_here for f in free) >= job.per_node:
                    costs.append((k + 1, i, held[:k + 1]))
                    break
        first = sorted({i for cost in sorted(costs)[:job.nodes] for i in cost[2]})
        rest = sorted(set(range(len(candidates))) - set(first))
        return [candidates[i][0] for i in first + rest]

    def grown(self, job: QueuedJob) -> "Grown":
        """The room for ``job``, to count runs gone one at a time (``Grown.add``)."""
        return Grown(self, job)

    def free_up(self, freed: Iterable[Placement]) -> None:
        self._add(self.free, freed, 1.0)

    def take(self, job: QueuedJob) -> bool:
        """Place the job here, if it fits (the room it takes is no longer there): on the
        rows and GPUs with the least room that suffices, as a best fit leaves the rest."""
        rows = self._rows(job, self.free)
        if rows is None:
            return False
        need, reserve = self._needs(job)
        per_node = job.per_node
        fit = np.where(self.free[rows] >= need[rows, None], self.free[rows], np.inf)  # GPUs it cannot use: inf
        order = np.argsort(fit, axis=1, kind="stable")[:, :per_node]  # each row's least sufficient GPUs
        least = np.take_along_axis(fit, order, axis=1).sum(axis=1)
        for i in np.argsort(least, kind="stable")[:job.nodes]:
            self.free[rows[i], order[i]] -= reserve[rows[i]]
        return True


class Grown:
    """The room for one job with more runs counted gone, one at a time: it keeps, per node, how
    many GPUs have the room the job needs there, so each run counted costs its own GPUs only."""

    def __init__(self, fit: ReclaimFit, job: QueuedJob):
        self.fit, self.job = fit, job
        self.need, _ = fit._needs(job)
        self.free = fit.free.copy()
        self.fitting = (self.free >= self.need[:, None]).sum(axis=1)
        self.rows = int((self.fitting >= job.per_node).sum())

    def add(self, freed: Iterable[Placement]) -> None:
        pos, free, need, per_node = self.fit.cluster.pos, self.free, self.need, self.job.per_node
        for p in freed:
            row = pos.get(p.node)
            if row is None:
                continue
            for gpu in p.gpus:
                had = free[row, gpu] >= need[row]
                free[row, gpu] += p.reserved_mib
                if not had and free[row, gpu] >= need[row]:
                    self.fitting[row] += 1
                    self.rows += self.fitting[row] == per_node

    def fits(self) -> bool:
        return self.rows >= self.job.nodes
