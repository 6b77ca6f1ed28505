"""What team queues decide each cycle, for the scheduler (``team_queue_part``) to apply in both shells.

* ``entitlements``: what each queue is owed this cycle: its fair share (``QuotaBook.fair_shares``
  of what its runs hold and its jobs wait for), or its nominal quota when the configuration
  reclaims only up to that.
* (the order the planner tries the queued jobs in, in tiers of what each queue is owed, is
  ``cycle_order``'s.)
* ``preemptions``: after the plan, the runs to ask to checkpoint and leave: for each queue whose
  waiting jobs stay within what it is owed, what other queues of its cohort hold beyond what they
  are owed (``QuotaBook.reclaim``); and, in queues that turn it on, the queue's own runs of lower
  priority than its first waiting job (``QuotaBook.lower_priority_runs``). Only runs whose leaving
  lets the job fit (``reclaim_fit``), and none while the runs already leaving make room enough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from dataclasses import dataclass

from hier_sched.core.gpu import Placement
from hier_sched.core.queueing import QueuedJob
from hier_sched.core.quota_book import QuotaBook, QuotaRun, JobFit
from hier_sched.core.quotas import ZERO, Charge
from hier_sched.core.reclaim_fit import ReclaimFit

__all__ = ["Entitlements", "entitlements", "by_queue", "preemptions", "Preemption"]


class Entitlements:
    """Queue -> what it is owed this cycle (``owed``: what a reclaim leaves it, at least), worked
    out from the cycle's starting picture when first asked: most cycles never ask (no queue past
    its nominal quota, no job left waiting after the plan), and the fair shares were a tenth of a
    cycle with team queues (BENCHMARKS.md, "Shared clusters")."""

    __slots__ = ("_work_out", "_owed", "up_to")

    def __init__(self, work_out: Callable[[], Mapping[str, Charge]], up_to: str):
        self._work_out: Callable[[], Mapping[str, Charge]] | None = work_out
        self._owed: Mapping[str, Charge] | None = None
        self.up_to = up_to  # "fair share" or "nominal quota", in words

    @property
    def owed(self) -> Mapping[str, Charge]:
        if self._work_out is not None:
            self._owed, self._work_out = self._work_out(), None
        assert self._owed is not None
        return self._owed


def entitlements(book: QuotaBook) -> Entitlements:
    """What each queue is owed, as the book stands now (placing this cycle's jobs changes it)."""
    if book.setup.reclaim == "fair_share":
        demand, usage = book.demand(), dict(book.usage)
        return Entitlements(lambda: book.fair_shares(demand, usage), "fair share")
    names = set(book.usage) | set(book.quotas) | set(book.waiting)
    nominal = {name: book.nominal(name) for name in names}
    return Entitlements(lambda: nominal, "nominal quota")


def by_queue(order: Sequence[QueuedJob]) -> dict[str, list[QueuedJob]]:
    """The queued jobs of each team queue, in queue order."""
    jobs: dict[str, list[QueuedJob]] = {}
    for q in order:
        jobs.setdefault(q.queue, []).append(q)
    return jobs


@dataclass(frozen=True, slots=True)
class Preemption:
    run: QuotaRun
    for_queue: str
    why: str


def preemptions(book: QuotaBook, queues: Mapping[str, list[QueuedJob]], owed: Entitlements, fit: ReclaimFit,
                placements_of: Callable[[str], Sequence[Placement]],
                now_s: float) -> tuple[list[Preemption], dict[str, list[str]], float | None]:
    """(The runs to ask to checkpoint and leave, queue -> its waiting jobs they make room for,
    when a run now too young to be preempted becomes old enough.) ``queues``: each team queue's
    jobs in queue order (those that started this cycle are skipped); ``fit``: where the jobs
    could go once the runs asked to leave are gone (``reclaim_fit``); ``placements_of``: a
    running job's placements."""
    out: list[Preemption] = []
    starved: dict[str, list[str]] = {}
    ready_at: list[float] = []

    def preempt(queue: str, job: QueuedJob, choose: Callable[[Charge, JobFit], tuple[list[QuotaRun] | None,
                                                                                 float | None]], why: str) -> bool:
        """Make room for ``job`` (it takes its room there): the runs ``choose(need, fit)`` picks."""
        if fit.take(job):  # it fits once the runs already leaving are gone: nothing more to preempt
            starved.setdefault(queue, []).append(job.job_id)
            return True
        known, ready = book.known_no_room(job.job_id, now_s)
        if not known:
            runs, ready = choose(book.charge_of(job.job_id), _ReclaimJobFit(fit, job, placements_of))
        if ready is not None:
            ready_at.append(ready)
        if known or runs is None:
            if not known:
                book.note_no_room(job.job_id, ready)
            return False
        out.extend(Preemption(run, queue, why) for run in runs)
        fit.free_up(p for r in runs for p in placements_of(r.job_id))
        fit.take(job)
        starved.setdefault(queue, []).append(job.job_id)
        return True

    for queue, jobs in queues.items():
        waiting = (q for q in jobs if q.job_id in book.queued)  # those that did not start, looked at lazily
        first = next(waiting, None)
        if first is None:
            continue
        # (its bound looked up once: a reclaim marks runs as leaving, the queue's use stays as counted)
        within_level, owed_to_jobs = book.within_of(queue, owed.owed.get(queue, ZERO)), ZERO
        for q in chain((first,), waiting):  # job by job: room for the first jobs is not held up by the rest
            owed_to_jobs = owed_to_jobs + book.charge_of(q.job_id)
            if not within_level(owed_to_jobs) or not preempt(
                    queue, q, lambda need, job_fit: book.reclaim(queue, need, owed.owed, now_s, job_fit),
                    f"queue {queue} reclaims what its {owed.up_to} gives it"):
                break
        if book.quota(queue).priority_preemption and first.job_id not in starved.get(queue, ()):
            preempt(queue, first, lambda need, job_fit: book.lower_priority_runs(queue, first.priority, need, now_s, job_fit),
                    f"job {first.job_id} of priority {first.priority} preempts lower priorities in queue {queue}")
    return out, starved, min(ready_at, default=None)


class _ReclaimJobFit:
    """Whether one waiting job fits once the runs counted gone leave (``quota_book.JobFit``)."""

    def __init__(self, fit: ReclaimFit, job: QueuedJob, placements_of: Callable[[str], Sequence[Placement]]):
        self.fit, self.job, self.placements_of = fit, job, placements_of
        self._grown = fit.grown(job)

    def fits(self, runs: Sequence[QuotaRun]) -> bool:
        return self.fit.fits(self.job, [p for r in runs for p in self.placements_of(r.job_id)])

    def arrange(self, runs: Sequence[QuotaRun]) -> list[QuotaRun]:
        return self.fit.arrange(self.job, [(r, self.placements_of(r.job_id)) for r in runs])

    def clear(self) -> None:
        self._grown = self.fit.grown(self.job)

    def grow(self, run: QuotaRun) -> None:
        self._grown.add(self.placements_of(run.job_id))

    def fits_grown(self) -> bool:
        return self._grown.fits()
