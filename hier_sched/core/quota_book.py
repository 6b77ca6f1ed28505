"""The book of team queues: what each queue's runs hold, what it may take, and whom to preempt.

The scheduler's team-queue part (``team_queue_part.QuotaQueues``) keeps one ``QuotaBook`` while
queues are configured and applies its answers in both shells (its table and words:
``quota_words``):

* **Admission** (``refusal``): a job waits while it would take its queue beyond its ceiling
  (nominal + borrowing limit), or, in a named cohort, borrow what the cohort does not lend. It
  waits for quota, not for GPUs, so it never blocks the jobs behind it.
* **Order** (``order_share``): the weighted dominant share of each queue's decayed use; the
  scheduler serves the queue with the lowest first, a job at a time (``team_queues``).
* **Reclaim** (``reclaim``): a queue below its fair share (or its nominal quota) whose jobs wait
  takes back what other queues of its cohort hold beyond theirs: their runs that may be
  preempted, lowest priority first, then runs on borrowed capacity, then the least work since
  their last checkpoint (the newest run: a run resumes from its checkpoint); none younger than
  its queue's minimum runtime. Runs are asked to checkpoint first (``team_queue_part``).
* **Priority inside a queue** (``lower_priority_runs``), where the queue turns it on.

A job charges its queue from the step its run starts to the step it ends: its GPUs (a gang
whole) and the memory reserved for it (less once it settles).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from hier_sched.core.fair_share import decayed, kept_fraction, water_fill
from hier_sched.core.quotas import (
    CURRENCIES, ZERO, Charge, PriorityClass, QueueQuota, QueueSetup,
)
from hier_sched.core.units import gib

__all__ = ["QuotaBook", "QuotaRun", "JobFit", "ratio_words"]

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class QuotaRun:
    """A run as its queue's quota counts it, and what a preemption asks of it."""

    job_id: str
    queue: str
    charge: Charge
    priority: int
    started_s: float
    preemptible: bool
    borrowed: bool  # it started beyond its queue's nominal quota


class JobFit(Protocol):
    """Where one waiting job could run (``team_queues``, on ``reclaim_fit.ReclaimFit``)."""

    def fits(self, runs: Sequence[QuotaRun]) -> bool:
        """Whether the job fits once these runs are gone."""

    def arrange(self, runs: Sequence[QuotaRun]) -> list[QuotaRun]:
        """The runs in the order to try them: those that make room where the job fits first."""

    def clear(self) -> None:
        """Start a choice: no run is counted gone (``grow``)."""

    def grow(self, run: QuotaRun) -> None:
        """Count one more run gone."""

    def fits_grown(self) -> bool:
        """Whether the job fits once the runs counted by ``grow`` are gone."""


def _amount(currency: str, value: float) -> str:
    if currency == "mib":
        return gib(value)
    return f"{value:.0f} GPUs" if float(value).is_integer() else f"{value:.1f} GPUs"


def ratio_words(currency: str, used: float, of: float | None) -> str:
    """``3/2 GPUs`` or ``30.0/20.0 GiB``: one unit per sentence."""
    if currency == "mib":
        return f"{used / 1024:.1f}/{(of or 0) / 1024:.1f} GiB"
    fmt = (lambda v: f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}")
    return f"{fmt(used)}/{fmt(of or 0)} GPUs"


class QuotaBook:
    """The queues, the runs their quotas count, their decayed use, and the runs asked to leave."""

    def __init__(self, setup: QueueSetup, history: "QuotaBook | None" = None):
        """``history``: the book of the configuration this one replaces (its queues' decayed use
        carries over)."""
        self.setup = setup
        self.quotas = {q.name: q for q in setup.queues}
        self.classes: dict[str, PriorityClass] = {c.name: c for c in setup.priority_classes}
        self.capacity = ZERO  # the cluster's GPUs and GPU memory (``set_capacity``)
        self.usage: dict[str, Charge] = {}
        self.runs: dict[str, QuotaRun] = {}
        # The queued jobs' charges (job -> (queue, charge)) and their sums per queue, kept as jobs
        # enter and leave the queue: what fair shares divide, without a pass over a long queue.
        self.queued: dict[str, tuple[str, Charge]] = {}
        self.waiting: dict[str, Charge] = {}
        self.waiting_jobs: dict[str, int] = {}
        # Runs that got the checkpoint signal and have not ended: job -> the queue they make room
        # for (None: signalled for another reason, a slot's end or a user). Never picked again.
        self.leaving: dict[str, str | None] = {}
        # Bumped whenever a run starts, ends, shrinks or is asked to leave: a reclaim that found no
        # choice (``note_no_room``) is not looked for again until then (a cycle would find the same).
        self.version = 0
        self._refusals: dict[str, Callable[[Charge, Mapping[str, Charge]], str | None]] = {}  # (``refusal_of``)
        self._refusals_at = -1  # the version they were made at
        self._no_room: dict[str, tuple[int, float | None]] = {}
        self._average: dict[str, Charge] = {}  # decayed use (``fair_share.decayed``)
        self._average_at_s = 0.0
        if history is not None:
            self._average, self._average_at_s = dict(history._average), history._average_at_s

    # ------------------------------------------------------------------ queues and classes
    def quota(self, queue: str) -> QueueQuota:
        """The queue's quota; a queue the configuration does not define (``default``, or one named
        by jobs submitted before the configuration changed) is nominal 0 GPUs in the open cohort."""
        return self.quotas.get(queue) or QueueQuota(queue)

    def unknown_queue(self, queue: str | None) -> str | None:
        """Why a job may not name ``queue``, or None (no name means ``default``)."""
        if queue is None or queue in self.quotas:
            return None
        return f"queue: unknown queue {queue!r}; known: {', '.join(sorted(self.quotas))}"

    def unknown_class(self, priority_class: str | None) -> str | None:
        if priority_class is None or priority_class in self.classes:
            return None
        known = ", ".join(sorted(self.classes)) or "none (hier-sched queues apply sets them)"
        return f"priority_class: unknown priority class {priority_class!r}; known: {known}"

    def preemptible(self, priority_class: str | None, asked: bool | None, checkpoints: bool) -> bool:
        """Whether a run may be preempted: as the job says, else as its priority class says, else
        when it can checkpoint (it resumes from its checkpoint)."""
        if asked is not None:
            return asked
        cls = self.classes.get(priority_class or "")
        if cls is not None and cls.preemptible is not None:
            return cls.preemptible
        return checkpoints

    def set_capacity(self, capacity: Charge) -> None:
        """The cluster's GPUs and GPU memory (nodes joined or lost)."""
        if capacity != self.capacity:
            self.capacity = capacity
            self.version += 1  # a reclaim that found no room may find some now

    # ------------------------------------------------------------------ runs
    def advance(self, now_s: float) -> None:
        """Fold the use since the last call into each queue's decayed use."""
        elapsed = now_s - self._average_at_s
        if elapsed <= 0:
            return
        kept = kept_fraction(elapsed, self.setup.half_life_s)
        for name in self._average.keys() | self.usage.keys():
            use, avg = self.usage.get(name, ZERO), self._average.get(name, ZERO)
            self._average[name] = Charge(decayed(avg.gpus, use.gpus, kept), decayed(avg.mib, use.mib, kept))
        self._average_at_s = now_s

    def nominal(self, queue: str) -> Charge:
        """The queue's nominal quota (inf in a currency it does not govern)."""
        q = self.quota(queue)
        return Charge(*(math.inf if q.nominal(c) is None else q.nominal(c) for c in CURRENCIES))

    def within(self, queue: str, level: Charge, charge: Charge, extra: Charge = ZERO) -> bool:
        """Whether ``charge`` more (after ``extra`` more already counted) keeps the queue within
        ``level`` in every currency it governs."""
        return self.within_of(queue, level, extra)(charge)

    def within_of(self, queue: str, level: Charge, extra: Charge = ZERO) -> Callable[[Charge], bool]:
        """``within(queue, level, charge, extra)`` as a function of ``charge``, the queue's quota and
        use looked up once (a cycle's order asks it of every job of the queue it puts in order)."""
        used = self.usage.get(queue, ZERO) + extra
        limits = [(i, level[i] + _EPS) for i, c in enumerate(CURRENCIES) if self.quota(queue).governs(c)]
        return lambda charge: all(used[i] + charge[i] <= limit for i, limit in limits)

    def within_nominal(self, queue: str, charge: Charge, extra: Charge = ZERO) -> bool:
        """Whether ``charge`` more (after ``extra`` more already counted) stays within the nominal quota."""
        return self.within(queue, self.nominal(queue), charge, extra)

    def start(self, run: QuotaRun, now_s: float) -> None:
        self.advance(now_s)
        self.runs[run.job_id] = run
        self.usage[run.queue] = self.usage.get(run.queue, ZERO) + run.charge
        self.version += 1

    def end(self, job_id: str, now_s: float) -> None:
        self.advance(now_s)
        run = self.runs.pop(job_id, None)
        if run is not None:
            self.usage[run.queue] = self.usage[run.queue] - run.charge
            self.version += 1
        self.leaving.pop(job_id, None)

    def resize(self, job_id: str, mib: float, now_s: float) -> None:
        """The run now holds ``mib`` of GPU memory (it settled)."""
        run = self.runs.get(job_id)
        if run is None or mib >= run.charge.mib:
            return
        self.advance(now_s)
        self.usage[run.queue] = self.usage[run.queue] - Charge(0.0, run.charge.mib - mib)
        self.runs[job_id] = replace(run, charge=Charge(run.charge.gpus, mib))
        self.version += 1

    def enqueued(self, job_id: str, queue: str, charge: Charge) -> None:
        self.dequeued(job_id)
        self.queued[job_id] = (queue, charge)
        self.waiting[queue] = self.waiting.get(queue, ZERO) + charge
        self.waiting_jobs[queue] = self.waiting_jobs.get(queue, 0) + 1

    def dequeued(self, job_id: str) -> None:
        entry = self.queued.pop(job_id, None)
        self._no_room.pop(job_id, None)  # it no longer waits: nothing to remember for it
        if entry is not None:
            queue, charge = entry
            self.waiting[queue] = self.waiting[queue] - charge
            self.waiting_jobs[queue] -= 1

    def charge_of(self, job_id: str) -> Charge:
        """What a queued job charges its queue (as it was counted when it entered the queue)."""
        return self.queued[job_id][1]

    def demand(self) -> dict[str, Charge]:
        """Queue -> what its runs hold and its queued jobs ask for (what fair shares divide)."""
        demand = dict(self.usage)
        for name, charge in self.waiting.items():
            demand[name] = demand.get(name, ZERO) + charge
        return demand

    def signalled(self, job_id: str) -> None:
        """The run got the checkpoint signal for another reason than a reclaim: it is leaving."""
        if job_id in self.runs and job_id not in self.leaving:
            self.leaving[job_id] = None
            self.version += 1

    # ------------------------------------------------------------------ admission
    def refusal(self, queue: str, charge: Charge, given: Mapping[str, Charge]) -> str | None:
        """Why a job charging ``charge`` may not start in ``queue`` now (``given``: what this
        cycle already gave each queue), or None."""
        return self.refusal_of(queue)(charge, given)

    def refusal_of(self, queue: str) -> Callable[[Charge, Mapping[str, Charge]], str | None]:
        """``refusal(queue, charge, given)`` as a function of ``charge`` and ``given``, the queue's
        quota and use looked up once until a run starts, ends or shrinks (``version``): a cycle asks
        it of every job it looks at."""
        if self._refusals_at != self.version:
            self._refusals, self._refusals_at = {}, self.version
        made = self._refusals.get(queue)
        if made is None:
            made = self._refusals[queue] = _queue_refusal(self, queue)
        return made

    # ------------------------------------------------------------------ order and fair shares
    def order_share(self, queue: str, extra: Charge = ZERO) -> float:
        """The queue's weighted dominant share of its decayed use (with ``extra`` more): the
        lowest is served first."""
        return self.order_share_of(queue)(extra)

    def order_share_of(self, queue: str) -> Callable[[Charge], float]:
        """``order_share(queue, extra)`` as a function of ``extra``, the queue's quota and use looked
        up once (a cycle's order asks it again after each job it gives the queue)."""
        q = self.quota(queue)
        use = (self.usage if self.setup.half_life_s <= 0 else self._average).get(queue, ZERO)
        parts = [(i, self.capacity[i]) for i, c in enumerate(CURRENCIES) if q.governs(c) and self.capacity[i] > 0]
        weight = q.weight
        return lambda extra: max([(use[i] + extra[i]) / capacity for i, capacity in parts], default=0.0) / weight

    def fair_shares(self, demand: Mapping[str, Charge],
                    usage: Mapping[str, Charge] | None = None) -> dict[str, Charge]:
        """queue -> its fair share (``fair_share.water_fill`` in each currency, inside each cohort;
        the open cohort also divides what no queue is guaranteed). ``demand``: what each queue's
        runs hold and its jobs wait for; ``usage``: what its runs hold (default: now). A currency
        a queue does not govern: inf."""
        usage = self.usage if usage is None else usage
        names = set(self.quotas) | set(demand) | {n for n, use in usage.items() if use != ZERO}
        cohorts: dict[str | None, list[str]] = {}
        for name in sorted(names):
            cohorts.setdefault(self.quota(name).cohort, []).append(name)
        shares = {name: {c: math.inf for c in CURRENCIES} for name in names}
        for c in CURRENCIES:
            capacity = self.capacity.of(c)
            if c == "gpus":  # requests: collocation lets them exceed the GPUs
                capacity = max(capacity, sum(use.gpus for use in usage.values()))
            unassigned = max(0.0, capacity - sum(q.nominal(c) or 0.0 for q in self.quotas.values()))
            for cohort, members in cohorts.items():
                quotas = [self.quota(n) for n in members if self.quota(n).governs(c)]
                asked = {q.name: demand.get(q.name, ZERO).of(c) for q in quotas}
                floors = {q.name: min(asked[q.name], q.nominal(c) or 0.0) for q in quotas}
                caps = {q.name: max(floors[q.name], min(asked[q.name], q.ceiling(c))) for q in quotas}
                lent = sum(min(q.lendable(c), (q.nominal(c) or 0.0) - floors[q.name]) for q in quotas)
                extra = lent + (unassigned if cohort is None else 0.0)
                filled = water_fill(floors, caps, {q.name: q.weight for q in quotas}, sum(floors.values()) + extra)
                for name, share in filled.items():
                    shares[name][c] = share
        return {name: Charge(s["gpus"], s["mib"]) for name, s in shares.items()}

    # ------------------------------------------------------------------ preemption
    def reclaim(self, queue: str, need: Charge, keep: Mapping[str, Charge], now_s: float,
                fit: "JobFit") -> tuple[list[QuotaRun] | None, float | None]:
        """The runs to signal so that a job of ``queue`` charging ``need`` can start: runs of other
        queues of its cohort, each taken only while its queue keeps ``keep`` (its fair share, or its
        nominal quota); never of a queue that is not ``reclaimable``. They must free at least
        ``need`` and make the job fit (``fit``). None when no choice does: no run is preempted
        for a reclaim that cannot succeed. Also returns when a run too young to be preempted
        becomes old enough (None: none held it back)."""
        cohort = self.quota(queue).cohort
        holders: dict[str, Charge] = {}
        for name, use in self.usage.items():
            owner = self.quota(name)
            if name != queue and owner.cohort == cohort and owner.reclaimable:
                holders[name] = use - keep.get(name, ZERO)
        return self._choose(queue, need, holders, [r for r in self.runs.values() if r.queue in holders], now_s, fit)

    def lower_priority_runs(self, queue: str, priority: int, need: Charge, now_s: float,
                            fit: "JobFit") -> tuple[list[QuotaRun] | None, float | None]:
        """The queue's own runs of lower priority to signal so that a job of ``priority`` that
        charges ``need`` can start (queues with ``priority_preemption``)."""
        runs = [r for r in self.runs.values() if r.queue == queue and r.priority < priority]
        return self._choose(queue, need, {queue: Charge(math.inf, math.inf)}, runs, now_s, fit)

    def _choose(self, queue: str, need: Charge, holders: dict[str, Charge], runs: Iterable[QuotaRun], now_s: float,
                fit: "JobFit") -> tuple[list[QuotaRun] | None, float | None]:
        governed = [c for c in CURRENCIES if self.quota(queue).governs(c)]
        for job_id in self.leaving:
            run = self.runs[job_id]
            if run.queue in holders:
                holders[run.queue] = holders[run.queue] - run.charge

        def enough(freed: Charge) -> bool:
            return all(freed.of(c) >= need.of(c) - _EPS for c in governed)

        started = {job_id: i for i, job_id in enumerate(self.runs)}  # start order, for runs started together
        eligible: list[QuotaRun] = []
        ready_at: float | None = None
        for run in sorted(runs, key=lambda r: (r.priority, r.borrowed is False, -r.started_s, -started[r.job_id])):
            if not run.preemptible or run.job_id in self.leaving:
                continue
            old_enough_s = run.started_s + self.quota(run.queue).min_runtime_s
            if old_enough_s > now_s:
                ready_at = old_enough_s if ready_at is None else min(ready_at, old_enough_s)
                continue
            eligible.append(run)
        if not fit.fits(eligible):  # not even all of them would make room
            return None, ready_at
        chosen: list[QuotaRun] = []
        freed = ZERO
        fit.clear()
        for run in fit.arrange(eligible):  # those on the nodes where they make room first
            if enough(freed) and fit.fits_grown():
                break
            left = holders[run.queue]
            if any(run.charge.of(c) > left.of(c) + _EPS for c in CURRENCIES if self.quota(run.queue).governs(c)):
                continue  # its queue would fall below what it keeps
            chosen.append(run)
            freed = freed + run.charge
            holders[run.queue] = left - run.charge
            fit.grow(run)
        if not (enough(freed) and fit.fits_grown()):
            return None, ready_at
        # the runs the reclaim turned out not to need, the last chosen first
        for run in reversed(list(chosen)):
            rest = [r for r in chosen if r is not run]
            if enough(freed - run.charge) and fit.fits(rest):
                chosen, freed = rest, freed - run.charge
        self.leaving.update((run.job_id, queue) for run in chosen)
        self.version += bool(chosen)
        return chosen, None

    def note_no_room(self, job_id: str, ready_at: float | None) -> None:
        """No reclaim could make room for the job now (``ready_at``: when a run too young becomes old enough)."""
        self._no_room[job_id] = (self.version, ready_at)

    def known_no_room(self, job_id: str, now_s: float) -> tuple[bool, float | None]:
        """(Whether no reclaim can make room for the job: nothing changed since one found none and
        no run has become old enough since, when to look again)."""
        version, ready_at = self._no_room.get(job_id, (-1, None))
        return version == self.version and (ready_at is None or now_s < ready_at), ready_at


def _queue_refusal(book: QuotaBook, queue: str) -> Callable[[Charge, Mapping[str, Charge]], str | None]:
    """``QuotaBook.refusal`` of ``queue`` as it is now: its quota and use looked up once."""
    q = book.quota(queue)
    use = book.usage.get(queue, ZERO)
    # (index, currency, ceiling + eps, nominal) of each currency the queue governs
    checks = [(i, c, q.ceiling(c) + _EPS, q.nominal(c)) for i, c in enumerate(CURRENCIES) if q.governs(c)]

    def refusal(charge: Charge, given: Mapping[str, Charge]) -> str | None:
        used = use + given.get(queue, ZERO)
        for i, c, ceiling, nominal in checks:
            after = used[i] + charge[i]
            if after > ceiling:
                return f"queue {queue} over quota: {ratio_words(c, used[i], nominal)}, borrowing limit reached"
            if q.cohort is not None and after > (nominal or 0.0) + _EPS:
                lent = _left_to_lend(book, q.cohort, c, {queue: charge}, given)
                if lent < -_EPS:
                    return (f"queue {queue} would borrow {_amount(c, after - (nominal or 0.0))} beyond its quota; "
                            f"cohort {q.cohort} has no more to lend")
        return None
    return refusal


def _left_to_lend(book: QuotaBook, cohort: str, currency: str, adding: Mapping[str, Charge],
                  given: Mapping[str, Charge]) -> float:
    """What a named cohort's members lend (their unused nominal quota, up to each one's lending
    limit) less what its members borrow, with ``adding`` counted too."""
    lent = borrowed = 0.0
    for name, q in book.quotas.items():
        if q.cohort != cohort or not q.governs(currency):
            continue
        used = (book.usage.get(name, ZERO) + given.get(name, ZERO) + adding.get(name, ZERO)).of(currency)
        nominal = q.nominal(currency) or 0.0
        borrowed += max(0.0, used - nominal)
        lent += min(q.lendable(currency), max(0.0, nominal - used))
    return lent - borrowed
