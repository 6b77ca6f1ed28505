"""Team queues with GPU quotas: the configuration, and the book of what each queue uses.

A queue has a nominal quota (GPUs guaranteed to it) and a borrowing limit (GPUs it may use
beyond its nominal quota while others leave them idle; none: any idle GPU). A job names its
queue in its spec (``queue``); a job that names none is in its user's queue if one has the
user's name, else in ``default``, which has no guarantee and no limit unless the configuration
defines it. GPUs are counted whole: a job charges its
queue its ``gpus`` (a gang counts whole) from the step its run starts to the step it ends.

The rules, applied by the scheduler (``lifecycle``) in both shells:

* **Admission.** A job that would take its queue beyond nominal + borrowing limit waits, with
  the reason ``queue team-a over quota: 4/2 GPUs, borrowing limit reached``; it does not block
  the jobs behind it (it waits for quota, not for GPUs).
* **Order.** Jobs that fit within their queue's nominal quota go first, in queue order; jobs
  that would borrow come after them, so a borrower takes only what the guaranteed jobs leave idle.
* **Reclaim.** A job within its queue's nominal quota that cannot start takes back GPUs that
  other queues borrow: their newest runs that can checkpoint (``checkpoint_dir``) get the
  checkpoint signal, are stopped if they have not exited when the grace ends, and requeue to
  resume from their checkpoint (``victims``).

The configuration file's format and its validation are ``queues_spec``'s. No configuration
(``Scheduler.quotas`` None) is today's scheduler, with none of this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["resolve_queue", "DEFAULT_QUEUE", "QueueQuota", "QuotaBook", "QuotaRun", "queue_rows"]

DEFAULT_QUEUE = "default"


@dataclass(frozen=True, slots=True)
class QueueQuota:
    name: str
    nominal_gpus: int = 0
    borrowing_limit_gpus: int | None = None  # GPUs beyond nominal it may use; None: any idle GPU

    @property
    def ceiling(self) -> float:
        """The most GPUs its jobs may hold at once."""
        limit = self.borrowing_limit_gpus
        return float("inf") if limit is None else self.nominal_gpus + limit


def resolve_queue(book: "QuotaBook | None", queue: str | None, user: str) -> str:
    """A job's queue, decided when it is submitted: the one it names, else the queue named like
    its user if there is one, else ``default``."""
    if queue is not None:
        return queue
    return user if book is not None and user in book.quotas else DEFAULT_QUEUE


# ------------------------------------------------------------------ the book
@dataclass(frozen=True, slots=True)
class QuotaRun:
    """A run as its queue's quota counts it, and what a reclaim asks of it."""

    job_id: str
    queue: str
    gpus: int
    priority: int
    started_s: float
    preemptible: bool  # it can checkpoint


class QuotaBook:
    """The queues, the runs their quotas count, and the runs signalled to leave."""

    def __init__(self, queues: Iterable[QueueQuota]):
        self.quotas = {q.name: q for q in queues}
        self.usage: dict[str, int] = {}
        self.runs: dict[str, QuotaRun] = {}
        # Runs that got the checkpoint signal and have not ended: job -> the queue they make room
        # for (None: signalled for another reason, a slot's end or a user). Never picked again.
        self.leaving: dict[str, str | None] = {}

    def quota(self, queue: str) -> QueueQuota:
        """The queue's quota; a queue the configuration does not define (``default``, or one named
        by jobs submitted before the configuration changed) has no guarantee and no limit."""
        return self.quotas.get(queue) or QueueQuota(queue)

    def unknown_queue(self, queue: str | None) -> str | None:
        """Why a job may not name ``queue``, or None (no name means ``default``)."""
        if queue is None or queue in self.quotas:
            return None
        return f"queue: unknown queue {queue!r}; known: {', '.join(sorted(self.quotas))}"

    def start(self, run: QuotaRun) -> None:
        self.runs[run.job_id] = run
        self.usage[run.queue] = self.usage.get(run.queue, 0) + run.gpus

    def end(self, job_id: str) -> None:
        run = self.runs.pop(job_id, None)
        if run is not None:
            self.usage[run.queue] -= run.gpus
        self.leaving.pop(job_id, None)

    def signalled(self, job_id: str) -> None:
        """The run got the checkpoint signal for another reason than a reclaim: it is leaving."""
        if job_id in self.runs:
            self.leaving.setdefault(job_id, None)

    def within_nominal(self, queue: str, gpus: int, extra: int = 0) -> bool:
        """Whether ``gpus`` more (after ``extra`` more already counted) stay within the nominal quota."""
        return self.usage.get(queue, 0) + extra + gpus <= self.quota(queue).nominal_gpus

    def refusal(self, queue: str, gpus: int, extra: int = 0) -> str | None:
        """Why a job of ``gpus`` may not start in ``queue`` now (``extra``: GPUs this cycle already
        gave the queue), or None."""
        q = self.quota(queue)
        used = self.usage.get(queue, 0) + extra
        if used + gpus <= q.ceiling:
            return None
        return f"queue {queue} over quota: {used}/{q.nominal_gpus} GPUs, borrowing limit reached"

    def reclaim_words(self, queue: str) -> str | None:
        """What is being taken back for ``queue``, in words, or None."""
        leaving = [job_id for job_id, reclaimer in self.leaving.items() if reclaimer == queue]
        if not leaving:
            return None
        owners = sorted({self.runs[j].queue for j in leaving})
        return (f"queue {queue} within its quota ({self.usage.get(queue, 0)}/{self.quota(queue).nominal_gpus} GPUs): "
                f"reclaiming GPUs borrowed by {', '.join(owners)}: checkpoint signal sent to {', '.join(leaving)}")

    def reclaim(self, queue: str, need: int) -> list[QuotaRun]:
        """The runs to signal so that ``queue`` gets ``need`` GPUs back, beyond those already
        leaving for it: of other queues, only from what they hold beyond their nominal quota (a
        queue is never taken below it), runs that can checkpoint, lowest priority first, then the
        newest run (the least work since it started). Empty when the borrowed GPUs are not enough:
        nothing is preempted for a reclaim that cannot succeed. The runs returned count as leaving."""
        need -= sum(self.runs[j].gpus for j, q in self.leaving.items() if q == queue)
        if need <= 0:
            return []
        beyond = {name: used - self.quota(name).nominal_gpus for name, used in self.usage.items() if name != queue}
        for job_id in self.leaving:
            run = self.runs[job_id]
            if run.queue in beyond:
                beyond[run.queue] -= run.gpus
        chosen: list[QuotaRun] = []
        freed = 0
        # ``runs`` is in start order: reversed, a stable sort keeps the newest first among equals.
        for run in sorted(reversed(self.runs.values()), key=lambda r: (r.priority, -r.started_s)):
            if freed >= need:
                break
            if run.preemptible and run.job_id not in self.leaving and run.gpus <= beyond.get(run.queue, 0):
                chosen.append(run)
                beyond[run.queue] -= run.gpus
                freed += run.gpus
        if freed < need:
            return []
        self.leaving.update((run.job_id, queue) for run in chosen)
        return chosen


def queue_rows(book: QuotaBook, waiting: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each queue's quota, use and waiting jobs, for ``hier-sched queues``: the configured
    queues in their order, then the others that run or wait jobs (``default``)."""
    names = list(book.quotas)
    names += sorted(({n for n, used in book.usage.items() if used} | set(waiting)) - set(names))
    rows = []
    for name in names:
        q = book.quota(name)
        used = book.usage.get(name, 0)
        rows.append({"name": name, "nominal_gpus": q.nominal_gpus, "borrowing_limit_gpus": q.borrowing_limit_gpus,
                     "used_gpus": used, "borrowed_gpus": max(0, used - q.nominal_gpus),
                     "waiting": waiting.get(name, 0)})
    return rows
