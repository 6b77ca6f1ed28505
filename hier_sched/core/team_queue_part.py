"""Team queues as one part of the scheduler that is always there.

With no queue configuration it is ``OpenQueue``: one open queue, every job in it, no quota,
nothing to preempt. With one it is ``QuotaQueues``: the book of what each queue holds and waits
for (``QuotaBook``), each queue's jobs in queue order, the cycle's order across queues
(``team_queues.cycle_order``) and, after each plan, the runs to preempt for a queue owed its share
(``team_queues.preemptions``). The scheduler tells the part of every change (a job queued or out
of the queue, a run started, resized, signalled or ended) and never asks which one it has.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.cycle_order import CycleOrder, cycle_order
from hier_sched.core.events import Command, Event, JobTicket, RunReclaimed
from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobState
from hier_sched.core.managed_job import RUN_STATES, ManagedJob, held
from hier_sched.core.queued_job import QueuedJob, queue_key
from hier_sched.core.queueing import OpenGate
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quota_words import queue_rows, reclaim_words
from hier_sched.core.quotas import ZERO, Charge, QueueSetup, resolve_priority, resolve_queue
from hier_sched.core.reclaim_fit import ReclaimFit
from hier_sched.core.scheduler_config import SchedulerConfig
from hier_sched.core.team_queues import Entitlements, by_queue, entitlements, preemptions
from hier_sched.core.wait_reasons import WaitReasons

__all__ = ["OpenQueue", "QuotaQueues", "team_queues_for"]

# (run, for queue, now, why, commands): signal, then stop after grace (``JobLifecycle.reclaim``)
Reclaim = Callable[[ManagedJob, str, float, str, list[Command]], None]
Placed = Iterable[tuple[QueuedJob, tuple[Placement, ...]]]


class OpenQueue(OpenGate):
    """No team queues configured: one open queue; every hook is a no-op. Its methods are the
    part's interface, which ``QuotaQueues`` fills in."""

    history: QuotaBook | None = None  # no decayed use to carry into a configuration

    def entry(self, t: JobTicket) -> tuple[int, str]:
        """(priority, team queue) of a new queue entry."""
        return resolve_priority({}, t.priority_class, t.priority), resolve_queue({}, t.queue, t.user)

    def problems(self, t: JobTicket) -> list[str]:
        """Why the queue or priority class the job names cannot take it."""
        return ["priority_class: no priority classes are configured (hier-sched queues apply)"] \
            if t.priority_class is not None else []

    def advance(self, now_s: float) -> None: ...
    def capacity_changed(self, nodes: Mapping[str, tuple[float, ...]]) -> None: ...
    def enqueued(self, q: QueuedJob) -> None: ...
    def dequeued(self, q: QueuedJob) -> None: ...
    def run_started(self, job: ManagedJob, now_s: float) -> None: ...
    def run_resized(self, job: ManagedJob, now_s: float) -> None: ...
    def run_signalled(self, job_id: str) -> None: ...
    def run_ended(self, job_id: str, now_s: float) -> None: ...

    def cycle_order(self, order: Sequence[QueuedJob], turns: int) -> Sequence[QueuedJob]:
        """The order the planner tries the queued jobs in this cycle."""
        return order

    def preempt(self, cluster: ClusterIndex, placed: Placed, waiting: WaitReasons, now_s: float,
                out: list[Command], decided: list[Event]) -> float | None:
        """After the plan: the runs to signal so that waiting jobs get what they are owed (each
        one's ``RunReclaimed`` into ``decided``, for a shell's log). Returns when a plan should run
        again though nothing happens (None: no need)."""
        return None

    def rows(self) -> list[dict[str, Any]]:
        """Each team queue's quota, use, fair share and waiting jobs (``quota_words.queue_rows``)."""
        return []


class QuotaQueues(OpenQueue):
    """Team queues with quotas, fair share and reclaim (``quotas``, ``quota_book``, ``team_queues``)."""

    refuses_nobody = False

    def __init__(self, book: QuotaBook, config: SchedulerConfig, jobs: Mapping[str, ManagedJob],
                 reclaim: Reclaim):
        self.book = book
        self._config = config
        self._no_estimate_mib = config.placement.no_estimate_mib
        self._jobs = jobs
        self._reclaim = reclaim
        self._key = partial(queue_key, gangs_first=config.queue.gangs_first)
        self._by_queue: dict[str, list[QueuedJob]] = {}  # each team queue's part of the queue order
        self._owed: Entitlements | None = None  # what each queue is owed this cycle (``cycle_order``)
        # The last cycle's order, worked out as it is read from the book and ``_by_queue`` as they
        # are: frozen before either changes (``_changing``).
        self._order: CycleOrder | None = None

    @property
    def history(self) -> QuotaBook:  # type: ignore[override]
        return self.book

    def load(self, order: Sequence[QueuedJob], now_s: float) -> None:
        """Count what the queued jobs and the runs use (a new configuration)."""
        self._changing()
        self._by_queue = by_queue(order)
        for q in order:
            self.book.enqueued(q.job_id, q.queue, q.charge(self._no_estimate_mib))
        for job in self._jobs.values():
            if job.record.state in RUN_STATES:
                self.run_started(job, now_s)
                if job.record.state is JobState.CHECKPOINTING:
                    self.book.signalled(job.ticket.job_id)

    def entry(self, t: JobTicket) -> tuple[int, str]:
        return resolve_priority(self.book.classes, t.priority_class, t.priority), \
            resolve_queue(self.book.quotas, t.queue, t.user)

    def problems(self, t: JobTicket) -> list[str]:
        return [why for why in (self.book.unknown_queue(t.queue), self.book.unknown_class(t.priority_class)) if why]

    def advance(self, now_s: float) -> None:
        self._changing()
        self.book.advance(now_s)  # decayed use up to now, for this step's order and the views after it

    def capacity_changed(self, nodes: Mapping[str, tuple[float, ...]]) -> None:
        self._changing()
        self.book.set_capacity(Charge(sum(len(g) for g in nodes.values()), sum(sum(g) for g in nodes.values())))

    def enqueued(self, q: QueuedJob) -> None:
        self._changing()
        self.book.enqueued(q.job_id, q.queue, q.charge(self._no_estimate_mib))
        part = self._by_queue.setdefault(q.queue, [])
        part.insert(bisect_right(part, self._key(q), key=self._key), q)

    def dequeued(self, q: QueuedJob) -> None:
        self._changing()
        self.book.dequeued(q.job_id)
        part = self._by_queue[q.queue]
        del part[bisect_left(part, self._key(q), key=self._key)]

    def run_started(self, job: ManagedJob, now_s: float) -> None:
        """The run as its queue counts it (started now: on borrowed capacity if its queue's nominal
        quota does not cover it on top of what it already holds)."""
        self._changing()
        t, q = job.ticket, job.queued
        charge = held(job.placements)
        borrowed = not self.book.within_nominal(q.queue, charge)
        self.book.start(QuotaRun(t.job_id, q.queue, charge, q.priority, job.run_started_s or 0.0,
                                 self.book.preemptible(t.priority_class, t.preemptible, t.checkpoints)
                                 and not job.runs_to_end, borrowed),
                        now_s)

    def run_resized(self, job: ManagedJob, now_s: float) -> None:
        self._changing()
        self.book.resize(job.ticket.job_id, held(job.placements).mib, now_s)

    def run_signalled(self, job_id: str) -> None:
        self._changing()
        self.book.signalled(job_id)

    def run_ended(self, job_id: str, now_s: float) -> None:
        self._changing()
        self.book.end(job_id, now_s)

    # the cycle: its order, the planner's quota checks (``queueing.QuotaGate``), the preemptions after it
    def cycle_order(self, order: Sequence[QueuedJob], turns: int) -> Sequence[QueuedJob]:
        self._changing()
        self._owed = entitlements(self.book)
        if sum(1 for part in self._by_queue.values() if part) <= 1:
            return order  # one queue's jobs wait: its tiers keep its own order, the queue's (often: an arrival)
        self._order = cycle_order(order, self._by_queue, self.book, self._owed, turns=turns)
        return self._order

    def _changing(self) -> None:
        """The book or the queues change: the last cycle's order stays as far as it was read."""
        if self._order is not None:
            self._order.freeze()
            self._order = None

    def refusal(self, job: QueuedJob, given: Mapping[str, Charge]) -> str | None:
        return self.book.refusal(job.queue, self.book.charge_of(job.job_id), given)

    def count_placed(self, job: QueuedJob, given: dict[str, Charge]) -> None:
        given[job.queue] = given.get(job.queue, ZERO) + self.book.charge_of(job.job_id)

    def preempt(self, cluster: ClusterIndex, placed: Placed, waiting: WaitReasons, now_s: float,
                out: list[Command], decided: list[Event]) -> float | None:
        """Runs that hold what waiting jobs are owed (``team_queues.preemptions``) get the checkpoint
        signal now and are stopped when their grace ends; they requeue and resume from their
        checkpoint. The waiting jobs are told which runs make room for them."""
        cfg, book, jobs = self._config, self.book, self._jobs
        assert self._owed is not None, "preempt follows the cycle's order"
        fit = ReclaimFit(cluster, cfg.placement, cfg.queue, taken=[p for _, ps in placed for p in ps],
                    gone=[p for job_id in book.leaving for p in jobs[job_id].placements])
        chosen, starved, ready_at = preemptions(book, self._by_queue, self._owed, fit,
                                                lambda job_id: jobs[job_id].placements, now_s)
        for p in chosen:
            job = jobs[p.run.job_id]
            self._reclaim(job, p.for_queue, now_s, p.why, out)
            decided.append(RunReclaimed(p.run.job_id, job.record.attempts, p.for_queue, p.why))
        for queue, job_ids in starved.items():
            if note := reclaim_words(book, queue):
                for job_id in job_ids:
                    waiting[job_id] = waiting.get(job_id, ()) + (note,)
        return ready_at

    def rows(self) -> list[dict[str, Any]]:
        return queue_rows(self.book)


def team_queues_for(setup: QueueSetup, previous: OpenQueue, config: SchedulerConfig,
                    jobs: Mapping[str, ManagedJob], order: Sequence[QueuedJob], nodes: Mapping[str, tuple[float, ...]],
                    reclaim: Reclaim, now_s: float) -> OpenQueue:
    """The team-queue part for a new configuration: what each queue uses is counted again from
    the queue and the runs, and their decayed use carries over (no queues: one open queue)."""
    if not setup.queues:
        return OpenQueue()
    part = QuotaQueues(QuotaBook(setup, history=previous.history), config, jobs, reclaim)
    part.capacity_changed(nodes)
    part.load(order, now_s)
    return part
