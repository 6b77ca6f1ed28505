"""One ``ClusterIndex`` kept across steps from the nodes' reports (``ReportedCluster``).

The simulator keeps one index for its whole run and updates the rows of the GPUs that changed
(``replay.cluster.SimCluster.report``); the live queue gets each node's whole snapshot every tick.
Rebuilt from every snapshot on every tick, the index would forget what the planner learnt of the
nodes that did not change (their rooms, ``ClusterIndex.kept_rooms``) and cost a pass over the
whole cluster per tick. So the live shell keeps one too: a node whose snapshot differs from the
one it last reported is updated (``ClusterIndex.update``), the others are left as they are, and
only a change of the nodes themselves (one joined, was lost, or changed its GPU count) builds a
new index. Both shells then plan on an index updated per node, with the same memo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState

__all__ = ["ReportedCluster"]


class ReportedCluster:
    def __init__(self) -> None:
        self.index: ClusterIndex | None = None
        self._shown: dict[str, tuple[GpuState, ...]] = {}  # node -> the snapshot the index holds
        self.rebuilt = 0  # indexes built (a new one per change of the nodes themselves)
        self.updated = 0  # node updates applied to a kept index

    def refresh(self, snapshots: Mapping[str, Sequence[GpuState]]) -> ClusterIndex | None:
        """The index for the nodes' latest snapshots (node -> its GPUs, in cluster order; only the
        nodes that answer and are not lost). None without a node."""
        if not snapshots:
            self.index, self._shown = None, {}
            return None
        shown = self._shown
        if (self.index is None or self.index.names != list(snapshots)
                or any(len(gpus) != len(shown[node]) for node, gpus in snapshots.items())):
            self._shown = shown = {node: tuple(gpus) for node, gpus in snapshots.items()}
            index = self.index = ClusterIndex([(n, len(g)) for n, g in shown.items()], lambda n: list(shown[n]))
            for node, gpus in shown.items():
                index.update(node, gpus)
            self.rebuilt += 1
            return index
        for node, gpus in snapshots.items():
            now = tuple(gpus)
            if now != shown[node]:
                shown[node] = now
                self.index.update(node, now)
                self.updated += 1
        return self.index
