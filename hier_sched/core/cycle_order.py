"""The order a planning cycle tries the queued jobs in when there are team queues (``cycle_order``).

Three tiers: jobs within their queue's nominal quota, then jobs within what their queue is owed
(``team_queues.Entitlements``), then the rest (they borrow what others leave idle). Within a tier
the queues take turns, the one with the lowest weighted dominant share of its decayed use first
(``QuotaBook.order_share``), and each job it is given counts against it at once, so a queue with
many waiting jobs does not take every turn. Inside a queue its own order holds (priority, then
submission), and a queue's first job that fits no tier puts the rest of its jobs in the last one.
So capacity taken back for a queue goes to that queue's jobs, not back to the borrower.

Cost: the order is worked out only as far as it is read. A cycle used to put every queue's jobs
in their tiers, copy the rest of each queue into the last tier, and give every turn of the first
two tiers and ``turns`` of the last before the planner read any of it; the planner reads its head
and the backfill depth past it, or fewer. Now each queue's next job is put in its tier when the
turns reach it (``_Lane``); past the turns the rest follow in queue order, listed only if read.
The order read is the one the tiers give, whoever reads it, as long as the book and the queues
stay as they were: their owner freezes it first (``CycleOrder.freeze``), and past what was read it
is the queue's own order from then on.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice

from hier_sched.core.queued_job import QueuedJob
from hier_sched.core.quota_book import QuotaBook
from hier_sched.core.quotas import ZERO, Charge
from hier_sched.core.team_queues import Entitlements

__all__ = ["CycleOrder", "cycle_order"]


def cycle_order(order: Sequence[QueuedJob], queues: Mapping[str, list[QueuedJob]], book: QuotaBook,
                owed: Entitlements, turns: int) -> "CycleOrder":
    """The queued jobs in this cycle's order (the tiers above). ``order``: the queue in its own
    order; ``queues``: the same jobs by team queue (``team_queues.by_queue``); ``owed``: what
    each queue is owed (read only once a queue's job is past its nominal quota)."""
    return CycleOrder(_turns(queues, book, owed, turns), order)


class CycleOrder(Sequence[QueuedJob]):
    """The cycle's order: the jobs the tiers put in turn, worked out as far as they are read, then
    the rest of the queue in its own order, listed only if the planner reads that far (rarely: it
    stops at the backfill depth, which the turns cover)."""

    def __init__(self, turns: Iterator[QueuedJob], order: Sequence[QueuedJob]):
        self._first: list[QueuedJob] = []
        self._turns: Iterator[QueuedJob] | None = turns
        self._order = order
        self._all: list[QueuedJob] | None = None

    def freeze(self) -> None:
        """The book or the queues are about to change: what was read stays, the rest is the queue's order."""
        self._turns = None

    def _read_to(self, stop: int) -> None:
        """Take the turns up to position ``stop`` (all of them, if fewer)."""
        if self._turns is not None and len(self._first) < stop:
            self._first.extend(islice(self._turns, stop - len(self._first)))
            if len(self._first) < stop:
                self._turns = None  # every turn taken

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index):  # type: ignore[override]
        if self._all is None:
            stop = index.indices(len(self))[1] if isinstance(index, slice) else index + 1
            if 0 < stop and (isinstance(index, slice) or index >= 0):
                self._read_to(stop)
                if stop <= len(self._first):
                    return self._first[index]
        return self._everything()[index]

    def __iter__(self) -> Iterator[QueuedJob]:
        first, i = self._first, 0
        while True:
            if i >= len(first):
                self._read_to(i + 1)
                if i >= len(first):
                    break
            yield first[i]
            i += 1
        if i < len(self._order):
            yield from self._everything()[i:]

    def _everything(self) -> list[QueuedJob]:
        if self._all is None:
            self._read_to(len(self._order))
            listed = {id(q) for q in self._first}
            self._all = self._first + [q for q in self._order if id(q) not in listed]
        return self._all


class _Lane:
    """One team queue's jobs as the turns reach them: the next one and the tier it falls in, with
    what the queue's jobs before it in the first two tiers charge (``used``)."""

    __slots__ = ("name", "jobs", "at", "used", "share", "_after", "_tier", "_within_nominal", "_within_level")

    def __init__(self, name: str, jobs: list[QueuedJob], book: QuotaBook):
        self.name, self.jobs, self.at, self.used = name, jobs, 0, ZERO
        self.share = book.order_share_of(name)  # its order share, given what its turns count against it
        self._after: Charge = ZERO  # ``used`` with the next job (when ``_tier`` is known)
        self._tier: int | None = None  # the next job's tier, once worked out
        self._within_nominal = book.within_of(name, book.nominal(name))
        self._within_level: Callable[[Charge], bool] | None = None  # looked up once a job is past nominal

    def tier(self, book: QuotaBook, owed: Entitlements) -> int | None:
        """The next job's tier (None: no job left)."""
        if self.at >= len(self.jobs):
            return None
        if self._tier is None:
            after = self.used + book.charge_of(self.jobs[self.at].job_id)
            if self._within_nominal(after):
                self._tier = 0
            else:
                if self._within_level is None:
                    self._within_level = book.within_of(self.name, owed.owed.get(self.name, ZERO))
                self._tier = 1 if self._within_level(after) else 2
            self._after = after
        return self._tier

    def take(self) -> QueuedJob:
        """The next job, given its turn (one of the first two tiers counts in ``used``; after a job
        of the last tier, every later one is of it too)."""
        q = self.jobs[self.at]
        self.at += 1
        if self._tier != 2:
            self.used, self._tier = self._after, None
        return q


def _turns(queues: Mapping[str, list[QueuedJob]], book: QuotaBook, owed: Entitlements,
           turns: int) -> Iterator[QueuedJob]:
    """The jobs of the tiers in turn: every one of the first two, then the first ``turns`` of the last."""
    lanes = [_Lane(name, jobs, book) for name, jobs in queues.items() if jobs]
    counted: dict[str, Charge] = {}  # queue -> what the jobs given their turn so far charge it
    for tier in (0, 1, 2):
        def in_tier(lane: _Lane, tier: int = tier) -> bool:
            return lane.tier(book, owed) == tier
        yield from _take_turns([lane for lane in lanes if in_tier(lane)], in_tier, book, counted,
                               limit=turns if tier == 2 else None)


def _take_turns(lanes: list[_Lane], in_tier: Callable[[_Lane], bool], book: QuotaBook, counted: dict[str, Charge],
                limit: int | None) -> Iterator[QueuedJob]:
    """The lanes' jobs of one tier (the first ``limit``; ``in_tier``: whether a lane's next job is
    of it), one at a time from the queue with the lowest share, with what was counted against it
    so far; ``counted`` grows with each job given."""
    by_name = {lane.name: lane for lane in lanes}
    heap = [(lane.share(counted.get(lane.name, ZERO)), lane.name) for lane in lanes]
    heapq.heapify(heap)
    given = 0
    while heap and (limit is None or given < limit):
        lane = by_name[heapq.heappop(heap)[1]]
        if not heap:  # the last queue with jobs left: the rest of them, in its order (counted no more)
            while in_tier(lane) and (limit is None or given < limit):
                yield lane.take()
                given += 1
            return
        q = lane.take()
        yield q
        given += 1
        counted[lane.name] = charged = counted.get(lane.name, ZERO) + book.charge_of(q.job_id)
        if in_tier(lane):
            heapq.heappush(heap, (lane.share(charged), lane.name))
