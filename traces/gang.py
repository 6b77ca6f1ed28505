"""Gang shape of a multi-GPU job: how many of its GPUs go on each node."""

from __future__ import annotations

__all__ = ["gpus_per_node_for"]


def gpus_per_node_for(gpus: int, node_gpus: int) -> int | None:
    """``None`` when the job fits on one node; else the largest divisor of ``gpus`` that is at most
    ``node_gpus`` (fewest nodes with an equal share each): 16 on 8-GPU nodes -> 8 x 2 nodes,
    12 -> 6 x 2, 20 -> 5 x 4."""
    if gpus < 1 or node_gpus < 1:
        raise ValueError(f"gpus and node_gpus must be >= 1 (got {gpus}, {node_gpus})")
    if gpus <= node_gpus:
        return None
    return next(d for d in range(node_gpus, 0, -1) if gpus % d == 0)
