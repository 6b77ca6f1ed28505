"""Admission: can the cluster ever hold a job of this shape? Decided once, at submission.

Both shells ask this one rule with what is known at submission — the job's shape and its
*estimate* — never its true peak: a job estimated to fit is admitted, and if it really does
not, the OOM recovery finds out (and fails it after its attempts, with the reason).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

__all__ = ["AdmissionIndex", "admission_problems"]


class AdmissionIndex:
    """The cluster's shape (node -> per-GPU memory, MiB), indexed so that asking about a job costs
    a binary search, not a pass over every GPU (a replay admits 100,000 jobs on 1,500 nodes)."""

    def __init__(self, nodes: Mapping[str, Sequence[float]]):
        self._desc = [sorted(g, reverse=True) for g in nodes.values()]
        self.node_count = len(self._desc)
        self.largest_node = max((len(g) for g in self._desc), default=0)
        self.biggest_gpu = max((g[0] for g in self._desc if g), default=0.0)
        self._kth: dict[int, list[float]] = {}  # k -> ascending k-th largest GPU of each node

    def _capable(self, per_node: int, need_mib: float) -> int:
        """Nodes with at least ``per_node`` GPUs of ``need_mib`` or more."""
        kth = self._kth.get(per_node)
        if kth is None:
            kth = self._kth[per_node] = sorted(g[per_node - 1] for g in self._desc if len(g) >= per_node)
        return len(kth) - bisect_left(kth, need_mib)

    def problems(self, per_node: int, nodes_needed: int, need_mib: float | None, *,
                 per_node_field: str = "gpus", mig: bool = False) -> list[str]:
        """Why no placement of the job can ever exist; empty when one can. ``per_node_field``
        names the spec field the user should fix."""
        if not self.node_count:
            return []  # no node known yet: nothing to judge against, the queue waits for nodes
        problems = []
        if per_node > self.largest_node:
            problems.append(f"{per_node_field}: {per_node} GPUs on one node, but the largest node has "
                            f"{self.largest_node}")
        if nodes_needed > self.node_count:
            problems.append(f"gang shape: needs {nodes_needed} nodes, the cluster has {self.node_count}")
        if mig and per_node * nodes_needed > 1:
            problems.append("gpus: multi-GPU training is not possible on MIG slices")
        if need_mib is not None and not problems and self._capable(per_node, need_mib) < nodes_needed:
            problems.append(f"memory_mib: needs {need_mib:.0f} MiB per GPU on {per_node} GPU(s) of "
                            f"{nodes_needed} node(s); the largest GPU has {self.biggest_gpu:.0f} MiB")
        return problems


def admission_problems(per_node: int, nodes_needed: int, need_mib: float | None,
                       nodes: Mapping[str, Sequence[float]], *, per_node_field: str = "gpus",
                       mig: bool = False) -> list[str]:
    """``AdmissionIndex(nodes).problems(...)`` for a one-off question."""
    return AdmissionIndex(nodes).problems(per_node, nodes_needed, need_mib, per_node_field=per_node_field, mig=mig)
