"""Admission: can the cluster ever hold a job of this shape? Decided once, at submission.

Both shells ask this one rule with what is known at submission — the job's shape and its
*estimate* — never its true peak: a job estimated to fit is admitted, and if it really does
not, the OOM recovery finds out (and fails it after its attempts, with the reason).

On a cluster of several GPU types a job is admitted when some type it may run on
(``JobTicket.gpu_types``) has enough nodes whose GPUs each hold the job's need *on that type*
(``JobTicket.need_on``): a gang runs on one type, so the nodes are counted per type.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

from hier_sched.core.gpu_types import allows

__all__ = ["AdmissionIndex"]


class _Shape:
    """Some nodes' per-GPU memory, indexed so that asking about a job costs a binary search, not
    a pass over every GPU (a replay admits 100,000 jobs on 1,500 nodes)."""

    def __init__(self, gpu_lists: Sequence[Sequence[float]]):
        self._desc = [sorted(g, reverse=True) for g in gpu_lists]
        self.node_count = len(self._desc)
        self.largest_node = max((len(g) for g in self._desc), default=0)
        self.biggest_gpu = max((g[0] for g in self._desc if g), default=0.0)
        self._kth: dict[int, list[float]] = {}  # k -> ascending k-th largest GPU of each node

    def capable(self, per_node: int, need_mib: float | None) -> int:
        """Nodes with at least ``per_node`` GPUs of ``need_mib`` or more (any size when None)."""
        kth = self._kth.get(per_node)
        if kth is None:
            kth = self._kth[per_node] = sorted(g[per_node - 1] for g in self._desc if len(g) >= per_node)
        return len(kth) if need_mib is None else len(kth) - bisect_left(kth, need_mib)


class AdmissionIndex:
    """The cluster's shape (node -> per-GPU memory, MiB; node -> GPU type, "" when not known)."""

    def __init__(self, nodes: Mapping[str, Sequence[float]], types: Mapping[str, str] | None = None):
        self._all = _Shape(list(nodes.values()))
        self.node_count = self._all.node_count
        self.largest_node = self._all.largest_node
        self.biggest_gpu = self._all.biggest_gpu
        by_type: dict[str, list[Sequence[float]]] = {}
        for name, gpus in nodes.items():
            by_type.setdefault((types or {}).get(name, ""), []).append(gpus)
        self._types = {t: _Shape(lists) for t, lists in sorted(by_type.items())}

    def problems(self, per_node: int, nodes_needed: int, need_mib: float | None, *,
                 needs: Sequence[tuple[str, float]] = (), gpu_types: Sequence[str] = (),
                 per_node_field: str = "gpus", mig: bool = False) -> list[str]:
        """Why no placement of the job can ever exist; empty when one can. ``needs``: the job's
        need on GPU types where it differs from ``need_mib``; ``gpu_types``: the types it may run
        on (globs; none: any). ``per_node_field`` names the spec field the user should fix."""
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
        if problems:
            return problems
        own = dict(needs)
        if len(self._types) == 1 and allows(gpu_types, only := next(iter(self._types))):
            # One GPU type (or none reported): the need on it against every node.
            need = own.get(only, need_mib)
            if need is not None and self._all.capable(per_node, need) < nodes_needed:
                problems.append(f"memory_mib: needs {need:.0f} MiB per GPU on {per_node} GPU(s) of "
                                f"{nodes_needed} node(s); the largest GPU has {self.biggest_gpu:.0f} MiB")
            return problems
        allowed = {t: shape for t, shape in self._types.items() if allows(gpu_types, t)}
        if not allowed:
            return [f"gpu_types: {', '.join(gpu_types)} matches none of the cluster's GPU types "
                    f"({', '.join(t or 'unreported' for t in self._types)})"]
        if any(shape.capable(per_node, own.get(t, need_mib)) >= nodes_needed for t, shape in allowed.items()):
            return []
        per_type = "; ".join(_shortfall(t, shape, own.get(t, need_mib), per_node) for t, shape in allowed.items())
        return [f"memory_mib: needs {per_node} GPU(s) on each of {nodes_needed} node(s) of one GPU type, "
                f"and no allowed type has them: {per_type}"]


def _shortfall(gpu_type: str, shape: _Shape, need: float | None, per_node: int) -> str:
    """One type's figures for a refusal: the need there against its largest GPU and node count."""
    wanted = "any memory" if need is None else f"{need:.0f} MiB per GPU"
    return (f"{gpu_type or 'unreported type'} needs {wanted}, its largest GPU has {shape.biggest_gpu:.0f} MiB "
            f"on {shape.node_count} node(s), {shape.capable(per_node, need)} of them able")
