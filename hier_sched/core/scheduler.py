"""The scheduler, once, for both shells: ``Scheduler.step(events, cluster, now_s) -> StepResult``.

A shell *gathers* events (submissions, runs that started or ended, cancels, nodes that came or
went) and GPU snapshots, calls ``step``, and *applies* the commands (launch, checkpoint signal,
stop, reject) — the simulator on its virtual devices and clock, the live GlobalQueue through the
node actors on the wall clock. No clock, no I/O.

A step has fixed phases: the events, each through its handler (a table by event type), then the
time-slot deadlines due, then (given snapshots) one plan. The work is done by parts with one job
each, which this class wires together:

* ``intake.JobIntake``: the door: the need to reserve, admission, into the queue; the nodes known;
* ``lifecycle.JobLifecycle``: the jobs' transitions: runs started, ended, requeued or ended;
* ``job_queue.JobQueue``: the queue in its order, and why each job waits;
* ``launch_ledger.LaunchLedger``: launches no snapshot shows yet, counted by every plan;
* ``time_slots.TimeSlots``: slot deadlines, the checkpoint signal and the end of its grace;
* ``drains.Drains``: drained nodes, closed to new work, their runs moved off (and their deadlines);
* ``team_queue_part``: team queues, always there (one open queue when none is configured);
* ``restart``: after a rebuild from a log, placement waits for every node; reconcile;
* ``scheduler_queries.SchedulerQueries``: the query API, the only way shells read the scheduler.

The plan itself is ``queueing.plan_cycle``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    CancelRequested, CheckpointRequested, Command, EstimateArrived, EstimateFailed, Event, HeadWaiting, Launch,
    LaunchDeclined, NodeDraining, NodeJoined, NodeLost, NodeUndrained, QueuesConfigured, RunEnded, RunEvicted,
    RunReclaimed, RunSettled, RunStarted, SlotEnded, Stop, Submitted,
)
from hier_sched.core.drains import Drains
from hier_sched.core.gpu import Placement, SharingMode
from hier_sched.core.intake import JobIntake
from hier_sched.core.job_queue import JobQueue
from hier_sched.core.launch_ledger import LaunchLedger
from hier_sched.core.learning import PeakLearner
from hier_sched.core.lifecycle import JobLifecycle
from hier_sched.core.managed_job import ManagedJob, where
from hier_sched.core.placement import PlacementRequest, memory_requirement
from hier_sched.core.queueing import launch_request, note_blocked_head, plan_cycle
from hier_sched.core.restart import owed_stops, reconcile
from hier_sched.core.runtimes import RuntimeHistory
from hier_sched.core.scheduler_config import SchedulerConfig
from hier_sched.core.scheduler_queries import SchedulerQueries
from hier_sched.core.team_queue_part import OpenQueue, team_queues_for

__all__ = ["Scheduler", "StepResult"]

Handler = Callable[[Any, float, list[Command]], None]  # (event, now_s, commands out)


@dataclass(slots=True)
class StepResult:
    commands: list[Command] = field(default_factory=list)
    wake_at_s: float | None = None  # call step again by then even if nothing happens (slots)
    plan_at_s: float | None = None  # call step with snapshots by then even if nothing happens
    planned: bool = False
    # Events the core decided itself (a slot's end, a run reclaimed for a team queue, a drain's
    # deadline ending runs), applied already: a shell that keeps a log writes them after the
    # step's own, so a rebuild decides the same.
    decided: list[Event] = field(default_factory=list)
    # Likewise for planning state a rebuild should keep, which no job's safety rests on (a blocked
    # head's wait and its held GPUs: ``HeadWaiting``): a shell may write them without waiting for
    # its disk; lost in a crash, the head waits its limit again.
    noted: list[Event] = field(default_factory=list)


class Scheduler(SchedulerQueries):
    """The pure scheduler: all jobs, the queue, and the rules. No clock, no I/O."""

    def __init__(self, config: SchedulerConfig, *, peaks: PeakLearner | None = None,
                 runtimes: RuntimeHistory | None = None, mig: bool = False):
        self.config = config
        self.peaks = peaks if peaks is not None else PeakLearner()
        self.runtimes = runtimes if runtimes is not None else RuntimeHistory()
        self.jobs: dict[str, ManagedJob] = {}
        self.job_queue = JobQueue(config.queue.gangs_first)
        self.ledger = LaunchLedger()
        node_types: dict[str, str] = {}
        self.lifecycle = JobLifecycle(self.jobs, self.job_queue, self.ledger, config.recovery, self.peaks,
                                      self.runtimes, node_types)
        self.intake = JobIntake(self.jobs, self.lifecycle, self.peaks, node_types, mig=mig)
        lc, intake = self.lifecycle, self.intake
        self.drains = Drains(lc.with_runs, lc.preempt, lc.on_run_evicted)
        self.teams = OpenQueue()
        self.rr_cursor = 0
        self.cycles = 0
        # After a restart from a log, nothing is placed until every node has answered once (or is
        # lost): see ``restart``.
        self._unheard: set[str] = set()
        # When a plan should run again though nothing happens: a run becomes old enough to be
        # preempted for a queue owed its share (``team_queues.preemptions``).
        self._plan_at_s: float | None = None
        self._handlers: dict[type[Event], Handler] = {
            Submitted: intake.on_submitted,
            EstimateArrived: intake.on_estimate_arrived,
            EstimateFailed: lc.on_estimate_failed,
            RunEnded: lc.on_run_ended,
            RunStarted: lc.on_run_started,
            RunSettled: lc.on_run_settled,
            LaunchDeclined: lc.on_launch_declined,
            CancelRequested: lc.on_cancel,
            CheckpointRequested: lc.on_checkpoint_requested,
            QueuesConfigured: self._on_queues_configured,
            NodeJoined: self._on_node_joined,
            NodeLost: self._on_node_lost,
            NodeDraining: self.drains.on_draining,
            NodeUndrained: self.drains.on_undrained,
            RunEvicted: lc.on_run_evicted,
            RunReclaimed: lc.on_run_reclaimed,
            SlotEnded: lc.slots.on_slot_ended,
            HeadWaiting: lc.on_head_waiting,
        }

    @property
    def teams(self) -> OpenQueue:
        """The team-queue part (``team_queue_part``): one open queue until queues are configured."""
        return self._teams

    @teams.setter
    def teams(self, part: OpenQueue) -> None:
        self._teams = self.lifecycle.teams = self.intake.teams = part

    @property
    def unshown_launches(self) -> dict[str, ManagedJob]:
        """Job id -> its run launched that no snapshot shows yet (``launch_ledger``)."""
        return self.ledger.unshown

    # ------------------------------------------------------------------ the step
    def step(self, events: Iterable[Event], cluster: ClusterIndex | None, now_s: float) -> StepResult:
        """Apply ``events``, act on due slot deadlines, and (given snapshots) place what can start."""
        out = StepResult()
        commands = out.commands
        self._teams.advance(now_s)  # decayed use up to now, for this step's order and the views after it
        for event in events:
            self._apply(event, now_s, commands)
        slots, drains = self.lifecycle.slots, self.drains
        if (due := slots.next_at) is not None and due <= now_s:
            out.decided += slots.act(now_s, commands)
        if (due := drains.next_at) is not None and due <= now_s:
            out.decided += drains.act(now_s, commands)
        if cluster is not None and self.job_queue and not self._unheard:
            self._plan(cluster, now_s, out)
            out.planned = True
        out.wake_at_s = min((t for t in (slots.next_at, drains.next_at) if t is not None), default=None)
        if self._plan_at_s is not None and self._plan_at_s <= now_s and out.planned:
            self._plan_at_s = None
        out.plan_at_s = self._plan_at_s
        return out

    def apply(self, events: Iterable[Event], now_s: float) -> list[Command]:
        """Events only, no planning (rebuilding from a log; commands are for the caller to drop
        or reconcile)."""
        commands: list[Command] = []
        for event in events:
            self._apply(event, now_s, commands)
        return commands

    def rebuild(self, events: Iterable[tuple[Event, float]]) -> list[Stop]:
        """Rebuild from a log of ``(event, time)``: the events are applied (their commands dropped:
        what they caused is in the log too, or is found again when the nodes report), placement is
        held until every node has answered (``heard_from``), and the stops still owed are returned
        (runs whose cancel was logged, to stop again)."""
        dropped: list[Command] = []
        replayed = False
        for event, now_s in events:
            self._apply(event, now_s, dropped)
            replayed = True
        if replayed:
            self._unheard = set(self.intake.nodes)
        return owed_stops(self.jobs)

    def allow_autoscaled(self, nodes: Mapping[str, tuple[float, ...]], types: Mapping[str, str]) -> None:
        """Admit jobs that only nodes an autoscaler may add could hold (``JobIntake.allow_autoscaled``)."""
        self.intake.allow_autoscaled(nodes, types)

    def heard_from(self, nodes: Iterable[str]) -> None:
        """These nodes answered (their runs are known): placement no longer waits for them."""
        self._unheard.difference_update(nodes)

    def reconcile(self, node: str, runs: Iterable[tuple[str, int, Placement]]) -> tuple[list[Event], list[Stop]]:
        """What a node says it runs against what the scheduler knows (``restart.reconcile``)."""
        return reconcile(self.jobs, node, runs)

    # ------------------------------------------------------------------ events
    def _apply(self, event: Event, now_s: float, out: list[Command]) -> None:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise TypeError(f"not a scheduler event: {event!r}")
        handler(event, now_s, out)

    def _on_node_joined(self, e: NodeJoined, now_s: float, out: list[Command]) -> None:
        self.intake.node_joined(e.node, e.gpu_totals_mib, e.gpu_type)
        self._teams.capacity_changed(self.intake.nodes)

    def _on_node_lost(self, e: NodeLost, now_s: float, out: list[Command]) -> None:
        self.intake.node_lost(e.node)
        self._unheard.discard(e.node)
        self._teams.capacity_changed(self.intake.nodes)
        self.lifecycle.node_lost(e, now_s, out)

    def _on_queues_configured(self, e: QueuesConfigured, now_s: float, out: list[Command]) -> None:
        """The queues from now on; what each one uses is counted again from the runs, and their
        decayed use carries over (no queues: one open queue)."""
        self.teams = team_queues_for(e.setup, self._teams, self.config, self.jobs, self.job_queue.order,
                                     self.intake.nodes, self.lifecycle.reclaim, now_s)

    # ------------------------------------------------------------------ placement
    def _plan(self, cluster: ClusterIndex, now_s: float, result: StepResult) -> None:
        self.cycles += 1
        out = result.commands
        cluster.close(self.drains.closed())
        self.ledger.count_unshown_runs(cluster)
        cfg = self.config
        queue = self.job_queue
        order = self._teams.cycle_order(queue.order, turns=cfg.queue.backfill_depth + 1)
        plan = plan_cycle(order, cluster, cfg.placement, cfg.queue, now_s, rr_cursor=self.rr_cursor,
                          expected_end=self.runtimes.expected_end, ordered=True, quotas=self._teams)
        self.rr_cursor = plan.rr_cursor
        queue.planned(plan.waiting, order)  # every queued job that did not start: why (the plan's words)
        for q, placements in plan.placements:
            job = self.jobs[q.job_id]
            self.lifecycle.start(job, placements, now_s, f"on {where(placements)} ({placements[0].reason}; "
                                                         f"reserved {placements[0].reserved_mib:.0f} MiB)")
            req = launch_request(q, cluster, placements[0].node, cfg.queue)
            out.append(Launch(q.job_id, job.record.attempts, placements, self._memory_limit(req, cluster), req,
                              job.may_resume))
        if plan.head is not None:
            head = queue[plan.head]
            if note_blocked_head(head, plan, now_s):
                result.noted.append(HeadWaiting(head.job_id, head.waiting_since_s, head.held))  # type: ignore[arg-type]
        ready_at = self._teams.preempt(cluster, plan.placements, queue.waiting, now_s, out, result.decided)
        if ready_at is not None and (self._plan_at_s is None or self._plan_at_s <= now_s or ready_at < self._plan_at_s):
            self._plan_at_s = ready_at

    def _memory_limit(self, req: PlacementRequest, cluster: ClusterIndex) -> float | None:
        """The MPS pinned-memory limit: the free memory the gate asked for, so a job that outgrows
        its estimate fails itself, not its neighbour. None without an estimate, outside MPS, and on
        idle GPUs of its own (the last recovery step, the exclusive policy)."""
        if (not self.config.placement.mps_memory_limit or cluster.sharing is not SharingMode.MPS or req.exclusive
                or (req.need_mib is None and req.min_free_mib is None)):
            return None
        return memory_requirement(req, self.config.placement)[0]

