"""A replay's cluster of several node types: ``--nodes-spec`` or ``--cluster FILE``.

``--nodes-spec "V100-16GB:4x1,A100-40GB:4x1"``: comma-separated groups ``TYPE:COUNTxGPUS``, each
COUNT nodes of GPUS GPUs of TYPE (a ``gpu_types.GPU_TYPES`` name). ``--cluster FILE``: the same
groups in YAML or JSON, a list of ``{type, count, gpus}`` (or that list under ``nodes:``). Nodes
are named ``node0000``, ``node0001``, ... in the order given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hier_sched.core.gpu import SharingMode
from hier_sched.core.gpu_types import gpu_type
from replay.cluster import ClusterShape

__all__ = ["NodeGroup", "parse_nodes_spec", "load_cluster_file", "shape_of_groups"]

NodeGroup = tuple[str, int, int]  # (GPU type, nodes, GPUs per node)

_GROUP = re.compile(r"(?P<type>[^:,\s]+):(?P<count>\d+)x(?P<gpus>\d+)")


def _checked(kind: Any, count: Any, gpus: Any, where: str) -> NodeGroup:
    if not isinstance(kind, str):
        raise ValueError(f"{where}: type must be a GPU type name (got {kind!r})")
    gpu_type(kind)  # an unknown type: the error lists the known ones
    for name, value in (("count", count), ("gpus", gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be a whole number >= 1 (got {value!r})")
    return kind, count, gpus


def parse_nodes_spec(text: str) -> tuple[NodeGroup, ...]:
    """``"V100-16GB:4x1,A100-40GB:4x1"`` -> ``(("V100-16GB", 4, 1), ("A100-40GB", 4, 1))``."""
    groups = []
    for part in (p.strip() for p in text.split(",")):
        match = _GROUP.fullmatch(part)
        if match is None:
            raise ValueError(f"--nodes-spec {part!r}: expected TYPE:COUNTxGPUS, e.g. A100-40GB:4x1")
        groups.append(_checked(match["type"], int(match["count"]), int(match["gpus"]), f"--nodes-spec {part!r}"))
    return tuple(groups)


def load_cluster_file(path: str | Path) -> tuple[NodeGroup, ...]:
    """The groups of a YAML/JSON cluster file (a list of ``{type, count, gpus}``, or under ``nodes:``)."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if isinstance(data, dict) and set(data) == {"nodes"}:
        data = data["nodes"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of {{type, count, gpus}} (or one under 'nodes:')")
    groups = []
    for i, item in enumerate(data):
        where = f"{path}: node group {i + 1}"
        if not isinstance(item, dict) or set(item) != {"type", "count", "gpus"}:
            raise ValueError(f"{where}: expected exactly the fields type, count, gpus (got {item!r})")
        groups.append(_checked(item["type"], item["count"], item["gpus"], where))
    return tuple(groups)


def shape_of_groups(groups: Sequence[NodeGroup], sharing: SharingMode) -> ClusterShape:
    nodes = [(kind, gpus) for kind, count, gpus in groups for _ in range(count)]
    return ClusterShape(tuple((f"node{i:04d}", gpus, kind) for i, (kind, gpus) in enumerate(nodes)), sharing)
