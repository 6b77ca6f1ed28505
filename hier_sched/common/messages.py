"""What the GlobalQueue and the node actors say to each other (both import these, never each other).

The queue sends a node one ``LaunchOrder`` per placement of a core ``Launch`` (a gang sends one
to each of its nodes), and ``Stop`` / ``SignalCheckpoint`` commands as the core gives them. A
node answers ``exchange(ack)`` with a ``NodeReport``: its GPU snapshot, the run events it has
not had acknowledged yet (numbered, so none is lost when the queue restarts between reading and
logging them), and the runs it has now (so a restarted queue re-adopts them instead of
launching them twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hier_sched.core.events import Launch, NodeEvent
from hier_sched.core.gpu import GpuState, Placement

__all__ = ["LaunchOrder", "NodeReport", "RunOnNode"]


@dataclass(frozen=True, slots=True)
class LaunchOrder:
    """Start one node's part of a run: ``launch.placements[rank]`` is this node's."""

    launch: Launch
    rank: int  # node rank within the gang (0 for a single-node job)
    spec: dict[str, Any]  # JobSpec.model_dump(mode="json"), validated at submission
    payload: bytes | None = None  # cloudpickled (fn, args, kwargs) of hs.submit(fn)
    rendezvous: dict[str, str] = field(default_factory=dict)  # MASTER_ADDR / MASTER_PORT of a gang

    @property
    def placement(self) -> Placement:
        return self.launch.placements[self.rank]

    @property
    def job_id(self) -> str:
        return self.launch.job_id


@dataclass(frozen=True, slots=True)
class RunOnNode:
    """A run a node has right now (for reconciliation after a restart)."""

    job_id: str
    attempt: int
    placement: Placement


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    now_s: float  # the node's scheduler clock
    snapshot: list[GpuState]
    incarnation: str  # changes when the node actor restarts: sequence numbers start over
    events: list[tuple[int, NodeEvent, bytes | None]]  # (sequence number, event, a callable's pickled result)
    runs: list[RunOnNode]

