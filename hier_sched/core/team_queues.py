"""What team queues decide each cycle, for the scheduler (``lifecycle``) to apply in both shells.

* ``entitlements``: what each queue is owed this cycle: its fair share (``QuotaBook.fair_shares``
  of what its runs hold and its jobs wait for), or its nominal quota when the configuration
  reclaims only up to that.
* ``cycle_order``: the order the planner tries the queued jobs in, in three tiers: jobs within
  their queue's nominal quota, then jobs within what their queue is owed, then the rest (they
  borrow what others leave idle). Within a tier the queues take turns, the one with the lowest
  weighted dominant share of its decayed use first (``QuotaBook.order_share``), and each job it
  is given counts against it at once, so a queue with many waiting jobs does not take every
  turn. Inside a queue its own order holds (priority, then submission). So capacity taken back
  for a queue goes to that queue's jobs, not back to the borrower.
* ``preemptions``: after the plan, the runs to ask to checkpoint and leave: for each queue whose
  waiting jobs stay within what it is owed, what other queues of its cohort hold beyond what they
  are owed (``QuotaBook.reclaim``); and, in queues that turn it on, the queue's own runs of lower
  priority than its first waiting job (``QuotaBook.lower_priority_runs``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hier_sched.core.queueing import QueuedJob
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quotas import ZERO, Charge

__all__ = ["Entitlements", "entitlements", "cycle_order", "demand_of", "preemptions", "Preemption"]


@dataclass(frozen=True, slots=True)
class Entitlements:
    owed: Mapping[str, Charge]  # queue -> what it is owed (what a reclaim leaves it, at least)
    up_to: str  # "fair share" or "nominal quota", in words


def demand_of(book: QuotaBook, waiting: Sequence[QueuedJob], no_estimate_mib: float) -> dict[str, Charge]:
    """Queue -> what its runs hold and its queued jobs ask for (what fair shares divide)."""
    demand = dict(book.usage)
    for q in waiting:
        demand[q.queue] = demand.get(q.queue, ZERO) + q.charge(no_estimate_mib)
    return demand


def entitlements(book: QuotaBook, waiting: Sequence[QueuedJob], no_estimate_mib: float) -> Entitlements:
    if book.setup.reclaim == "fair_share":
        return Entitlements(book.fair_shares(demand_of(book, waiting, no_estimate_mib)), "fair share")
    names = set(book.usage) | set(book.quotas) | {q.queue for q in waiting}
    return Entitlements({name: book.nominal(name) for name in names}, "nominal quota")


def cycle_order(order: Sequence[QueuedJob], book: QuotaBook, owed: Entitlements,
                no_estimate_mib: float) -> list[QueuedJob]:
    """The queued jobs in this cycle's order (the tiers above). ``order``: the queue in its own order."""
    tiers: tuple[dict[str, list[QueuedJob]], ...] = ({}, {}, {})
    nominal_counted: dict[str, Charge] = {}
    owed_counted: dict[str, Charge] = {}
    for q in order:
        charge = q.charge(no_estimate_mib)
        name = q.queue
        if book.within_nominal(name, charge, nominal_counted.get(name, ZERO)):
            tier = 0
            nominal_counted[name] = nominal_counted.get(name, ZERO) + charge
        elif book.within(name, owed.owed.get(name, ZERO), charge, owed_counted.get(name, ZERO)):
            tier = 1
        else:
            tiers[2].setdefault(name, []).append(q)
            continue
        owed_counted[name] = owed_counted.get(name, ZERO) + charge
        tiers[tier].setdefault(name, []).append(q)
    counted: dict[str, Charge] = {}
    return [q for tier in tiers for q in _take_turns(tier, book, counted, no_estimate_mib)]


def _take_turns(by_queue: Mapping[str, list[QueuedJob]], book: QuotaBook, counted: dict[str, Charge],
                no_estimate_mib: float) -> list[QueuedJob]:
    """The jobs of every queue, one at a time from the queue with the lowest share (with what
    was counted against it so far); ``counted`` grows with each job given."""
    turns = [(book.order_share(name, counted.get(name, ZERO)), name) for name in by_queue]
    heapq.heapify(turns)
    nxt = dict.fromkeys(by_queue, 0)
    out: list[QueuedJob] = []
    while turns:
        _, name = heapq.heappop(turns)
        jobs = by_queue[name]
        if not turns:  # the last queue with jobs left: the rest of them, in its order
            out.extend(jobs[nxt[name]:])
            break
        q = jobs[nxt[name]]
        out.append(q)
        nxt[name] += 1
        counted[name] = counted.get(name, ZERO) + q.charge(no_estimate_mib)
        if nxt[name] < len(jobs):
            heapq.heappush(turns, (book.order_share(name, counted[name]), name))
    return out


@dataclass(frozen=True, slots=True)
class Preemption:
    run: QuotaRun
    for_queue: str
    why: str


def preemptions(book: QuotaBook, waiting: Sequence[QueuedJob], owed: Entitlements, no_estimate_mib: float,
                now_s: float) -> tuple[list[Preemption], dict[str, list[str]], float | None]:
    """(The runs to ask to checkpoint and leave, queue -> its waiting jobs they make room for,
    when a run now too young to be preempted becomes old enough.) ``waiting``: the jobs that did
    not start this cycle, in its order."""
    owed_jobs: dict[str, list[QueuedJob]] = {}  # queue -> its waiting jobs within what it is owed, in order
    counted: dict[str, Charge] = {}
    first_of: dict[str, QueuedJob] = {}
    for q in waiting:
        first_of.setdefault(q.queue, q)
        charge = q.charge(no_estimate_mib)
        if book.within(q.queue, owed.owed.get(q.queue, ZERO), charge, counted.get(q.queue, ZERO)):
            counted[q.queue] = counted.get(q.queue, ZERO) + charge
            owed_jobs.setdefault(q.queue, []).append(q)
    out: list[Preemption] = []
    starved: dict[str, list[str]] = {}
    ready_at: list[float] = []

    def take(queue: str, job: QueuedJob, runs: list[QuotaRun] | None, ready: float | None, why: str) -> bool:
        if ready is not None:
            ready_at.append(ready)
        if runs is None:
            return False
        out.extend(Preemption(run, queue, why) for run in runs)
        starved.setdefault(queue, []).append(job.job_id)
        return True

    for queue, jobs in owed_jobs.items():
        need = ZERO
        for q in jobs:  # job by job: a reclaim that frees room for the first jobs is not held up by the rest
            need = need + q.charge(no_estimate_mib)
            runs, ready = book.reclaim(queue, need, owed.owed, now_s)
            if not take(queue, q, runs, ready, f"queue {queue} reclaims what its {owed.up_to} gives it"):
                break
    for queue, q in first_of.items():
        if book.quota(queue).priority_preemption and q.job_id not in starved.get(queue, ()):
            runs, ready = book.lower_priority_runs(queue, q.priority, q.charge(no_estimate_mib), now_s)
            take(queue, q, runs, ready, f"job {q.job_id} of priority {q.priority} preempts lower priorities in "
                                        f"queue {queue}")
    return out, starved, min(ready_at, default=None)
