"""The queue: the jobs waiting for GPUs, kept in queue order, and why each waits (``JobQueue``).

It owns one invariant. The last plan's wait reasons (``WaitReasons``) read this queue's own sorted
list for the jobs the plan did not look at, instead of copying them out of it; so every insert
and remove is reported to them here, where the list changes, and nowhere else. A plan given
another list (a team-queue order: this cycle's copy, which no one changes) needs no reports.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial

from sortedcontainers import SortedKeyList

from hier_sched.core.queued_job import QueuedJob, queue_key
from hier_sched.core.wait_reasons import WaitReasons

__all__ = ["JobQueue"]


class JobQueue(Mapping[str, QueuedJob]):
    """Job id -> its queue entry, in queue order (``queue_key``) when iterated through ``order``."""

    def __init__(self, gangs_first: bool):
        self._entries: dict[str, QueuedJob] = {}
        # The queue in queue order, kept sorted as jobs come and go, so that a step over a long
        # queue does not sort it again (a job's key does not change while it waits). Not a list:
        # jobs leave from near the front, where a list of 100,000 moves every entry behind them
        # (a job out and back in: 135 us; here 14 us, BENCHMARKS.md "Scheduling decision latency").
        self._key = partial(queue_key, gangs_first=gangs_first)
        self._order: SortedKeyList = SortedKeyList(key=self._key)
        self._waiting = WaitReasons()
        self._waiting_reads_order = True  # the wait reasons' rest is a range of ``_order``

    def __getitem__(self, job_id: str) -> QueuedJob:
        return self._entries[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    @property
    def order(self) -> Sequence[QueuedJob]:
        """The queued jobs in queue order (read-only: ``add`` and ``remove`` keep it)."""
        return self._order

    @property
    def waiting(self) -> WaitReasons:
        """Queued job -> why it did not start in the last plan (the plan's words)."""
        return self._waiting

    def planned(self, waiting: WaitReasons, order: Sequence[QueuedJob]) -> None:
        """A plan over ``order`` said why each job waits."""
        self._waiting = waiting
        self._waiting_reads_order = order is self._order

    def add(self, q: QueuedJob) -> None:
        """Into the queue at its place (out first, if it was in)."""
        self.remove(q.job_id)
        self._entries[q.job_id] = q
        i = self._order.bisect_key_right(self._key(q))
        self._order.add(q)  # (after the jobs of an equal key, as ``bisect_key_right`` found)
        if self._waiting_reads_order:
            self._waiting.queue_changed(i, q, inserted=True)

    def remove(self, job_id: str) -> QueuedJob | None:
        """Out of the queue; the entry taken out (None: it was not queued)."""
        q = self._entries.pop(job_id, None)
        if q is not None:
            i = self._order.bisect_key_left(self._key(q))
            assert self._order[i] is q, "a queued job's ordering fields changed while it waited"
            del self._order[i]
            if self._waiting_reads_order:
                self._waiting.queue_changed(i, q, inserted=False)
        return q
