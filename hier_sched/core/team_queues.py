"""What team queues decide each cycle, for the scheduler (``lifecycle``) to apply in both shells.

* ``cycle_order``: the order the planner tries the queued jobs in. Jobs that stay within their
  queue's nominal quota go first, then those that would borrow; within each part the queues take
  turns, the one with the lowest weighted dominant share of its decayed use first
  (``QuotaBook.order_share``), and each job it is given counts against it at once, so a queue
  with many waiting jobs does not take every turn. Inside a queue its own order holds (priority,
  then submission).
* ``preemptions``: after the plan, the runs to ask to checkpoint and leave: for each queue whose
  waiting jobs it could run within its fair share (or nominal quota), what other queues of its
  cohort hold beyond theirs (``QuotaBook.reclaim``); and, in queues that turn it on, the queue's
  own runs of lower priority than its first waiting job (``QuotaBook.lower_priority_runs``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hier_sched.core.queueing import QueuedJob
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quotas import CURRENCIES, ZERO, Charge

__all__ = ["cycle_order", "demand_of", "preemptions", "Preemption"]

_EPS = 1e-6


def cycle_order(order: Sequence[QueuedJob], book: QuotaBook, no_estimate_mib: float) -> list[QueuedJob]:
    """The queued jobs in this cycle's order. ``order``: the queue in its own order."""
    within: dict[str, list[QueuedJob]] = {}
    borrowing: dict[str, list[QueuedJob]] = {}
    counted: dict[str, Charge] = {}
    for q in order:
        charge = q.charge(no_estimate_mib)
        if book.within_nominal(q.queue, charge, counted.get(q.queue, ZERO)):
            counted[q.queue] = counted.get(q.queue, ZERO) + charge
            within.setdefault(q.queue, []).append(q)
        else:
            borrowing.setdefault(q.queue, []).append(q)
    return _take_turns(within, book, {}, no_estimate_mib) + _take_turns(borrowing, book, counted, no_estimate_mib)


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
        if len(turns) == 0:  # the last queue with jobs left: the rest of them, in its order
            out.extend(jobs[nxt[name]:])
            break
        q = jobs[nxt[name]]
        out.append(q)
        nxt[name] += 1
        counted[name] = counted.get(name, ZERO) + q.charge(no_estimate_mib)
        if nxt[name] < len(jobs):
            heapq.heappush(turns, (book.order_share(name, counted[name]), name))
    return out


def demand_of(book: QuotaBook, waiting: Sequence[QueuedJob], no_estimate_mib: float) -> dict[str, Charge]:
    """Queue -> what its runs hold and its queued jobs ask for (what fair shares divide)."""
    demand = dict(book.usage)
    for q in waiting:
        demand[q.queue] = demand.get(q.queue, ZERO) + q.charge(no_estimate_mib)
    return demand


@dataclass(frozen=True, slots=True)
class Preemption:
    run: QuotaRun
    for_queue: str
    why: str


def preemptions(book: QuotaBook, waiting: Sequence[QueuedJob], no_estimate_mib: float,
                now_s: float) -> tuple[list[Preemption], dict[str, list[str]], float | None]:
    """(The runs to ask to checkpoint and leave, queue -> its waiting jobs they make room for,
    when a run now too young to be preempted becomes old enough.) ``waiting``: the jobs that did
    not start this cycle, in its order."""
    if book.setup.reclaim == "fair_share":
        keep = book.fair_shares(demand_of(book, waiting, no_estimate_mib))
        up_to = "fair share"
    else:
        keep = {name: Charge(*(math.inf if q.nominal(c) is None else q.nominal(c) for c in CURRENCIES))
                for name, q in ((n, book.quota(n)) for n in set(book.usage) | {q.queue for q in waiting})}
        up_to = "nominal quota"
    owed: dict[str, list[QueuedJob]] = {}  # queue -> its waiting jobs within what it keeps, in order
    counted: dict[str, Charge] = {}
    first_of: dict[str, QueuedJob] = {}
    for q in waiting:
        first_of.setdefault(q.queue, q)
        charge = q.charge(no_estimate_mib)
        quota, level = book.quota(q.queue), keep.get(q.queue, ZERO)
        after = book.usage.get(q.queue, ZERO) + counted.get(q.queue, ZERO) + charge
        if all(after.of(c) <= level.of(c) + _EPS for c in CURRENCIES if quota.governs(c)):
            counted[q.queue] = counted.get(q.queue, ZERO) + charge
            owed.setdefault(q.queue, []).append(q)
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

    for queue, jobs in owed.items():
        need = ZERO
        for q in jobs:  # job by job: a reclaim that frees room for the first jobs is not held up by the rest
            need = need + q.charge(no_estimate_mib)
            runs, ready = book.reclaim(queue, need, keep, now_s)
            if not take(queue, q, runs, ready, f"queue {queue} reclaims what its {up_to} gives it"):
                break
    for queue, q in first_of.items():
        if book.quota(queue).priority_preemption and q.job_id not in starved.get(queue, ()):
            runs, ready = book.lower_priority_runs(queue, q.priority, q.charge(no_estimate_mib), now_s)
            take(queue, q, runs, ready, f"job {q.job_id} of priority {q.priority} preempts lower priorities in "
                                        f"queue {queue}")
    return out, starved, min(ready_at, default=None)
