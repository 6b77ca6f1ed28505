"""The scheduler's messages: events in, commands out (``Scheduler.step``).

Both shells speak these: the simulator turns its virtual devices' happenings into events and
carries the commands out on them; the live GlobalQueue gathers events from users and node
actors, and sends the commands to the node actors (which share these types through
``hier_sched``, never through each other's modules). Every event is also what the live queue
writes to its write-ahead log, so each one is plain data: ``to_record`` / ``event_from_record``
turn it into msgpack-able dicts and back.

Attempts: every run of a job has a number (1, 2, ...). Events about a run carry it, so a late or
repeated event about an earlier run (after a restart, say) is recognised and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hier_sched.core.failures import Failure
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.quotas import PriorityClass, QueueQuota, QueueSetup
from hier_sched.core.slots import SLOT_GRACE_S, SLOT_KILL_AFTER_S
from hier_sched.core.wire import pickled_by_fields

__all__ = [
    "JobTicket", "Submitted", "RunStarted", "LaunchDeclined", "RunEnded", "RunSettled", "CancelRequested",
    "CheckpointRequested", "QueuesConfigured", "EstimateArrived", "EstimateFailed", "NodeJoined", "NodeLost",
    "RunReclaimed", "SlotEnded", "HeadWaiting", "Event", "NodeEvent", "Launch", "SignalCheckpoint", "Stop", "Reject",
    "Command", "to_record", "event_from_record",
]


@dataclass(frozen=True, slots=True)
class JobTicket:
    """What the scheduler knows of a job when it is submitted (never the truth of its peak)."""

    job_id: str
    name: str
    gpus: int = 1
    gpus_per_node: int | None = None  # a gang over gpus / gpus_per_node nodes
    need_mib: float | None = None  # memory estimate per GPU (None: no estimate)
    estimate_source: str = ""  # where need_mib came from, for status
    smact: float | None = None  # solo utilization estimate
    priority: int = 0
    signature: str = ""  # "the same job" for learning peaks and run times
    learn_peak: bool = False  # a measured peak of the same job replaces the estimate (auto)
    max_attempts: int | None = None  # runs in all; None: the recovery policy's
    max_retries: int | None = None  # re-runs after non-OOM failures; None: the recovery policy's
    retry_exit_codes: tuple[int, ...] | None = None  # only these exit codes are retried
    slot_s: float | None = None  # fixed time slot length (None: no slot)
    slot_grace_s: float = SLOT_GRACE_S  # checkpoint signal this long before the slot ends
    kill_after_s: float = SLOT_KILL_AFTER_S  # SIGKILL this long after the slot's SIGTERM
    slot_extends: bool = False  # nobody waits at the slot's end: another slot instead of a preemption
    exclusive: bool = False  # idle GPUs only
    queue: str | None = None  # its team queue (``quotas.resolve_queue``); None: its user's, else ``default``
    user: str = "default"
    checkpoints: bool = False  # it saves checkpoints (a checkpoint_dir): a quota reclaim may preempt it
    priority_class: str | None = None  # its priority is the class's value (``quotas.PriorityClass``)
    preemptible: bool | None = None  # None: as its priority class and queue say (``QuotaBook.preemptible``)
    # The need per GPU on each GPU type of the cluster, (type name, MiB), when the estimate depends on
    # the type (a model's workspaces, allocator and process baseline do); a type not listed: need_mib.
    needs: tuple[tuple[str, float], ...] = ()
    gpu_types: tuple[str, ...] = ()  # the GPU types it may run on, glob patterns (``gpu_types.allows``); (): any
    # Its estimate is still being made (``EstimateArrived`` / ``EstimateFailed`` follow): accepted,
    # not queued, and not judged by admission until the figures are known.
    estimating: bool = False

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node if self.gpus_per_node else 1

    def need_on(self, gpu_type: str) -> float | None:
        """The need per GPU on a GPU of ``gpu_type``."""
        for name, mib in self.needs:
            if name == gpu_type:
                return mib
        return self.need_mib


# ---------------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Submitted:
    ticket: JobTicket


@dataclass(frozen=True, slots=True)
class EstimateArrived:
    """The memory estimate of a job accepted in ``estimating``: it joins the queue with these figures
    (``needs``: per GPU type, as ``JobTicket.needs``). Ignored unless the job is still estimating."""

    job_id: str
    need_mib: float | None
    source: str
    needs: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class EstimateFailed:
    """No estimate could be made and the job cannot run without one (its model cannot be built):
    it ends ``failed`` with the reason. Ignored unless the job is still estimating."""

    job_id: str
    reason: str


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class RunStarted:
    """A launch was carried out: attempt ``attempt`` of the job runs on ``placements``, since
    ``started_s`` -- when the core decided it (None: when this event is applied). A live queue
    logs it once the nodes replied, later than that: a queue rebuilt from its log must time the
    run's slot and its queue's use from the decision, as the queue that decided it did."""

    job_id: str
    attempt: int
    placements: tuple[Placement, ...]
    started_s: float | None = None


@dataclass(frozen=True, slots=True)
class LaunchDeclined:
    """A node refused a launch (its fresh snapshot no longer fits the job); the job waits again.
    ``started``: the nodes of a gang that did start their rank (the core stops them: a gang runs
    whole or not at all)."""

    job_id: str
    attempt: int
    reason: str
    started: tuple[str, ...] = ()


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class RunEnded:
    """A run's processes ended (``node``: one rank of a gang, on that node; None: the whole run).
    ``failure`` None: success. Why a stopped run was stopped (a cancel, its slot's end) the
    scheduler knows itself: it gave the order."""

    job_id: str
    attempt: int
    failure: Failure | None = None
    exit_code: int | None = 0
    peak_mib: float | None = None  # largest memory one of its GPUs showed for it
    node: str | None = None


@dataclass(frozen=True, slots=True)
class RunSettled:
    """The run reached its steady memory (it said so): from now on it reserves ``reserved_mib`` per
    GPU (``learning.settled_reservation``; ``node``: on that node; None: on every node of the run)."""

    job_id: str
    attempt: int
    reserved_mib: float
    node: str | None = None


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: str
    reason: str = "cancelled by the user"


@dataclass(frozen=True, slots=True)
class CheckpointRequested:
    """Someone (a user, an operator) asks a running job to checkpoint and requeue itself now."""

    job_id: str
    reason: str = "checkpoint requested"


@dataclass(frozen=True, slots=True)
class QueuesConfigured:
    """The team queues, their quotas and the priority classes from now on (``quotas``; no queues:
    no quotas)."""

    setup: QueueSetup


@dataclass(frozen=True, slots=True)
class NodeJoined:
    node: str
    gpu_totals_mib: tuple[float, ...]  # per-GPU memory: what admission checks a job against
    # Per-GPU type names (``gpu_types.GPU_TYPES`` keys), in the order of ``gpu_totals_mib``; ()
    # in logs written before nodes reported their types: unknown until the node joins again.
    gpu_types: tuple[str, ...] = ()

    @property
    def gpu_type(self) -> str:
        """The node's GPU type (one per node: the first GPU's), "" when not reported."""
        return self.gpu_types[0] if self.gpu_types else ""


@dataclass(frozen=True, slots=True)
class NodeLost:
    node: str
    reason: str = "node lost"


@dataclass(frozen=True, slots=True)
class NodeDraining:
    """Take no new work on the node and move its runs off it (``drains``): an operator's drain, or
    Ray's drain request or preemption notice. ``deadline_s``: when what still runs there is
    stopped and requeued (None: runs that cannot checkpoint finish there)."""

    node: str
    reason: str = "asked by an operator"
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunEvicted:
    """The core stopped the run on its own clock (a drain's deadline came while it still ran
    there): the job is requeued once the run has ended. Decided inside a step and logged after it
    (``StepResult.decided``), so a queue rebuilt from its log waits for the same run's end."""

    job_id: str
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class RunReclaimed:
    """The core signalled the run to give its GPUs back to team queue ``for_queue``, which is owed
    them (``team_queues.preemptions``), and stops it when its grace ends. Decided while planning
    and logged after the step (``StepResult.decided``), so a queue rebuilt from its log neither
    signals the run again nor takes another run for the same room."""

    job_id: str
    attempt: int
    for_queue: str
    reason: str


@dataclass(frozen=True, slots=True)
class SlotEnded:
    """Attempt ``attempt``'s time slot came to its end (its checkpoint signal was due at
    ``due_s``, ``slot_grace_s`` before the end): the core signalled the run and stops it when the
    grace ends -- or, ``extended``, gave it another slot, as no job waited. Decided on the slot's
    clock and logged after the step (``StepResult.decided``), so a queue rebuilt from its log
    neither signals the run again, nor counts a second preemption, nor ends an extended slot early."""

    job_id: str
    attempt: int
    due_s: float
    extended: bool = False


@dataclass(frozen=True, slots=True)
class HeadWaiting:
    """The head of the queue could not start: its wait for backfilling's aging limit counts from
    ``since_s``, and ``held`` are the GPUs held for it once past the limit ((node, GPU indices)
    each; () before). Decided while planning and logged after the step (``StepResult.noted``),
    so a queue rebuilt from its log holds the same GPUs at the same time -- not the whole limit
    after every restart, which would starve a large job on a head that restarts often."""

    job_id: str
    since_s: float
    held: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeUndrained:
    """The node takes new work again."""

    node: str


Event = (Submitted | EstimateArrived | EstimateFailed | RunStarted | LaunchDeclined | RunEnded | RunSettled
         | CancelRequested | CheckpointRequested | QueuesConfigured | NodeJoined | NodeLost | NodeDraining
         | NodeUndrained | RunEvicted | RunReclaimed | SlotEnded | HeadWaiting)
NodeEvent = RunEnded | RunSettled  # what a node reports of its runs


# ---------------------------------------------------------------------------------- commands
@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class Launch:
    """Start attempt ``attempt`` of a job on exactly these GPUs. A gang has one placement per
    node; its list order is the node rank. ``memory_limit_mib``: the per-GPU limit to enforce
    (MPS pinned memory), so a job that outgrows it fails itself, not its neighbours."""

    job_id: str
    attempt: int
    placements: tuple[Placement, ...]
    memory_limit_mib: float | None
    request: PlacementRequest  # what each node's GPUs must offer (after recovery steps): nodes check it
    resume: bool = False  # an earlier run may have left a checkpoint to resume from

    @property
    def world_size(self) -> int:
        return sum(len(p.gpus) for p in self.placements)


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class SignalCheckpoint:
    """Ask the run to save a checkpoint and exit with the requeue code (SIGUSR1), on each of ``nodes``."""

    job_id: str
    attempt: int
    reason: str
    nodes: tuple[str, ...] = ()


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the run on each of ``nodes``: SIGTERM now, SIGKILL after ``kill_after_s``."""

    job_id: str
    attempt: int
    reason: str
    kill_after_s: float = 10.0
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reject:
    """The job can never run here (admission); it ends ``failed`` with the reason."""

    job_id: str
    reason: str


Command = Launch | SignalCheckpoint | Stop | Reject


# ---------------------------------------------------------------------------------- records
_EVENT_TYPES = {cls.__name__: cls for cls in (Submitted, EstimateArrived, EstimateFailed, RunStarted, LaunchDeclined,
                                               RunEnded, RunSettled, CancelRequested, CheckpointRequested,
                                               QueuesConfigured, NodeJoined, NodeLost, NodeDraining, NodeUndrained,
                                               RunEvicted, RunReclaimed, SlotEnded, HeadWaiting)}


def to_record(event: Event) -> dict[str, Any]:
    """A plain dict (msgpack-able) that ``event_from_record`` turns back into the same event."""
    return {"type": type(event).__name__, **_plain(event)}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` for what events hold (dataclasses, tuples, lists, dicts, immutable
    leaves), without its deep copy of every leaf: that copy was half a submission's cost."""
    names = getattr(type(value), "__dataclass_fields__", None)
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(_plain(item) for item in value)
    if kind is dict:
        return {key: _plain(item) for key, item in value.items()}
    return value


def event_from_record(record: dict[str, Any]) -> Event:
    data = dict(record)
    kind = data.pop("type", None)
    cls = _EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    if cls is Submitted:
        ticket = dict(data["ticket"])
        if ticket.get("retry_exit_codes") is not None:
            ticket["retry_exit_codes"] = tuple(ticket["retry_exit_codes"])
        ticket["needs"] = tuple((name, mib) for name, mib in ticket.get("needs", ()))
        ticket["gpu_types"] = tuple(ticket.get("gpu_types", ()))
        return Submitted(JobTicket(**ticket))
    if cls is EstimateArrived:
        data["needs"] = tuple((name, mib) for name, mib in data.get("needs", ()))
    if cls is RunStarted:
        placements = tuple(Placement(**{**p, "gpus": tuple(p["gpus"])}) for p in data["placements"])
        return RunStarted(data["job_id"], data["attempt"], placements, data.get("started_s"))
    if cls is RunEnded and data.get("failure") is not None:
        data["failure"] = Failure(**data["failure"])
    if cls is QueuesConfigured:
        return QueuesConfigured(_setup_from_record(data))
    if cls is NodeJoined:
        data["gpu_totals_mib"] = tuple(data["gpu_totals_mib"])
        data["gpu_types"] = tuple(data.get("gpu_types", ()))
    if cls is LaunchDeclined:
        data["started"] = tuple(data.get("started", ()))
    if cls is HeadWaiting:
        data["held"] = tuple((node, tuple(gpus)) for node, gpus in data.get("held", ()))
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _setup_from_record(data: dict[str, Any]) -> QueueSetup:
    """A ``QueuesConfigured``'s setup; logs written before priority classes and fair sharing
    held the queues alone (``{"queues": [...]}``)."""
    setup = data.get("setup", {"queues": data.get("queues", ())})
    return QueueSetup(tuple(QueueQuota(**q) for q in setup["queues"]),
                      tuple(PriorityClass(**c) for c in setup.get("priority_classes", ())),
                      **{k: setup[k] for k in ("half_life_s", "reclaim") if k in setup})
