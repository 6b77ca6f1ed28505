"""What the GlobalQueue and the node actors say to each other (both import these, never each other).

The queue sends a node one ``LaunchOrder`` per placement of a core ``Launch`` (a gang sends one
to each of its nodes), and ``Stop`` / ``SignalCheckpoint`` commands as the core gives them. An
order carries the job's ``LaunchSpec``: what the node needs of the spec to start the job, taken
from the ``JobSpec`` the queue validated at submission (the node validates nothing again; it
only checks that the ordered GPUs still fit) and answers with a ``LaunchReply``. The orders ride
on the call that asks a node for its report, ``exchange(ack, ..., orders)``: one round trip per
node and tick carries both ways. A node answers it with a ``NodeReport``: its replies to the
orders, its GPU snapshot, the run events it has not had
acknowledged yet (numbered, so none is lost when the queue restarts between reading and logging
them), and the runs it has now (so a restarted queue re-adopts them instead of launching them
twice). A node numbers what it reports (``NodeReport.version``): asked with the version the queue
already holds, it answers "nothing changed" in a few bytes (no snapshot, no runs) instead of the
whole picture again -- at a thousand nodes the picture every tick is most of the queue's work.

Every message is plain typed data: ``plain_data.to_plain`` / ``from_plain`` turn each into
msgpack-able data and back (the queue's write-ahead log keeps a job's ``LaunchSpec`` so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hier_sched.core.events import Launch, NodeEvent
from hier_sched.core.gpu import GpuState, Placement
from hier_sched.core.spec import JobSpec
from hier_sched.core.wire import pickled_by_fields

__all__ = ["EmulatedRun", "LaunchSpec", "LaunchOrder", "LaunchReply", "NodeReport", "RunOnNode"]


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class EmulatedRun:
    """What the job really does on an emulated GPU (the spec's ``emulation``)."""

    peak_mib: float
    duration_s: float
    smact: float
    smocc: float | None
    drama: float | None
    warmup_s: float


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What a node needs of a validated ``JobSpec`` to start the job: what to run, where, with
    which environment and checkpoint directory (``JobSpec``'s fields of the same names). The rest
    of the spec reached the scheduler in the job's ticket."""

    command: tuple[str, ...] | None = None
    entrypoint: str | None = None  # "pkg.mod:fn"
    workdir: str | None = None
    checkpoint_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, Any] | None = None  # Ray's, for the job's processes
    emulation: EmulatedRun | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> "LaunchSpec":
        emu = spec.emulation
        emulation = (EmulatedRun(emu.peak_mib, emu.duration_s, emu.smact, emu.smocc, emu.drama, emu.warmup_s)
                     if emu is not None else None)
        return cls(spec.command, spec.entrypoint, spec.workdir, spec.checkpoint_dir, dict(spec.env),
                   spec.runtime_env, emulation)


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class LaunchOrder:
    """Start one node's part of a run: ``launch.placements[rank]`` is this node's."""

    launch: Launch
    rank: int  # node rank within the gang (0 for a single-node job)
    spec: LaunchSpec
    payload: bytes | None = None  # cloudpickled (fn, args, kwargs) of hs.submit(fn)
    rendezvous: dict[str, str] = field(default_factory=dict)  # MASTER_ADDR / MASTER_PORT of a gang

    @property
    def placement(self) -> Placement:
        return self.launch.placements[self.rank]

    @property
    def job_id(self) -> str:
        return self.launch.job_id


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class LaunchReply:
    """A node's answer to a ``LaunchOrder``: started, or declined (``reason`` says why)."""

    launched: bool
    reason: str


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class RunOnNode:
    """A run a node has right now (for reconciliation after a restart)."""

    job_id: str
    attempt: int
    placement: Placement


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    now_s: float  # the node's scheduler clock
    snapshot: list[GpuState] | None  # None: unchanged since ``version`` (``unchanged``)
    incarnation: str  # changes when the node actor restarts: sequence numbers start over
    events: list[tuple[int, NodeEvent, bytes | None]]  # (sequence number, event, a callable's pickled result)
    runs: list[RunOnNode] | None  # None: unchanged since ``version``
    version: int = 0  # of this incarnation's snapshot and runs: a new number whenever either changes
    # the answers to the launch orders the call that asked for this report carried, in their order
    # (started before the report was taken: its snapshot and runs show them)
    launched: list[LaunchReply] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        """The node answered "nothing changed since the version you hold" (snapshot and runs left out)."""
        return self.snapshot is None

