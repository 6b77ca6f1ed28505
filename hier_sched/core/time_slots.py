"""Fixed time slots: a run with a slot gets the checkpoint signal ``slot_grace_s`` before its slot
ends, and is stopped when its grace ends (``TimeSlots``). The same end of grace stops a run that
was signalled to make room for a team queue (``team_queue_part``) or to leave a drained node
(``drains``).

Deadlines are kept in a heap of (time, kind, sequence, job, attempt); a deadline whose run has
ended by then (another attempt runs, or none), or a signal deadline another one overtook (a
rebuild from the log replays a slot's extension), is dropped when it comes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection

from hier_sched.core.events import Command, SlotEnded, Stop
from hier_sched.core.job import JobState
from hier_sched.core.managed_job import ManagedJob

__all__ = ["TimeSlots"]

_SIGNAL, _GRACE_END = 0, 1  # the deadline's kind: the checkpoint signal (end - grace), the end of the grace

RunOf = Callable[[str, int], "ManagedJob | None"]  # (job, attempt) -> the job if it runs that attempt
Signal = Callable[[ManagedJob, float, str, list[Command]], None]  # the checkpoint signal (``JobLifecycle``)


class TimeSlots:
    def __init__(self, run_of: RunOf, signal: Signal, queue: Collection[str]):
        self._run_of = run_of
        self._signal = signal
        self._queue = queue  # the queued jobs: a slot is extended while none waits
        self._deadlines: list[tuple[float, int, int, str, int]] = []  # (t, kind, seq, job, attempt)
        self._seq = 0
        # job -> when its run's checkpoint signal is due: a signal deadline at another time was
        # overtaken (a rebuild from the log pushes a run's slot again, then its extensions)
        self._signal_due: dict[str, float] = {}

    @property
    def next_at(self) -> float | None:
        """When the next deadline falls (None: none is due)."""
        return self._deadlines[0][0] if self._deadlines else None

    def started(self, job: ManagedJob, start_s: float) -> None:
        """A run with a slot started: its checkpoint signal falls ``slot_grace_s`` before its end."""
        t = job.ticket
        assert t.slot_s is not None
        self._push_signal(start_s + t.slot_s - t.slot_grace_s, t.job_id, job.record.attempts)

    def stop_after_grace(self, job: ManagedJob, signalled_s: float) -> None:
        """The run was signalled at ``signalled_s``: it is stopped when its grace ends, unless it ended."""
        self._push(signalled_s + job.ticket.slot_grace_s, _GRACE_END, job.ticket.job_id, job.record.attempts)

    def act(self, now_s: float, out: list[Command]) -> list[SlotEnded]:
        """Act on every deadline due by ``now_s``; the slots that ended (for a shell's log)."""
        ended: list[SlotEnded] = []
        while self._deadlines and self._deadlines[0][0] <= now_s:
            due, kind, _, job_id, attempt = heapq.heappop(self._deadlines)
            if kind == _SIGNAL:
                if self._signal_due.get(job_id) != due:
                    continue
                del self._signal_due[job_id]
            job = self._run_of(job_id, attempt)
            if job is None:
                continue
            t = job.ticket
            if kind == _GRACE_END:
                if job.record.state is JobState.CHECKPOINTING:
                    why = (f"checkpoint grace ended: its GPUs are reclaimed for queue {job.reclaimed_for}"
                           if job.reclaimed_for is not None else
                           f"checkpoint grace ended: node {job.drained_from} drains" if job.drained_from is not None
                           else "time slot ended")
                    out.append(Stop(job_id, attempt, why, t.kill_after_s, job.nodes))
                continue
            if job.record.state is not JobState.RUNNING:
                continue
            extended = t.slot_extends and not self._queue  # nobody waits for these GPUs: another slot
            self._end_slot(job, due, extended, now_s, out)
            ended.append(SlotEnded(job_id, attempt, due, extended))
        return ended

    def on_slot_ended(self, e: SlotEnded, now_s: float, out: list[Command]) -> None:
        """(A rebuild from the log: live, ``act`` did this.) The run's slot ended: it was signalled,
        or given another slot; the deadline its start pushed again is overtaken."""
        job = self._run_of(e.job_id, e.attempt)
        if job is not None and job.record.state is JobState.RUNNING:
            self._end_slot(job, e.due_s, e.extended, now_s, out)

    def _end_slot(self, job: ManagedJob, due_s: float, extended: bool, now_s: float, out: list[Command]) -> None:
        t = job.ticket
        if extended:
            job.record.reason = "slot extended: no job waits for its GPUs"
            self._push_signal(due_s + t.slot_s, t.job_id, job.record.attempts)  # type: ignore[operator]
            return
        job.preemptions += 1
        self._signal(job, now_s, "its time slot ends", out)
        self._push(due_s + t.slot_grace_s, _GRACE_END, t.job_id, job.record.attempts)

    def _push_signal(self, at_s: float, job_id: str, attempt: int) -> None:
        self._signal_due[job_id] = at_s
        self._push(at_s, _SIGNAL, job_id, attempt)

    def _push(self, at_s: float, kind: int, job_id: str, attempt: int) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (at_s, kind, self._seq, job_id, attempt))
