"""The simulated world: emulated GPUs, the jobs' progress on them, and the timeline of what
happens there — everything of a replay except the scheduling.

A shell drives it: ``pop_instant`` jumps to the next instant and turns what happened there
(arrivals, runs that finished, crashed with OOM, exited after a checkpoint, failed) into core
events; ``carry_out`` applies the core's commands to the devices (launch, checkpoint signal,
stop) and returns the events they cause at once. The simulator (``replay.engine``) is one such
shell; the parity test drives the live queue's service over the same world.

Nodes report late, as live ones do: what happens on a node's devices reaches the planner with
the node's next report, ``report_delay_s`` later (by default the live queue's tick plus the
report's round trip) -- the GPUs' state in the planner's snapshots and the node's run events
alike. Meanwhile the planner works from the last report, and a launch is checked by the node
against its devices as they are (``verify_placement``, the live node's rule): a launch that no
longer fits is declined. ``report_delay_s=0`` reports every change at once.

What happens to a job on its GPUs is the device model's business: a job attaches (CUDA context
and activity) at launch, allocates its peak when its warm-up ends, and fails with OOM there if
the GPU cannot give it that memory. Speed under collocation is ``training_rate``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from hier_sched.core.events import (
    Event, Launch, LaunchDeclined, NodeJoined, NodeLost, Reject, RunEnded, RunSettled, SignalCheckpoint, Stop,
)
from hier_sched.core.failures import REQUEUE_EXIT_CODE, Failure
from hier_sched.core.gpu import Placement
from hier_sched.core.gpu_types import gpu_type
from hier_sched.core.job import JobState
from hier_sched.core.learning import settled_reservation
from hier_sched.core.placement import PlacementConfig, verify_placement
from hier_sched.core.slots import SLOT_GRACE_S
from hier_sched.core.views import JobView
from hier_sched.device.gpu_model import GpuOutOfMemory, JobActivity, training_rate, warmup_s
from replay.cluster import REPORT_DELAY_S, ClusterShape, SimCluster, SimGpu
from traces.schema import Trace, TraceJob

__all__ = ["SlotSettings", "SimJob", "SimWorld", "ARRIVAL"]

# Device-side happenings, in the order they are handled within one instant (a node's report
# first: it tells what was there before the instant's changes).
REPORT, FINISH, ALLOC, CKPT_EXIT, ARRIVAL, EXTERNAL, SLOT, WAKE = range(8)
_FAILED_EXIT = 1  # a trace job marked failed exits with this code at its end

_STATE_NAMES = {JobState.SUCCEEDED: "done", JobState.FAILED: "failed", JobState.QUEUED: "queued",
                JobState.RUNNING: "running", JobState.CHECKPOINTING: "checkpointing", JobState.CANCELLED: "cancelled"}


CHECKPOINT_S = 60.0  # time a job needs to write its checkpoint after the signal


@dataclass(frozen=True, slots=True)
class SlotSettings:
    """The cluster's fixed time slots with the checkpoint-signal protocol (thesis Ch. 7.3): a slot
    that ends while nobody waits is extended."""

    length_s: float
    grace_s: float = SLOT_GRACE_S
    checkpoint_s: float = CHECKPOINT_S

@dataclass(slots=True)
class SimJob:
    """A trace job's life on the emulated devices; its lifecycle lives in the core (``managed``)."""

    trace: TraceJob
    managed: JobView | None = None  # set once submitted
    rejected: bool = False  # admission refused it
    remaining_s: float = 0.0  # solo-seconds of work left
    rate: float = 1.0
    progress_at_s: float = 0.0
    run_id: int = 0  # changes at every launch and stop: ALLOC/CKPT_EXIT events of older runs are void
    finish_version: int = 0  # changes with every new speed: older FINISH events are void
    attempt: int = 0  # the core's attempt number of the run on the devices
    lost_attempt: int | None = None  # a gang run lost with a node: the core's stop of its other ranks ends it
    gpus: list[SimGpu] = field(default_factory=list)
    placements: tuple[Placement, ...] = ()
    peak_mib: float = 0.0  # of the current run, once allocated
    run_started_s: float = 0.0  # of the current run: where it resumed from its last checkpoint (or began)
    signalled_s: float | None = None  # when the current run got the checkpoint signal (a reclaim, a slot's end)
    preemption_lost_gpu_s: float = 0.0  # GPU-time of signalled runs stopped before they saved: redone
    preemption_saving_gpu_s: float = 0.0  # GPU-time of signalled runs from the signal to their exit

    @property
    def state(self) -> str:
        if self.rejected:
            return "unschedulable"
        return "pending" if self.managed is None else _STATE_NAMES[self.managed.state]

    @property
    def attempts(self) -> int:
        return self.managed.attempts if self.managed else 0

    @property
    def oom_crashes(self) -> int:
        return self.managed.oom_crashes if self.managed else 0

    @property
    def checkpoints(self) -> int:
        return self.managed.checkpoints if self.managed else 0

    @property
    def first_start_s(self) -> float | None:
        return self.managed.start_time if self.managed else None

    @property
    def end_s(self) -> float | None:
        return None if self.managed is None or self.rejected else self.managed.end_time

    @property
    def exec_s(self) -> float:
        return self.managed.executed_s if self.managed else 0.0

    @property
    def reason(self) -> str:
        return self.managed.reason if self.managed else ""


class SimWorld:
    def __init__(self, trace: Trace, shape: ClusterShape, *, placement: PlacementConfig,
                 slots: SlotSettings | None = None, window: int = 30, record_series: bool | None = None,
                 report_delay_s: float = REPORT_DELAY_S):
        if report_delay_s < 0:
            raise ValueError(f"report_delay_s must be >= 0 (got {report_delay_s})")
        self.trace = trace
        self.cluster = SimCluster(shape, window=window, record_series=record_series)
        self.placement = placement  # the node's check of a launch order
        self.launch_grace_s = placement.launch_grace_s
        self.report_delay_s = report_delay_s
        self._unreported: dict[str, set[SimGpu]] = {}  # node -> GPUs changed since its last report
        self._held: dict[str, list[Event]] = {}  # node -> run events waiting for its next report
        # A node's next report is an instant of its own (REPORT) when it brings news the planner
        # acts on (runs that ended or settled, memory freed); a report of launches only (memory
        # taken) is made quietly, at the first instant after it is due. node -> the report's
        # number (REPORT) or due time (quiet): a report superseded by another is dropped.
        self._reporting: dict[str, int] = {}
        self._quiet: list[tuple[float, str]] = []
        self._quiet_due: dict[str, float] = {}
        self.slots = slots
        self.window = window
        self.jobs: dict[str, SimJob] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.external: dict[int, Event] = {}  # events injected from outside (e.g. a user's cancel)
        self._seq = 0
        self.now = 0.0
        self.events = 0
        self.last_util_change_s = -math.inf
        self._wake_at = math.inf
        self._slot_wake_at = math.inf
        self._reference_speed = gpu_type(trace.duration_gpu).relative_speed if trace.duration_gpu else None
        for tj in trace.jobs:
            self.add_job(tj)
        first_submit = min((tj.submit_s for tj in trace.jobs), default=0.0)
        for g in self.cluster.all_gpus():  # energy and windows start with the trace
            g.last_power_s = g.last_flush_s = first_submit

    def add_job(self, tj: TraceJob) -> None:
        """One more job, arriving at its ``submit_s`` (or now, if that has passed)."""
        if tj.job_id in self.jobs:
            raise ValueError(f"job {tj.job_id!r} is already in the simulation")
        self.jobs[tj.job_id] = SimJob(tj, remaining_s=tj.duration_s)
        self._push(max(tj.submit_s, self.now), ARRIVAL, tj.job_id)

    def inject(self, t: float, event: Event) -> None:
        """Have ``event`` happen at ``t`` (it comes out of ``pop_instant`` like the devices' own)."""
        self._push(t, EXTERNAL, "", id(event))
        self.external[id(event)] = event

    # -- the timeline -----------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, job_id, version))

    def pop_instant(self) -> tuple[list[TraceJob], list[Event], list[Event], bool, bool] | None:
        """Jump to the next instant: (arrivals, the devices' events, injected events, whether
        placement should run, whether a slot deadline is due), or None when nothing is left."""
        heap = self.heap
        if not heap:
            return None
        t = heap[0][0]
        self.now = t
        self.cluster.now_s = t
        arrivals: list[TraceJob] = []
        events: list[Event] = []
        external: list[Event] = []
        dirty = slot_due = False
        quiet = self._quiet
        while quiet and quiet[0][0] <= t:
            due, node = heapq.heappop(quiet)
            if self._quiet_due.get(node) == due:
                del self._quiet_due[node]
                self.cluster.report(self._unreported.pop(node, ()))
        while heap and heap[0][0] == t:
            _, kind, _, job_id, version = heapq.heappop(heap)
            self.events += 1
            if kind == REPORT:  # (``job_id``: the node)
                if self._reporting.get(job_id) == version:
                    del self._reporting[job_id]
                    held = self._held.pop(job_id, ())
                    events += held
                    dirty |= self.cluster.report(self._unreported.pop(job_id, ())) or bool(held)
            elif kind == SLOT:  # a slot deadline is due: the core decides (no placement for this alone)
                self._slot_wake_at = math.inf
                slot_due = True
            elif kind == ARRIVAL:
                arrivals.append(self.jobs[job_id].trace)
                dirty = True
            elif kind == EXTERNAL:
                event = self.external.pop(version)
                if isinstance(event, NodeLost):
                    self.lose_node(event.node)
                elif isinstance(event, NodeJoined):
                    self.rejoin_node(event.node)
                external.append(event)
                dirty = True
            else:
                dirty |= self._handle(kind, job_id, version, events)
        return arrivals, events, external, dirty, slot_due

    def after_step(self, wake_at_s: float | None, planned_with_queue: bool, plan_at_s: float | None = None) -> None:
        """Come back when the core asked to (slot deadlines; a plan at ``plan_at_s``) and when
        monitoring has settled."""
        if wake_at_s is not None and wake_at_s < self._slot_wake_at:
            self._slot_wake_at = wake_at_s
            self._push(wake_at_s, SLOT)
        if plan_at_s is not None and self.now < plan_at_s < self._wake_at:
            self._wake_at = plan_at_s
            self._push(plan_at_s, WAKE)
        if planned_with_queue:  # windows keep moving for ``window`` s after a change: look again then
            settle = self.last_util_change_s + self.window
            if self.now < settle < self._wake_at:
                self._wake_at = settle
                self._push(settle, WAKE)

    def finish(self) -> None:
        end = self.makespan_end
        for g in self.cluster.all_gpus():
            g.before_change(end)

    @property
    def makespan_end(self) -> float:
        ends = [j.end_s for j in self.jobs.values() if j.end_s is not None]
        return max(ends, default=self.now)

    def _handle(self, kind: int, job_id: str, version: int, events: list[Event]) -> bool:
        """Turn one device-side happening into scheduler events (at once, or with the node's next
        report); True when placement should run now."""
        if kind == WAKE:
            self._wake_at = math.inf
            return True
        job = self.jobs[job_id]
        if version != (job.finish_version if kind == FINISH else job.run_id):
            return False  # superseded: a newer speed, or a run that already ended
        nodes = [p.node for p in job.placements]  # each node reports its own part (a gang's rank), as live ones do
        if kind == FINISH:
            self._stop_running(job, lose_progress=False)
            job.remaining_s = 0.0
            code = job.trace.exit_code
            failure = Failure("error", f"exit code {code}", code) if code else None
            made: list[Event] = [RunEnded(job_id, job.attempt, failure, code, job.peak_mib or None, n) for n in nodes]
        elif kind == ALLOC:
            made = self._allocate(job, nodes)
        else:  # CKPT_EXIT
            job.preemption_saving_gpu_s += job.trace.gpus * (self.now - job.signalled_s)
            self._stop_running(job, lose_progress=False)
            made = [RunEnded(job_id, job.attempt, Failure("checkpoint_requeue", "checkpointed"), REQUEUE_EXIT_CODE, None, n)
                    for n in nodes]
        if not self.report_delay_s:
            events += made
        else:  # the devices changed too: the nodes' reports are on their way
            for node, event in zip(nodes, made):
                self._held.setdefault(node, []).append(event)
        return not self.report_delay_s

    def lose_node(self, node: str) -> None:
        """The node and what ran there are gone (a gang loses its whole run: its other ranks can
        go on no further), with the news it had not reported yet; the node is offered no more."""
        for g in self.cluster.gpus[node]:
            for job_id in list(g.device.residents):
                job = self.jobs[job_id]
                if len(job.placements) > 1:  # its ranks elsewhere end when the core stops them
                    job.lost_attempt = job.attempt
                self._stop_running(job, lose_progress=True)
        for pending in (self._held, self._unreported, self._reporting, self._quiet_due):
            pending.pop(node, None)
        self.cluster.lose(node)

    def rejoin_node(self, node: str) -> None:
        """A lost node is back, empty (it reports at once: that is how it rejoins)."""
        self.cluster.rejoin(node)

    def _changed(self, g: SimGpu, news: bool = True) -> None:
        """GPU ``g`` changed: its node reports it, at once or ``report_delay_s`` from now. Without
        ``news`` (a launch: memory taken) the report is quiet, unless one with news goes first."""
        if not self.report_delay_s:
            self.cluster.report((g,))
            return
        node = g.node
        first = node not in self._unreported
        self._unreported.setdefault(node, set()).add(g)
        if node in self._reporting:
            return
        due = self.now + self.report_delay_s
        if news:
            self._quiet_due.pop(node, None)  # this report carries the quiet one's changes too
            self._seq += 1
            self._reporting[node] = self._seq
            self._push(due, REPORT, node, self._seq)
        elif first:
            self._quiet_due[node] = due
            heapq.heappush(self._quiet, (due, node))

    # -- commands ---------------------------------------------------------------------------
    def carry_out(self, commands) -> list[Event]:
        """Apply the core's commands to the devices; returns the events they cause at once (a
        launch whose CUDA context does not fit, a stopped run)."""
        caused: list[Event] = []
        for cmd in commands:
            kind = type(cmd)
            if kind is Launch:
                event = self._declined(cmd) or self._launch(self.jobs[cmd.job_id], cmd)
                if event is not None:
                    caused.append(event)
            elif kind is SignalCheckpoint:
                job = self.jobs[cmd.job_id]
                if job.signalled_s is None:
                    job.signalled_s = self.now
                # Without slots the signal is a quota reclaim's; its grace is the job's (``SLOT_GRACE_S``).
                saved_s = min(self.slots.checkpoint_s, self.slots.grace_s) if self.slots else min(CHECKPOINT_S, SLOT_GRACE_S)
                self._push(self.now + saved_s, CKPT_EXIT, cmd.job_id, job.run_id)
            elif kind is Reject:  # admission: no GPU of this cluster can ever hold it
                self.jobs[cmd.job_id].rejected = True
            elif kind is Stop:  # a cancel, the slot's end before the checkpoint was written, a gang's other ranks
                job = self.jobs[cmd.job_id]
                if job.gpus:
                    if job.signalled_s is not None:  # preempted, and its checkpoint not written: the run is lost
                        job.preemption_lost_gpu_s += job.trace.gpus * (self.now - job.run_started_s)
                    self._stop_running(job, lose_progress=True)
                elif job.lost_attempt != cmd.attempt:
                    continue  # nothing of that run is here
                # (else: a gang whose rank was lost with its node lost its whole run here at once, in
                # ``lose_node``; the core, as live, waits for its other ranks' end, reported as their nodes would)
                job.lost_attempt = None
                caused.append(RunEnded(cmd.job_id, cmd.attempt, Failure("killed", cmd.reason), 143))
        return caused

    def _declined(self, cmd: Launch) -> LaunchDeclined | None:
        """The nodes check the order against their devices as they are now, as live nodes do (a
        gang is declined whole if one of its nodes declines); the planner hears of a decline at
        once and plans again with the nodes' next reports. A node that has reported every change
        is what the planner saw: nothing to check there."""
        unreported = self._unreported
        if not any(p.node in unreported for p in cmd.placements):
            return None  # the nodes' last reports are their devices as they are: the planner saw them
        for p in cmd.placements:
            if p.node not in unreported:
                continue
            problem = verify_placement(cmd.request, self.cluster.fresh_snapshot(p.node, p.gpus), p.gpus,
                                       self.placement, self.now)
            if problem is not None:
                self._push(self.now + self.report_delay_s, WAKE)
                return LaunchDeclined(cmd.job_id, cmd.attempt, f"{p.node}: {problem}")
        return None

    # -- the devices ------------------------------------------------------------------------
    def _launch(self, job: SimJob, cmd: Launch) -> RunEnded | None:
        tj = job.trace
        job.attempt = cmd.attempt
        job.placements = cmd.placements
        job.run_id += 1
        job.gpus = []
        job.peak_mib = 0.0
        job.progress_at_s = job.run_started_s = self.now
        job.signalled_s = None
        activity = JobActivity(tj.smact, tj.smocc, tj.drama)
        try:
            for p in cmd.placements:
                for idx in p.gpus:
                    g = self.cluster.gpus[p.node][idx]
                    g.before_change(self.now)
                    g.last_launch_s = self.now
                    g.device.attach(tj.job_id, activity, mem_limit_mib=cmd.memory_limit_mib)  # its CUDA context
                    g.reserved[tj.job_id] = p.reserved_mib
                    g.attempts[tj.job_id] = cmd.attempt
                    g.multi_gpu_jobs += tj.gpus > 1
                    g.after_change(self.now)
                    self._changed(g, news=False)
                    job.gpus.append(g)
        except GpuOutOfMemory as oom:
            g.after_change(self.now)
            return self._oom(job, oom)
        self.last_util_change_s = self.now
        self._push(self.now + self.launch_grace_s, WAKE)  # the GPUs are offered again
        self._push(self.now + warmup_s(tj.duration_s), ALLOC, tj.job_id, job.run_id)
        self._rerate(job.gpus)
        return None

    def _allocate(self, job: SimJob, nodes: list[str]) -> list[Event]:
        """The job's warm-up ends: it allocates its peak (or crashes with OOM) and, as a job using
        ``hier_sched.memory_settled`` does after its first steps, reports its memory settled; an
        event for each of its ``nodes``."""
        tj = job.trace
        touched = list(job.gpus)
        for g in job.gpus:
            g.before_change(self.now)
        try:
            for g in job.gpus:
                g.device.allocate_peak(tj.job_id, tj.peak_mib)
        except GpuOutOfMemory as oom:
            for g in touched:
                g.after_change(self.now)
            e = self._oom(job, oom)
            return [RunEnded(e.job_id, e.attempt, e.failure, e.exit_code, e.peak_mib, n) for n in nodes]
        job.peak_mib = max(g.device.job_memory_mib(tj.job_id) for g in touched)
        settled = settled_reservation(job.placements[0].reserved_mib, job.peak_mib)
        for g in touched:
            g.reserved[tj.job_id] = settled
            g.after_change(self.now)
            self._changed(g)
        self.last_util_change_s = self.now
        return [RunSettled(tj.job_id, job.attempt, settled, n) for n in nodes]

    def _oom(self, job: SimJob, oom: GpuOutOfMemory) -> RunEnded:
        self._stop_running(job, lose_progress=True)
        failure = Failure("oom", f"CUDA out of memory: tried {oom.requested_mib:.0f} MiB, {oom.free_mib:.0f} MiB free")
        return RunEnded(job.trace.job_id, job.attempt, failure, 1, oom.wanted_mib)

    def _stop_running(self, job: SimJob, *, lose_progress: bool) -> None:
        """Detach the job from its GPUs and account its progress."""
        self._account_progress(job)
        job.run_id += 1
        job.finish_version += 1
        released = []
        for g in job.gpus:
            g.before_change(self.now)
            g.reserved.pop(job.trace.job_id, None)
            g.attempts.pop(job.trace.job_id, None)
            g.device.detach(job.trace.job_id)
            g.multi_gpu_jobs -= job.trace.gpus > 1
            g.after_change(self.now)
            self._changed(g)
            released.append(g)
        job.gpus = []
        if lose_progress:
            job.remaining_s = job.trace.duration_s
        self.last_util_change_s = self.now
        self._rerate(released)

    # -- speed ------------------------------------------------------------------------------
    def _account_progress(self, job: SimJob) -> None:
        job.remaining_s -= (self.now - job.progress_at_s) * job.rate
        job.progress_at_s = self.now

    def _rerate(self, gpus: list[SimGpu]) -> None:
        """Collocation changed on these GPUs: new speeds and finish times for their residents."""
        seen: set[str] = set()
        for g in gpus:
            for job_id in g.device.residents:
                if job_id in seen:
                    continue
                seen.add(job_id)
                job = self.jobs[job_id]
                self._account_progress(job)
                job.rate = training_rate([x.device for x in job.gpus], job_id, self._reference_speed)
                job.finish_version += 1
                self._push(self.now + max(job.remaining_s, 0.0) / job.rate, FINISH, job_id, job.finish_version)
