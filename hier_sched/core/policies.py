"""Placement policies: each one registered once, with everything that makes it what it is.

A policy says which gates a GPU must pass (memory, utilization), whether it collocates at all,
in which order the planner offers nodes (by position, most room first, least room first), and
how it ranks a node's GPUs that pass. ``placement``, ``cluster_view``, ``queueing`` and
``presets`` read these fields; none of them compares a policy's name. A ``PlacementConfig``
resolves its policy (aliases included) once, when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hier_sched.core.gpu import GpuState

__all__ = ["Policy", "POLICIES", "ALIASES", "register", "policy"]

NodeOrder = Literal["position", "most_room", "least_room"]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    aliases: tuple[str, ...] = ()
    memory_gate: bool = True  # round-robin collocates blindly and relies on OOM recovery
    util_gate: bool = True
    collocates: bool = True
    node_order: NodeOrder = "most_room"  # by the free memory of a node's k-th freest GPU
    # A node's passing GPUs, best first (ties on GPU index: deterministic); None: round-robin's
    # order, from the cursor where the last placement stopped.
    gpu_key: Callable[[GpuState], tuple] | None = None


POLICIES: dict[str, Policy] = {}
ALIASES: dict[str, str] = {}


def register(p: Policy) -> Policy:
    taken = {p.name, *p.aliases} & (POLICIES.keys() | ALIASES.keys())
    if taken:
        raise ValueError(f"policy name(s) already registered: {', '.join(sorted(taken))}")
    POLICIES[p.name] = p
    ALIASES.update((alias, p.name) for alias in p.aliases)
    return p


def policy(name: str) -> Policy:
    """The policy called ``name`` or one of its aliases."""
    try:
        return POLICIES[ALIASES.get(name, name)]
    except KeyError:
        known = sorted(POLICIES) + sorted(ALIASES)
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}") from None


register(Policy("exclusive", collocates=False, node_order="position", gpu_key=lambda g: (g.index,)))
register(Policy("round-robin", ("rr",), memory_gate=False, util_gate=False))
register(Policy("first-fit", node_order="position", gpu_key=lambda g: (g.index,)))
register(Policy("best-fit", ("mug", "pack"), node_order="least_room", gpu_key=lambda g: (g.memory_free_mib, g.index)))
register(Policy("magm", ("worst-fit",), gpu_key=lambda g: (-g.memory_free_mib, g.index)))
register(Policy("lug", gpu_key=lambda g: (g.risk.smact, -g.memory_free_mib, g.index)))
