"""What ``hier-sched up`` leaves on the machine that ran it: ``<state dir>/cluster.json``.

It is a note, not a dependency: clients use its address only as a hint when nothing better
names a Ray cluster (see ``connection``), and ``down`` reads it to know what ``up`` started
(the scheduler on that cluster, and the Ray processes when ``up`` started Ray itself). A
client on another node, or with another state directory, never needs it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hier_sched.common.paths import state_dir
from hier_sched.common.private_files import private_dir, replace_private

__all__ = ["ClusterRecord", "LocalRay", "record_file", "read_record", "write_record", "remove_record"]

RECORD_FILE = "cluster.json"


@dataclass(frozen=True, slots=True)
class LocalRay:
    """A Ray cluster ``up`` started itself: its processes are those of these sessions."""

    session_dir: str  # Ray's session directory of this cluster, which its processes name
    sessions: list[int]  # session ids (the pid of each `ray start`, run in its own session)
    port: int  # the head's GCS port


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    address: str  # the Ray cluster's GCS address (host:port), what RAY_ADDRESS would say
    state_dir: str  # the scheduler's state directory on the cluster's nodes
    dashboard_url: str | None = None
    local_ray: LocalRay | None = None  # None: `up --address` attached to a cluster someone else runs
    config: dict[str, Any] = field(default_factory=dict)
    ready_s: float | None = None
    scheduler_job: str | None = None  # the Ray Job whose driver owns the scheduler's actors (``control``)


def record_file(directory: Path | None = None) -> Path:
    return (directory or state_dir()) / RECORD_FILE


def read_record(directory: Path | None = None) -> ClusterRecord | None:
    """The record, or None when there is none (or it is unreadable: it is only a note)."""
    try:
        data = json.loads(record_file(directory).read_text())
        local = data.pop("local_ray", None)
        return ClusterRecord(**data, local_ray=LocalRay(**local) if local else None)
    except (OSError, ValueError, TypeError):
        return None


def write_record(record: ClusterRecord, directory: Path | None = None) -> Path:
    path = record_file(directory)
    private_dir(path.parent)
    replace_private(path, json.dumps(asdict(record), indent=1))
    return path


def remove_record(directory: Path | None = None) -> None:
    record_file(directory).unlink(missing_ok=True)
