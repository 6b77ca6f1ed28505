"""The kinds of node an autoscaler may add: what admission may count on before they exist.

A cluster whose GPU nodes come and go (Ray's autoscaler, KubeRay) can hold a job no node now
alive holds: it is admitted when a node type could hold it (up to the type's maximum count), and
refused at submit, with the reason, when none could.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hier_sched.core.gpu_types import gpu_type

__all__ = ["NodeType", "node_types_from_records", "possible_nodes"]


@dataclass(frozen=True, slots=True)
class NodeType:
    name: str
    gpu_type: str  # one of ``gpu_types.GPU_TYPES``
    gpus: int
    max_count: int

    def __post_init__(self) -> None:
        gpu_type(self.gpu_type)  # an unknown type's error lists the known ones
        if self.gpus < 1 or self.max_count < 1:
            raise ValueError(f"node type {self.name!r}: needs at least 1 GPU and a maximum of at least 1 node "
                             f"(got {self.gpus} GPU(s), max {self.max_count})")

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "gpu_type": self.gpu_type, "gpus": self.gpus, "max_count": self.max_count}


def node_types_from_records(records: Iterable[Mapping[str, Any]]) -> list[NodeType]:
    return [NodeType(str(r["name"]), str(r["gpu_type"]), int(r["gpus"]), int(r["max_count"])) for r in records]


def possible_nodes(types: Iterable[NodeType]) -> tuple[dict[str, tuple[float, ...]], dict[str, str]]:
    """(name -> per-GPU memory, name -> GPU type) of every node the types allow, named
    ``<type>#<k>``: what ``Scheduler.allow_autoscaled`` and the submit check count on."""
    totals: dict[str, tuple[float, ...]] = {}
    kinds: dict[str, str] = {}
    for t in types:
        memory = float(gpu_type(t.gpu_type).memory_mib)
        for k in range(t.max_count):
            totals[f"{t.name}#{k}"] = (memory,) * t.gpus
            kinds[f"{t.name}#{k}"] = t.gpu_type
    return totals, kinds
