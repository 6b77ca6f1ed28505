"""Why each queued job did not start in the last plan (``WaitReasons``), and the words the plan shares.

``plan_cycle`` writes them; the queue (``job_queue.JobQueue``) keeps them and tells them of every
change of its order, which they read for the jobs the plan did not look at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from hier_sched.core.queued_job import QueuedJob

__all__ = ["WaitReasons", "NO_NODE_HAS", "SMALLER_FAILED"]

NO_NODE_HAS = "no node has"  # how a refusal by every node starts (``wait_reason`` drops it when it repeats)
SMALLER_FAILED = ("a smaller job of the same kind could not start this cycle",)


class WaitReasons(Mapping[str, tuple[str, ...]]):
    """Why each queued job did not start this cycle, put in words only when someone reads them:
    a cycle over a long queue costs what it decides, not what it could say.

    * A refusal is kept as the question that gets its words (a callable) until it is read.
    * The jobs that wait because a smaller job of their kind failed (most of those looked at
      past a blocked head) are a list until someone reads them.
    * Once the rest of the queue can only wait (behind a strict-FIFO head, past the backfill
      depth), the cycle stops looking: those jobs share one reason. They are not copied out of
      the queue (copying ~10,000 references was a tenth of a cycle): the rest is a range of the
      queue's own list, read when someone asks. An owner that changes that list afterwards says
      where (``queue_changed``), and the rest stays the jobs it was."""

    __slots__ = ("own", "smaller_failed", "_queue", "_start", "_stop", "_joined", "_left", "_rest_reason",
                 "_rest_ids")

    def __init__(self) -> None:
        self.own: dict[str, tuple[str, ...] | Callable[[], tuple[str, ...]]] = {}
        # The jobs waiting for ``SMALLER_FAILED``, put into ``own`` when read (their ids are not
        # read before: a cycle writes ~250 of them, and each id is one more object to touch).
        self.smaller_failed: list[QueuedJob] = []
        self._queue: Sequence[QueuedJob] = ()
        self._start = self._stop = 0  # the rest is ``_queue[_start:_stop]`` ...
        self._joined: set[str] = set()  # ... without the jobs put into that range since ...
        self._left: list[QueuedJob] = []  # ... and with the jobs taken out of it since
        self._rest_reason: tuple[str, ...] = ()
        self._rest_ids: frozenset[str] | None = None

    def __setitem__(self, job_id: str, reasons: tuple[str, ...] | Callable[[], tuple[str, ...]]) -> None:
        self.own[job_id] = reasons

    def set_rest(self, queue: Sequence[QueuedJob], start: int, reason: str) -> None:
        """Every job of ``queue[start:]`` (not looked at this cycle) waits for ``reason``."""
        self._queue, self._start, self._stop, self._rest_reason = queue, start, len(queue), (reason,)
        self._joined, self._left, self._rest_ids = set(), [], None

    def queue_changed(self, index: int, job: QueuedJob, inserted: bool) -> None:
        """The queue given to ``set_rest`` changed: ``job`` was inserted at ``index``, or removed
        from there (``inserted`` False)."""
        if self._start == self._stop and not self._left:
            return  # no rest
        self._rest_ids = None
        step = 1 if inserted else -1
        if index < self._start or (inserted and index == self._start):  # before the rest: it moves
            self._start += step
            self._stop += step
        elif index < self._stop:  # inside it
            self._stop += step
            if inserted:
                self._joined.add(job.job_id)
            elif job.job_id in self._joined:
                self._joined.discard(job.job_id)
            else:
                self._left.append(job)

    def _rest(self) -> Iterator[QueuedJob]:
        joined = self._joined
        for job in self._queue[self._start:self._stop]:  # (one slice: the queue's sorted list finds each index in log time)
            if not joined or job.job_id not in joined:
                yield job
        yield from self._left

    def _own_reasons(self) -> dict[str, tuple[str, ...] | Callable[[], tuple[str, ...]]]:
        if self.smaller_failed:
            self.own.update((j.job_id, SMALLER_FAILED) for j in self.smaller_failed)
            self.smaller_failed = []
        return self.own

    def __getitem__(self, job_id: str) -> tuple[str, ...]:
        reasons = self._own_reasons().get(job_id)
        if callable(reasons):
            reasons = self.own[job_id] = reasons()
        if reasons is not None:
            return reasons
        if self._rest_ids is None:
            self._rest_ids = frozenset(j.job_id for j in self._rest())
        if job_id in self._rest_ids:
            return self._rest_reason
        raise KeyError(job_id)

    def __iter__(self) -> Iterator[str]:
        yield from self._own_reasons()
        for j in self._rest():
            yield j.job_id

    def __len__(self) -> int:
        rest = self._stop - self._start - len(self._joined) + len(self._left)
        return len(self.own) + len(self.smaller_failed) + rest
