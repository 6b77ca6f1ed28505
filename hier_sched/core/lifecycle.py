"""The job lifecycle, once, for both shells: ``Scheduler.step(events, cluster, now_s) -> StepResult``.

A shell *gathers* events (submissions, runs that started or ended, cancels, nodes that came
or went) and GPU snapshots, calls ``step``, and *applies* the commands (launch, checkpoint
signal, stop, reject) — the simulator on its virtual devices and clock, the live GlobalQueue
through the node actors on the wall clock. Everything between is here: admission, the queue
and its order, placement (``plan_cycle``), OOM recovery with stepwise margins, the retry rule
for other failures, fixed time slots with the checkpoint signal, learned peaks and run times,
and why each waiting job waits.

A launch takes effect at once: the job is running from the step that launched it, with a new
attempt number. A shell whose node refuses the launch (its fresh snapshot no longer fits)
says so with ``LaunchDeclined``, and the attempt is taken back. ``RunStarted`` confirms (or,
after a restart, re-adopts) a run; both it and ``RunEnded`` name their attempt, so an event
about an earlier run — late, or replayed from a log — changes nothing.

Snapshots arrive late: a node reports a launch some time after the scheduler ordered it. Until
a node's snapshots show a run, the scheduler counts the run there itself (``_assume``): its
reservation is taken on its GPUs, which are in their post-launch grace, for every plan — so no
GPU is ever planned beyond its capacity on a snapshot older than the scheduler's own orders.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType
from typing import Any

from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    CancelRequested, CheckpointRequested, Command, EstimateArrived, EstimateFailed, Event, JobTicket, Launch,
    LaunchDeclined, NodeJoined, NodeLost, QueuesConfigured, Reject, RunEnded, RunSettled, RunStarted, SignalCheckpoint, Stop, Submitted,
)
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import Placement, SharingMode
from hier_sched.core.job import JobRecord, JobState
from hier_sched.core.learning import PeakLearner
from hier_sched.core.placement import PlacementRequest, memory_requirement
from hier_sched.core.presets import SchedulerConfig
from hier_sched.core.queueing import (
    NO_NODE_HAS, QueuedJob, WaitReasons, launch_request, note_blocked_head, placement_request, plan_cycle,
    queue_key,
)
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quotas import Charge, QueueSetup, resolve_priority, resolve_queue
from hier_sched.core.reclaim_room import Room
from hier_sched.core.recovery import decide_after_failure
from hier_sched.core.runtimes import RuntimeHistory
from hier_sched.core.team_queues import Entitlements, by_queue, cycle_order, entitlements, preemptions
from hier_sched.core.views import JobView, SchedulerCounts
from hier_sched.core.units import gib

__all__ = ["Scheduler", "StepResult", "ManagedJob", "wait_reason", "USABLE_NOTE"]

USABLE_NOTE = "usable = free minus the"  # how a wait reason explains the reserve (``top`` leaves it out)

_SIGNAL, _SLOT_END = 0, 1  # slot deadlines: checkpoint signal (end - grace), end of slot or grace
# A gang's ranks that started when another node declined its part: the run never really began
# (no rendezvous without every rank), so there is nothing to save; killed soon.
GANG_DECLINED_KILL_AFTER_S = 3.0


@dataclass(slots=True)
class ManagedJob:
    """One job as the scheduler keeps it: the public record, the queue entry and the run."""

    ticket: JobTicket
    record: JobRecord
    queued: QueuedJob
    placements: tuple[Placement, ...] = ()  # of the current run
    run_started_s: float | None = None
    executed_s: float = 0.0  # run time of the runs that ended
    other_failures: int = 0
    cancel_requested: bool = False
    lost_runs: int = 0  # runs that ended without a checkpoint (slot end, node lost): redone from the last one
    nodes_ran: list[str] = field(default_factory=list)  # every node a run went to, first time first (logs)
    ranks_running: set[str] = field(default_factory=set)  # a gang's nodes whose rank has not ended yet
    ranks_requeue: bool = False  # a rank of this gang run exited to be requeued (checkpointed)
    preemptions: int = 0  # checkpoint signals at the end of a time slot or to reclaim a queue's quota
    reclaimed_for: str | None = None  # the queue its run was signalled to make room for (``quotas``)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placements)

    @property
    def may_resume(self) -> bool:
        """An earlier run may have left a checkpoint: it checkpointed, or lost a run (slot end, node
        lost) after which the job resumes from its last checkpoint, if any."""
        return self.record.checkpoints > 0 or self.lost_runs > 0


@dataclass(slots=True)
class StepResult:
    commands: list[Command] = field(default_factory=list)
    wake_at_s: float | None = None  # call step again by then even if nothing happens (slots)
    plan_at_s: float | None = None  # call step with snapshots by then even if nothing happens
    planned: bool = False


class Scheduler:
    """The pure scheduler: all jobs, the queue, and the rules. No clock, no I/O."""

    def __init__(self, config: SchedulerConfig, *, peaks: PeakLearner | None = None,
                 runtimes: RuntimeHistory | None = None, mig: bool = False):
        self.config = config
        self.peaks = peaks if peaks is not None else PeakLearner()
        self.runtimes = runtimes if runtimes is not None else RuntimeHistory()
        self.mig = mig
        self.jobs: dict[str, ManagedJob] = {}
        self.queue: dict[str, QueuedJob] = {}  # read-only outside: ``_enqueue`` / ``_dequeue`` keep _order with it
        # The queue in queue order, kept sorted as jobs come and go, so that a step over a long
        # queue does not sort it again (a job's key does not change while it waits).
        self._order: list[QueuedJob] = []
        self._key = partial(queue_key, gangs_first=config.queue.gangs_first)
        self.nodes: dict[str, tuple[float, ...]] = {}  # node -> per-GPU memory (admission)
        self.node_types: dict[str, str] = {}  # node -> its GPU type ("" when it did not say)
        self._admission: AdmissionIndex | None = None  # built on demand, dropped when nodes change
        # nodes an autoscaler may add (name -> per-GPU memory, GPU type): admission counts them,
        # placement does not (``allow_autoscaled``)
        self.autoscaled_nodes: dict[str, tuple[float, ...]] = {}
        self.autoscaled_types: dict[str, str] = {}
        self.rr_cursor = 0
        self.cycles = 0
        self.ended = 0  # jobs in a terminal state
        self._seq = 0
        self._deadlines: list[tuple[float, int, int, str, int]] = []  # (t, kind, seq, job, attempt)
        # Runs launched (or adopted) that the nodes' snapshots have not shown yet: counted by
        # every plan until they do (``_assume``), or until the run ends or is declined.
        self.unconfirmed: dict[str, ManagedJob] = {}
        # Queued job -> why it did not start (last plan). It reads ``_order`` for the jobs the plan
        # did not look at, so every change of ``_order`` is reported to it (``queue_changed``).
        self.waiting = WaitReasons()
        self._waiting_reads_order = True  # ``waiting``'s rest is a range of ``_order`` (see ``_plan``)
        # After a restart from a log, nothing is placed until every node has answered once (or is
        # lost): a node that took a launch order just before the crash reports that run in its
        # first answer, and it is re-adopted (``reconcile``); placed before that answer, the job
        # could start a second time elsewhere (found by the chaos benchmark's review, RELIABILITY.md).
        self._unheard: set[str] = set()
        # Team queues with quotas (``quota_book``); None: none configured, today's scheduler.
        self.quotas: QuotaBook | None = None
        self._by_queue: dict[str, list[QueuedJob]] = {}  # with quotas: each team queue's part of _order
        # When a plan should run again though nothing happens: a run becomes old enough to be
        # preempted for a queue owed its share (``team_queues.preemptions``).
        self._plan_at_s: float | None = None

    # ------------------------------------------------------------------ the step
    def step(self, events: Iterable[Event], cluster: ClusterIndex | None, now_s: float) -> StepResult:
        """Apply ``events``, act on due slot deadlines, and (given snapshots) place what can start."""
        out = StepResult()
        commands = out.commands
        if self.quotas is not None:
            self.quotas.advance(now_s)  # decayed use up to now, for this step's order and the views after it
        for event in events:
            self._apply(event, now_s, commands)
        if self._deadlines and self._deadlines[0][0] <= now_s:
            self._slot_deadlines(now_s, commands)
        if cluster is not None and self.queue and not self._unheard:
            self._plan(cluster, now_s, commands)
            out.planned = True
        out.wake_at_s = self._deadlines[0][0] if self._deadlines else None
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
            self._unheard = set(self.nodes)
        return [Stop(job_id, job.record.attempts, "cancelled by the user", nodes=job.nodes)
                for job_id, job in self.jobs.items()
                if job.cancel_requested and job.record.state in (JobState.RUNNING, JobState.CHECKPOINTING)]

    def allow_autoscaled(self, nodes: Mapping[str, tuple[float, ...]], types: Mapping[str, str]) -> None:
        """Admit jobs that only nodes an autoscaler may add could hold (``nodes``: name -> per-GPU
        memory, ``types``: name -> GPU type); they wait for those nodes to join."""
        self.autoscaled_nodes, self.autoscaled_types = dict(nodes), dict(types)
        self._admission = None

    def heard_from(self, nodes: Iterable[str]) -> None:
        """These nodes answered (their runs are known): placement no longer waits for them."""
        self._unheard.difference_update(nodes)

    # ------------------------------------------------------------------ events
    def _apply(self, event: Event, now_s: float, out: list[Command]) -> None:
        kind = type(event)
        if kind is Submitted:
            self._submitted(event.ticket, now_s, out)  # type: ignore[union-attr]
        elif kind is EstimateArrived:
            self._estimate_arrived(event, now_s, out)  # type: ignore[arg-type]
        elif kind is EstimateFailed:
            job = self.jobs.get(event.job_id)  # type: ignore[union-attr]
            if job is not None and job.record.state is JobState.ESTIMATING:
                self._end(job, JobState.FAILED, now_s, f"rejected: {event.reason}")  # type: ignore[union-attr]
        elif kind is RunEnded:
            self._run_ended(event, now_s, out)  # type: ignore[arg-type]
        elif kind is RunStarted:
            self._run_started(event, now_s)  # type: ignore[arg-type]
        elif kind is RunSettled:
            self._settled(event, now_s)  # type: ignore[arg-type]
        elif kind is LaunchDeclined:
            self._declined(event, now_s, out)  # type: ignore[arg-type]
        elif kind is CancelRequested:
            self._cancel(event, now_s, out)  # type: ignore[arg-type]
        elif kind is CheckpointRequested:
            job = self._run_of(event.job_id, None)  # type: ignore[union-attr]
            if job is not None and job.record.state is JobState.RUNNING:
                self._signal_checkpoint(job, now_s, event.reason, out)  # type: ignore[union-attr]
        elif kind is QueuesConfigured:
            self._configure_queues(event.setup, now_s)  # type: ignore[union-attr]
        elif kind is NodeJoined:
            self.nodes[event.node] = tuple(event.gpu_totals_mib)  # type: ignore[union-attr]
            self.node_types[event.node] = event.gpu_type  # type: ignore[union-attr]
            self._admission = None
            self._count_capacity()
        elif kind is NodeLost:
            self._node_lost(event, now_s, out)  # type: ignore[arg-type]
        else:
            raise TypeError(f"not a scheduler event: {event!r}")

    def _submitted(self, t: JobTicket, now_s: float, out: list[Command]) -> None:
        if t.job_id in self.jobs:
            return  # a repeated submission (a replayed log) changes nothing
        self._seq += 1
        record = JobRecord(t.job_id, t.name, now_s, gpus=t.gpus)
        book = self.quotas
        queued = QueuedJob(t.job_id, now_s, gpus=t.gpus, gpus_per_node=t.gpus_per_node, smact=t.smact,
                           priority=resolve_priority(book.classes if book else {}, t.priority_class, t.priority),
                           seq=self._seq, exclusive=t.exclusive,
                           queue=resolve_queue(book.quotas if book else {}, t.queue, t.user), gpu_types=t.gpu_types)
        job = self.jobs[t.job_id] = ManagedJob(t, record, queued)
        if t.estimating:
            record.state = JobState.ESTIMATING  # its first state: admission waits for the figures
            record.estimate_source = t.estimate_source
            record.reason = t.estimate_source or "estimating"
            return
        self._believe(job)
        self._admit(job, now_s, out)

    def _estimate_arrived(self, e: EstimateArrived, now_s: float, out: list[Command]) -> None:
        """A job accepted while estimating gets its figures and goes through admission into the queue."""
        job = self.jobs.get(e.job_id)
        if job is None or job.record.state is not JobState.ESTIMATING:
            return  # already ended (cancelled), or a repeated event
        job.ticket = replace(job.ticket, need_mib=e.need_mib, estimate_source=e.source, needs=e.needs,
                             estimating=False)
        self._believe(job)
        job.record.transition(JobState.QUEUED, now_s, f"estimate arrived: {job.record.estimate_source}")
        self._admit(job, now_s, out)

    def _believe(self, job: ManagedJob) -> None:
        """The need to reserve, on the whole and per GPU type, and where it comes from, into the job's
        record and queue entry: a measured peak of the same job on a type, when the ticket learns one,
        replaces the estimate there; measured on every type present, it is the need."""
        t = job.ticket
        need, source, needs = t.need_mib, t.estimate_source, dict(t.needs)
        learned = self._learned_needs(t) if t.learn_peak else {}
        if learned:
            needs.update(learned)
            source = f"measured peak of an earlier run of the same job (+{self.peaks.margin:.0%})"
            if len(learned) > 1:
                source += f" on {', '.join(sorted(learned))}"
            if set(learned) >= set(self._types_to_learn()):
                need = max(learned.values())
        rec, queued = job.record, job.queued
        rec.estimate_mib, rec.estimate_source, rec.estimates = need, source, tuple(sorted(needs.items()))
        queued.need_mib, queued.needs = need, tuple(needs.items())

    def _admit(self, job: ManagedJob, now_s: float, out: list[Command]) -> None:
        """Admission (can any node ever hold it?), then into the queue, or ``failed`` with the reason."""
        t, record, queued = job.ticket, job.record, job.queued
        need, source = record.estimate_mib, record.estimate_source
        field_name = "gpus_per_node" if t.gpus_per_node else "gpus"
        if self._admission is None:
            self._admission = AdmissionIndex({**self.autoscaled_nodes, **self.nodes},
                                             {**self.autoscaled_types, **self.node_types})
        problems = self._admission.problems(queued.per_node, t.nodes, need, needs=queued.needs, gpu_types=t.gpu_types,
                                            per_node_field=field_name, mig=self.mig)
        problems = [*problems, *self._queue_problems(t)]
        if problems:
            reason = "; ".join(problems)
            self._end(job, JobState.FAILED, now_s, f"rejected: {reason}")
            out.append(Reject(t.job_id, reason))
            return
        record.reason = f"queued; estimate: {source}" if source else "queued"
        self._enqueue(queued)

    def _queue_problems(self, t: JobTicket) -> list[str]:
        """Why the queue or priority class a job names cannot take it (``quotas``)."""
        book = self.quotas
        if book is None:
            return ["priority_class: no priority classes are configured (hier-sched queues apply)"] \
                if t.priority_class is not None else []
        return [why for why in (book.unknown_queue(t.queue), book.unknown_class(t.priority_class)) if why]

    def _type_of_run(self, job: ManagedJob) -> str:
        """The GPU type the job's last run ran on (a gang's ranks all run on one type)."""
        return self.node_types.get(job.placements[0].node, "") if job.placements else ""

    def _learned_needs(self, t: JobTicket) -> dict[str, float]:
        """GPU type -> the need learned from earlier runs of the same job on that type."""
        return {gpu_type: mib for gpu_type in self._types_to_learn()
                if (mib := self.peaks.need(t.signature, gpu_type)) is not None}

    def _types_to_learn(self) -> list[str]:
        """The types peaks are learned for: those present ("" where no node reported its type)."""
        return self.gpu_types_present() or [""]

    def gpu_types_present(self) -> list[str]:
        """The GPU types of the nodes that joined and are not lost, sorted (none reported: [])."""
        return sorted({self.node_types.get(n, "") for n in self.nodes} - {""})

    def _run_of(self, job_id: str, attempt: int | None) -> ManagedJob | None:
        """The job if it is running attempt ``attempt`` (any attempt when None), else None."""
        job = self.jobs.get(job_id)
        if job is None or job.record.state not in (JobState.RUNNING, JobState.CHECKPOINTING):
            return None
        return job if attempt is None or job.record.attempts == attempt else None

    def _run_started(self, e: RunStarted, now_s: float) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.record.done:
            return
        if job.record.state is JobState.QUEUED and e.attempt == job.record.attempts + 1:
            self._start(job, e.placements, now_s, "running on " + _where(e.placements))
        # running this very attempt already (the launch took effect when it was commanded): nothing to do

    def _settled(self, e: RunSettled, now_s: float) -> None:
        """The run's reservation shrinks to what it settled at (never grows: the node decided)."""
        job = self._run_of(e.job_id, e.attempt)
        if job is not None:
            job.placements = tuple(replace(p, reserved_mib=min(p.reserved_mib, e.reserved_mib))
                                   if e.node is None or p.node == e.node else p for p in job.placements)
            if self.quotas is not None:
                self.quotas.resize(e.job_id, _held(job.placements).mib, now_s)

    def _declined(self, e: LaunchDeclined, now_s: float, out: list[Command]) -> None:
        """The run never started: the attempt is taken back and the job waits again. The ranks of a
        gang that did start on other nodes are stopped (a gang runs whole or not at all)."""
        if e.started:
            out.append(Stop(e.job_id, e.attempt, f"gang: {e.reason}", kill_after_s=GANG_DECLINED_KILL_AFTER_S,
                            nodes=e.started))
        job = self._run_of(e.job_id, e.attempt)
        if job is None:
            return
        self._end_run(job, now_s)
        job.record.attempts -= 1  # the run never started
        job.record.transition(JobState.QUEUED, now_s, f"waiting: {_where(job.placements)} declined: {e.reason}")
        self._requeue(job)

    def _cancel(self, e: CancelRequested, now_s: float, out: list[Command]) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.record.done:
            return
        if job.record.state is JobState.QUEUED:
            self._dequeue(e.job_id)
            self._end(job, JobState.CANCELLED, now_s, e.reason + " while queued")
            return
        if job.record.state is JobState.ESTIMATING:
            self._end(job, JobState.CANCELLED, now_s, e.reason + " while its estimate was made")
            return
        job.cancel_requested = True
        out.append(Stop(e.job_id, job.record.attempts, e.reason, nodes=job.nodes))

    def _node_lost(self, e: NodeLost, now_s: float, out: list[Command]) -> None:
        """Jobs with a run there lose it: each is requeued (it resumes from its checkpoint, if it
        took one), and a gang's ranks on other nodes are stopped first."""
        self.nodes.pop(e.node, None)
        self._unheard.discard(e.node)
        self._admission = None
        self._count_capacity()
        for job in list(self.jobs.values()):
            if job.record.state in (JobState.RUNNING, JobState.CHECKPOINTING) and e.node in job.nodes:
                attempt = job.record.attempts
                for node in job.nodes:
                    if node != e.node:
                        out.append(Stop(job.ticket.job_id, attempt, f"gang rank on {e.node} lost", nodes=(node,)))
                self._end_run(job, now_s)
                if job.cancel_requested:
                    self._end(job, JobState.CANCELLED, now_s, f"cancelled ({e.reason} on {e.node})")
                    continue
                job.lost_runs += 1
                job.record.transition(JobState.QUEUED, now_s, f"requeued: {e.reason} ({e.node}); resumes from "
                                                              "its last checkpoint, if any")
                self._requeue(job)

    def _gang_rank_ended(self, job: ManagedJob, e: RunEnded, out: list[Command]) -> RunEnded | None:
        """A gang is one job: it ends when its last rank has ended well (or with the requeue code
        after a checkpoint), or at its first rank that failed, whose failure ends the gang and stops
        the other ranks. Returns the event that ends the whole run, or None while ranks still run."""
        if e.node not in job.ranks_running:
            return None  # a repeated report
        job.ranks_running.discard(e.node)
        if e.peak_mib:
            job.record.observe_peak(e.peak_mib)
        kind = e.failure.kind if e.failure is not None else None
        if kind in (None, "checkpoint_requeue"):
            job.ranks_requeue |= kind == "checkpoint_requeue"
            if job.ranks_running:
                return None
            if job.ranks_requeue:
                return replace(e, failure=Failure("checkpoint_requeue", "every rank checkpointed"), node=None)
            return replace(e, node=None)
        if job.ranks_running:
            out.append(Stop(e.job_id, e.attempt, f"gang rank on {e.node} failed: {e.failure.reason}",  # type: ignore[union-attr]
                            nodes=job.nodes))
        return replace(e, node=None)

    def _run_ended(self, e: RunEnded, now_s: float, out: list[Command]) -> None:
        job = self._run_of(e.job_id, e.attempt)
        if job is None:
            return
        if e.node is not None and len(job.placements) > 1:
            whole = self._gang_rank_ended(job, e, out)
            if whole is None:
                return
            e = whole
        rec, q, t = job.record, job.queued, job.ticket
        signalled = rec.state is JobState.CHECKPOINTING
        self._end_run(job, now_s)
        rec.exit_code = e.exit_code
        if e.peak_mib:
            rec.observe_peak(e.peak_mib)
        failure = e.failure
        if job.cancel_requested:
            self._end(job, JobState.CANCELLED, now_s, "cancelled by the user")
            return
        if failure is None:
            self._end(job, JobState.SUCCEEDED, now_s, f"exit code {e.exit_code}")
            ran_on = self._type_of_run(job)
            self.runtimes.job_succeeded((t.signature, ran_on), job.executed_s, rec.oom_crashes)
            if t.learn_peak and rec.observed_peak_mib:
                self.peaks.observe(t.signature, ran_on, rec.observed_peak_mib)
            return
        if failure.kind == "checkpoint_requeue":
            rec.checkpoints += 1
            q.submit_s = now_s  # back of the queue: the fairness of a time slot
            rec.transition(JobState.QUEUED, now_s, "checkpointed; requeued behind the jobs that waited")
            self._requeue(job)
            return
        if signalled and failure.kind == "killed":  # stopped at its slot's end without a checkpoint
            job.lost_runs += 1
            q.submit_s = now_s
            rec.transition(JobState.QUEUED, now_s, "slot ended before it checkpointed: this run's work is lost; "
                                                   + ("it resumes from its last checkpoint" if rec.checkpoints else
                                                      "it restarts from scratch"))
            self._requeue(job)
            return
        if failure.kind == "lost":  # as when the queue finds the node lost (_node_lost), seen from the node
            job.lost_runs += 1
            rec.transition(JobState.QUEUED, now_s, f"requeued: {failure.reason}; resumes from its last checkpoint, "
                                                   "if any")
            self._requeue(job)
            return
        if failure.kind == "oom":
            rec.oom_crashes += 1
            q.oom_count += 1
            if e.peak_mib:
                q.observed_peak_mib = max(q.observed_peak_mib or 0.0, e.peak_mib)
        else:
            job.other_failures += 1
        decision = decide_after_failure(failure, attempts=rec.attempts, oom_count=q.oom_count,
                                        other_failures=job.other_failures, policy=self._recovery(t, e))
        if decision.requeue:
            rec.transition(JobState.QUEUED, now_s, decision.reason)
            self._requeue(job)
        else:
            self._end(job, JobState.FAILED, now_s, decision.reason)

    def _recovery(self, t: JobTicket, e: RunEnded):
        base = self.config.recovery
        retries = base.max_retries_other if t.max_retries is None else t.max_retries
        if t.retry_exit_codes is not None and e.exit_code not in t.retry_exit_codes:
            retries = 0
        if e.failure is not None and e.failure.kind == "start_error":
            retries = 0  # a missing command does not appear by retrying
        return replace(base, max_attempts=t.max_attempts or base.max_attempts, max_retries_other=retries)

    # ------------------------------------------------------------------ runs
    def _start(self, job: ManagedJob, placements: tuple[Placement, ...], now_s: float, reason: str) -> None:
        self._dequeue(job.ticket.job_id)
        rec = job.record
        rec.transition(JobState.RUNNING, now_s, reason)
        rec.node = placements[0].node
        rec.nodes = tuple(p.node for p in placements)
        rec.gpu_indices = placements[0].gpus
        job.placements = placements
        job.ranks_running = set(rec.nodes) if len(placements) > 1 else set()
        job.ranks_requeue = False
        job.nodes_ran.extend(n for n in rec.nodes if n not in job.nodes_ran)
        job.run_started_s = now_s
        self.unconfirmed[job.ticket.job_id] = job
        t = job.ticket
        self.runtimes.run_started(t.job_id, (t.signature, self._type_of_run(job)), now_s, job.executed_s)
        if t.slot_s is not None:
            self._push_slot(now_s, job)
        if self.quotas is not None:
            self.quotas.start(self._quota_run(job), now_s)

    def _end_run(self, job: ManagedJob, now_s: float) -> None:
        self.unconfirmed.pop(job.ticket.job_id, None)
        job.reclaimed_for = None
        if self.quotas is not None:
            self.quotas.end(job.ticket.job_id, now_s)
        if job.run_started_s is not None:
            job.executed_s += now_s - job.run_started_s
            job.run_started_s = None
        self.runtimes.run_ended(job.ticket.job_id)

    def _end(self, job: ManagedJob, state: JobState, now_s: float, reason: str) -> None:
        job.record.transition(state, now_s, reason)
        self.ended += 1

    def _requeue(self, job: ManagedJob) -> None:
        q = job.queued
        q.waiting_since_s = None
        q.held = ()
        self._enqueue(q)

    def _enqueue(self, q: QueuedJob) -> None:
        self._dequeue(q.job_id)
        self.queue[q.job_id] = q
        if self.quotas is not None:
            self.quotas.enqueued(q.job_id, q.queue, q.charge(self.config.placement.no_estimate_mib))
            part = self._by_queue.setdefault(q.queue, [])
            part.insert(bisect_right(part, self._key(q), key=self._key), q)
        i = bisect_right(self._order, self._key(q), key=self._key)
        self._order.insert(i, q)
        if self._waiting_reads_order:
            self.waiting.queue_changed(i, q, inserted=True)

    def _dequeue(self, job_id: str) -> None:
        q = self.queue.pop(job_id, None)
        if q is not None:
            if self.quotas is not None:
                self.quotas.dequeued(job_id)
                part = self._by_queue[q.queue]
                del part[bisect_left(part, self._key(q), key=self._key)]
            i = bisect_left(self._order, self._key(q), key=self._key)
            assert self._order[i] is q, "a queued job's ordering fields changed while it waited"
            del self._order[i]
            if self._waiting_reads_order:
                self.waiting.queue_changed(i, q, inserted=False)

    # ------------------------------------------------------------------ time slots
    def _push_slot(self, start_s: float, job: ManagedJob) -> None:
        t = job.ticket
        assert t.slot_s is not None
        self._seq += 1
        heapq.heappush(self._deadlines, (start_s + t.slot_s - t.slot_grace_s, _SIGNAL, self._seq, t.job_id,
                                         job.record.attempts))

    def _slot_deadlines(self, now_s: float, out: list[Command]) -> None:
        while self._deadlines and self._deadlines[0][0] <= now_s:
            due, kind, _, job_id, attempt = heapq.heappop(self._deadlines)
            job = self._run_of(job_id, attempt)
            if job is None:
                continue
            t = job.ticket
            if kind == _SLOT_END:
                if job.record.state is JobState.CHECKPOINTING:
                    why = ("time slot ended" if job.reclaimed_for is None else
                           f"checkpoint grace ended: its GPUs are reclaimed for queue {job.reclaimed_for}")
                    out.append(Stop(job_id, attempt, why, t.kill_after_s, job.nodes))
                continue
            if job.record.state is not JobState.RUNNING:
                continue
            if t.slot_extends and not self.queue:  # nobody waits for these GPUs: another slot, no preemption
                job.record.reason = "slot extended: no job waits for its GPUs"
                self._seq += 1
                heapq.heappush(self._deadlines, (due + t.slot_s, _SIGNAL, self._seq, job_id, attempt))  # type: ignore[operator]
                continue
            job.preemptions += 1
            self._signal_checkpoint(job, now_s, "its time slot ends", out)
            self._seq += 1
            heapq.heappush(self._deadlines, (due + t.slot_grace_s, _SLOT_END, self._seq, job_id, attempt))

    def _signal_checkpoint(self, job: ManagedJob, now_s: float, why: str, out: list[Command]) -> None:
        job.record.transition(JobState.CHECKPOINTING, now_s, f"checkpoint signal sent: {why}")
        out.append(SignalCheckpoint(job.ticket.job_id, job.record.attempts, why, job.nodes))
        if self.quotas is not None:
            self.quotas.signalled(job.ticket.job_id)

    # ------------------------------------------------------------------ team queues (quotas)
    def _configure_queues(self, setup: QueueSetup, now_s: float) -> None:
        """The queues from now on; what each one uses is counted again from the runs, and their
        decayed use carries over (no queues: no quotas)."""
        if not setup.queues:
            self.quotas, self._by_queue = None, {}
            return
        book = QuotaBook(setup, history=self.quotas)
        self.quotas = book
        self._count_capacity()
        no_estimate_mib = self.config.placement.no_estimate_mib
        self._by_queue = by_queue(self._order)
        for q in self._order:
            book.enqueued(q.job_id, q.queue, q.charge(no_estimate_mib))
        for job in self.jobs.values():
            if job.record.state in (JobState.RUNNING, JobState.CHECKPOINTING):
                book.start(self._quota_run(job), now_s)
                if job.record.state is JobState.CHECKPOINTING:
                    book.signalled(job.ticket.job_id)

    def _count_capacity(self) -> None:
        if self.quotas is not None:
            self.quotas.set_capacity(Charge(sum(len(g) for g in self.nodes.values()),
                                            sum(sum(g) for g in self.nodes.values())))

    def _quota_run(self, job: ManagedJob) -> QuotaRun:
        """The run as its queue counts it (started now: on borrowed capacity if its queue's nominal
        quota does not cover it on top of what it already holds)."""
        book, t, q = self.quotas, job.ticket, job.queued
        assert book is not None
        charge = _held(job.placements)
        borrowed = not book.within_nominal(q.queue, charge)
        return QuotaRun(t.job_id, q.queue, charge, q.priority, job.run_started_s or 0.0,
                        book.preemptible(t.priority_class, t.preemptible, t.checkpoints), borrowed)

    def _preempt(self, book: QuotaBook, owed: Entitlements, cluster: ClusterIndex,
                 placed: Iterable[tuple[QueuedJob, tuple[Placement, ...]]], now_s: float, out: list[Command]) -> None:
        """Runs that hold what waiting jobs are owed (``team_queues.preemptions``) get the checkpoint
        signal now and are stopped when their grace ends; they requeue and resume from their
        checkpoint. The waiting jobs are told which runs make room for them."""
        cfg = self.config
        room = Room(cluster, cfg.placement, cfg.queue, taken=[p for _, ps in placed for p in ps],
                    gone=[p for job_id in book.leaving for p in self.jobs[job_id].placements])
        chosen, starved, ready_at = preemptions(book, self._by_queue, owed, room,
                                                lambda job_id: self.jobs[job_id].placements, now_s)
        for p in chosen:
            job = self.jobs[p.run.job_id]
            job.preemptions += 1
            job.reclaimed_for = p.for_queue
            self._signal_checkpoint(job, now_s, p.why, out)
            self._seq += 1
            heapq.heappush(self._deadlines, (now_s + job.ticket.slot_grace_s, _SLOT_END, self._seq, p.run.job_id,
                                             job.record.attempts))
        for queue, job_ids in starved.items():
            if note := book.reclaim_words(queue):
                for job_id in job_ids:
                    self.waiting[job_id] = self.waiting.get(job_id, ()) + (note,)
        if ready_at is not None and (self._plan_at_s is None or self._plan_at_s <= now_s or ready_at < self._plan_at_s):
            self._plan_at_s = ready_at

    # ------------------------------------------------------------------ placement
    def _assume(self, cluster: ClusterIndex) -> None:
        """Place on ``cluster`` the runs this scheduler started that its snapshots do not show
        yet (``ClusterIndex.assume``); a run they show on every node is confirmed, and no longer
        assumed, and a run that ended (or a gang's rank that did) is assumed no more. A node
        missing from the snapshots confirms nothing."""
        cluster.forget_assumed({(job_id, job.record.attempts) for job_id, job in self.unconfirmed.items()})
        for job_id, job in list(self.unconfirmed.items()):
            shown = True
            gang = len(job.placements) > 1
            for p in job.placements:
                if gang and p.node not in job.ranks_running:
                    continue  # this rank ended: nothing of it is left there
                if p.node not in cluster.pos:
                    shown = False
                elif not cluster.shows(p, job.record.attempts):
                    shown = False
                    cluster.assume(p, job.record.attempts, job.run_started_s)  # type: ignore[arg-type]
            if shown:
                del self.unconfirmed[job_id]

    def _plan(self, cluster: ClusterIndex, now_s: float, out: list[Command]) -> None:
        self.cycles += 1
        self._assume(cluster)
        cfg = self.config
        book = self.quotas
        if book is None:
            order = self._order
        else:
            owed = entitlements(book)
            order = cycle_order(self._order, self._by_queue, book, owed, turns=cfg.queue.backfill_depth + 1)
        # The plan's wait reasons read the list it was given; only the scheduler's own list is
        # kept up to date for them (a quota order is this cycle's copy, which no one changes).
        self._waiting_reads_order = order is self._order
        plan = plan_cycle(order, cluster, cfg.placement, cfg.queue, now_s, rr_cursor=self.rr_cursor,
                          expected_end=self.runtimes.expected_end, ordered=True, quotas=book)
        self.rr_cursor = plan.rr_cursor
        self.waiting = plan.waiting  # every queued job that did not start: why (the plan's words)
        for q, placements in plan.placements:
            job = self.jobs[q.job_id]
            self._start(job, placements, now_s, f"on {_where(placements)} ({placements[0].reason}; "
                                                 f"reserved {placements[0].reserved_mib:.0f} MiB)")
            req = launch_request(q, cluster, placements[0].node, cfg.queue)
            out.append(Launch(q.job_id, job.record.attempts, placements, self._memory_limit(req, cluster), req,
                              job.may_resume))
        if plan.head is not None:
            note_blocked_head((self.queue[plan.head],), plan, now_s)
        if book is not None:
            self._preempt(book, owed, cluster, plan.placements, now_s, out)

    def _memory_limit(self, req: PlacementRequest, cluster: ClusterIndex) -> float | None:
        """The MPS pinned-memory limit: the free memory the gate asked for, so a job that outgrows
        its estimate fails itself, not its neighbour. None without an estimate, outside MPS, and on
        idle GPUs of its own (the last recovery step, the exclusive policy)."""
        if (not self.config.placement.mps_memory_limit or cluster.sharing is not SharingMode.MPS or req.exclusive
                or (req.need_mib is None and req.min_free_mib is None)):
            return None
        return memory_requirement(req, self.config.placement)[0]

    # ------------------------------------------------------------------ reconciling with nodes
    def reconcile(self, node: str, runs: Iterable[tuple[str, int, Placement]]) -> tuple[list[Event], list[Stop]]:
        """What a node says it runs against what the scheduler knows. A run the scheduler was
        about to learn of (launched just before a restart: the next attempt of a queued job) is
        adopted; a run the scheduler does not count as running there — its job ended, was
        requeued after the node was lost, or runs another attempt — is a stray to stop, so that no
        job ever runs twice. Returns (events to apply, stops to carry out)."""
        adopt: list[Event] = []
        stray: list[Stop] = []
        for job_id, attempt, placement in runs:
            job = self.jobs.get(job_id)
            if job is not None and job.record.state in (JobState.RUNNING, JobState.CHECKPOINTING):
                if job.record.attempts == attempt and node in job.nodes:
                    continue
            elif job is not None and job.record.state is JobState.QUEUED and attempt == job.record.attempts + 1:
                adopt.append(RunStarted(job_id, attempt, (placement,)))
                continue
            stray.append(Stop(job_id, attempt, f"stray run on {node}: the scheduler does not count it as running there",
                              kill_after_s=10.0, nodes=(node,)))
        return adopt, stray

    # ------------------------------------------------------------------ reading (the query API)
    # Shells read the scheduler only through these: its jobs, queue and nodes stay its own.
    def knows(self, job_id: str) -> bool:
        return job_id in self.jobs

    def job_ids(self) -> list[str]:
        """Every job known, in submission order (ended ones until a log compaction drops them)."""
        return list(self.jobs)

    def view(self, job_id: str) -> JobView | None:
        job = self.jobs.get(job_id)
        return JobView(job) if job is not None else None

    def views(self) -> Iterator[JobView]:
        """A view of every job known, in submission order."""
        return map(JobView, self.jobs.values())

    def state_of(self, job_id: str) -> JobState | None:
        job = self.jobs.get(job_id)
        return job.record.state if job is not None else None

    def status(self, job_id: str, cluster: ClusterIndex | None = None) -> dict[str, Any]:
        """The job's public status object (``JobRecord.to_dict``, times on the scheduler's clock)
        with why it is where it is, its lost runs, slot preemptions, the ranks of its run and
        when that run started."""
        job = self.jobs[job_id]
        out = job.record.to_dict()
        out["reason"] = self.reason(job_id, cluster)
        out["lost_runs"] = job.lost_runs
        out["preemptions"] = job.preemptions
        out["queue"] = job.queued.queue
        out["ranks"] = [{"rank": i, "node": p.node, "gpus": list(p.gpus)} for i, p in enumerate(job.placements)]
        out["run_start_time"] = job.run_started_s  # the current run's start (``start_time``: the first)
        return out

    def counts(self) -> SchedulerCounts:
        recovering = sum(1 for q in self.queue.values() if q.recovering)
        return SchedulerCounts(len(self.jobs), len(self.queue), recovering, self.cycles, self.ended)

    def has_queued(self) -> bool:
        return bool(self.queue)

    def unfinished(self) -> list[str]:
        """The jobs that have not ended, in submission order."""
        return [job_id for job_id, job in self.jobs.items() if not job.record.done]

    def finished_oldest_first(self) -> list[str]:
        """The jobs that ended, the earliest end first (what a log compaction may drop first)."""
        ended = [(job.record.end_time or 0.0, job_id) for job_id, job in self.jobs.items() if job.record.done]
        return [job_id for _, job_id in sorted(ended)]

    def awaits_checkpoint(self, job_id: str, attempt: int) -> bool:
        """Whether run ``attempt`` of the job was signalled to checkpoint and has not ended yet."""
        job = self.jobs.get(job_id)
        return job is not None and job.record.attempts == attempt and job.record.state is JobState.CHECKPOINTING

    def node_totals(self) -> Mapping[str, tuple[float, ...]]:
        """Node -> per-GPU memory of the nodes that joined and are not lost (admission's picture)."""
        return MappingProxyType(self.nodes)

    def unheard_nodes(self) -> list[str]:
        """The nodes placement waits for after a rebuild (``rebuild``, ``heard_from``)."""
        return sorted(self._unheard)

    def reservations(self) -> dict[tuple[str, int], float]:
        """(node, GPU) -> the memory reserved there for the runs this scheduler counts as
        running (a gang's ranks that have not ended): what it has promised each GPU, which never
        exceeds the GPU."""
        booked: dict[tuple[str, int], float] = {}
        for job in self.jobs.values():
            if job.record.state in (JobState.RUNNING, JobState.CHECKPOINTING):
                gang = len(job.placements) > 1
                for p in job.placements:
                    if gang and p.node not in job.ranks_running:
                        continue
                    for gpu in p.gpus:
                        booked[p.node, gpu] = booked.get((p.node, gpu), 0.0) + p.reserved_mib
        return booked

    def queue_usage(self) -> list[dict[str, Any]]:
        """Each team queue's quota, what its runs hold (beyond its nominal quota: borrowed), its fair
        share and its waiting jobs (``QuotaBook.rows``); empty without a queue configuration."""
        return [] if self.quotas is None else self.quotas.rows()

    def reason(self, job_id: str, cluster: ClusterIndex | None = None) -> str:
        """Why the job is where it is: for a queued job, why it waits (``wait_reason``)."""
        job = self.jobs[job_id]
        if job.record.state is not JobState.QUEUED:
            return job.record.reason
        return wait_reason(job, self.waiting.get(job_id, ()), self.config, cluster)


def wait_reason(job: ManagedJob, plan_reasons: Sequence[str], config: SchedulerConfig,
                cluster: ClusterIndex | None) -> str:
    """One line on why a queued job waits, e.g. ``no GPU with 14.2 GiB usable (best: node2 gpu1,
    9.8 GiB; usable = free minus the 0.5 GiB kept free on every GPU)``, ``recovering: needs 15.4
    GiB after an OOM``, ``GPUs held for it, waiting 2.1 h``. Sizes in GiB (``units.gib``)."""
    q = job.queued
    parts = []
    if q.recovering:
        parts.append(f"recovering after {q.oom_count} OOM crash(es)")
    if q.held:
        parts.append("GPUs held for it: " + ", ".join(f"{n} GPU {','.join(map(str, g))}" for n, g in q.held))
    if cluster is not None and cluster.names:
        req = placement_request(q, cluster.gpu_total_mib or float("inf"), config.queue)
        need_free, _ = memory_requirement(req, config.placement)
        if req.exclusive:
            parts.append(f"needs {req.gpus} idle GPU(s) on {q.nodes} node(s)")
        else:
            row, col = divmod(int(cluster.free.argmax()), cluster.free.shape[1])
            best = cluster.free[row, col] - config.placement.free_reserve_mib
            reserve = gib(config.placement.free_reserve_mib)
            parts.append(f"no GPU with {gib(need_free)} usable (best: {cluster.names[row]} gpu{col}, "
                         f"{gib(max(best, 0.0))}; {USABLE_NOTE} {reserve} kept free on every GPU)"
                         if best < need_free else
                         f"needs {gib(need_free)} usable on {req.gpus} GPU(s) of {q.nodes} node(s)")
    if any(p.startswith(("no GPU with", "needs ")) for p in parts):
        # the plan's "no node has N GPU(s) with X usable" says the same again
        plan_reasons = [r for r in plan_reasons if not r.startswith(NO_NODE_HAS)]
    if plan_reasons:
        parts.append("; ".join(plan_reasons))
    elif not parts:
        parts.append(job.record.reason or "queued")
    return "waiting: " + "; ".join(parts)


def _held(placements: Sequence[Placement]) -> Charge:
    """What a run holds: its GPUs and the memory reserved on them."""
    return Charge(sum(len(p.gpus) for p in placements), sum(p.reserved_mib * len(p.gpus) for p in placements))


def _where(placements: Sequence[Placement]) -> str:
    return " + ".join(f"{p.node} GPU(s) {list(p.gpus)}" for p in placements)
