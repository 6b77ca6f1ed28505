"""The job lifecycle, once, for both shells: what happens to a job and its runs (``JobLifecycle``).

A launch takes effect at once: the job is running from the step that launched it, with a new
attempt number. A shell whose node refuses the launch (its fresh snapshot no longer fits) says so
with ``LaunchDeclined``, and the attempt is taken back. ``RunStarted`` confirms (or, after a
restart, re-adopts) a run; both it and ``RunEnded`` name their attempt, so an event about an
earlier run — late, or replayed from a log — changes nothing.

A run ends well, checkpointed (requeued at the back: the fairness of a time slot), lost (slot end
without a checkpoint, node lost: it resumes from its last checkpoint), or failed: OOM recovery
with stepwise margins, the retry rule for other failures (``recovery``). A gang is one job: it
ends when its last rank has ended; its first rank that fails (or is lost with its node) stops the
others, and that failure is the gang's. Nothing is requeued while a process of its run may still
live: a run the core stops on its own (a drain's deadline), a gang whose node declined its part,
wait for the ends the nodes report; only a lost node ends what ran there at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hier_sched.core.events import (
    CancelRequested, CheckpointRequested, Command, EstimateFailed, HeadWaiting, JobTicket, LaunchDeclined, NodeLost,
    RunEnded, RunEvicted, RunReclaimed, RunSettled, RunStarted, SignalCheckpoint, Stop,
)
from hier_sched.core.failures import Failure
from hier_sched.core.gang_runs import gang_rank_ended
from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobState
from hier_sched.core.job_queue import JobQueue
from hier_sched.core.launch_ledger import LaunchLedger
from hier_sched.core.learning import PeakLearner
from hier_sched.core.managed_job import RUN_STATES, ManagedJob, where
from hier_sched.core.queued_job import QueuedJob
from hier_sched.core.recovery import RecoveryPolicy, decide_after_failure
from hier_sched.core.runtimes import RuntimeHistory
from hier_sched.core.team_queue_part import OpenQueue
from hier_sched.core.time_slots import TimeSlots

__all__ = ["JobLifecycle", "GANG_DECLINED_KILL_AFTER_S"]

# A gang's ranks that started when another node declined its part: the run never really began
# (no rendezvous without every rank), so there is nothing to save; killed soon.
GANG_DECLINED_KILL_AFTER_S = 3.0


class JobLifecycle:
    """The jobs' transitions: into the queue and out, runs started and ended, requeued or ended."""

    def __init__(self, jobs: dict[str, ManagedJob], queue: JobQueue, ledger: LaunchLedger, recovery: RecoveryPolicy,
                 peaks: PeakLearner, runtimes: RuntimeHistory, node_types: Mapping[str, str]):
        self.jobs = jobs
        self.queue = queue
        self.ledger = ledger
        self.recovery = recovery
        self.peaks = peaks
        self.runtimes = runtimes
        self.node_types = node_types
        self.teams: OpenQueue = OpenQueue()  # set by the scheduler (``Scheduler.teams``)
        self.slots = TimeSlots(self.run_of, self.signal_checkpoint, queue)
        self.ended = 0  # jobs in a terminal state
        # The jobs with a run (RUNNING or CHECKPOINTING), in the order their runs started: what a
        # lost or drained node, the demand and the bookings walk, rather than every job ever known.
        self.with_runs: dict[str, ManagedJob] = {}

    # ------------------------------------------------------------------ the queue
    def enqueue(self, q: QueuedJob) -> None:
        self.dequeue(q.job_id)
        self.queue.add(q)
        self.teams.enqueued(q)

    def dequeue(self, job_id: str) -> None:
        q = self.queue.remove(job_id)
        if q is not None:
            self.teams.dequeued(q)

    def requeue(self, job: ManagedJob) -> None:
        q = job.queued
        q.waiting_since_s = None
        q.held = ()
        self.enqueue(q)

    # ------------------------------------------------------------------ runs
    def run_of(self, job_id: str, attempt: int | None) -> ManagedJob | None:
        """The job if it is running attempt ``attempt`` (any attempt when None), else None."""
        job = self.jobs.get(job_id)
        if job is None or job.record.state not in RUN_STATES:
            return None
        return job if attempt is None or job.record.attempts == attempt else None

    def type_of_run(self, job: ManagedJob) -> str:
        """The GPU type the job's last run ran on (a gang's ranks all run on one type)."""
        return self.node_types.get(job.placements[0].node, "") if job.placements else ""

    def start(self, job: ManagedJob, placements: tuple[Placement, ...], now_s: float, reason: str) -> None:
        self.dequeue(job.ticket.job_id)
        rec, t = job.record, job.ticket
        if job.runs_to_end:
            reason += f"; runs to its end, not preempted: stopped {job.unsaved_preemptions}x in a row before it checkpointed"
        rec.transition(JobState.RUNNING, now_s, reason)
        rec.node = placements[0].node
        rec.nodes = tuple(p.node for p in placements)
        rec.gpu_indices = placements[0].gpus
        job.placements = placements
        job.ranks_running = set(rec.nodes) if len(placements) > 1 else set()
        job.ranks_requeue = False
        job.gang_failed = None
        job.nodes_ran.extend(n for n in rec.nodes if n not in job.nodes_ran)
        job.run_started_s = now_s
        self.with_runs[job.ticket.job_id] = job
        self.ledger.launched(job)
        self.runtimes.run_started(t.job_id, (t.signature, self.type_of_run(job)), now_s, job.executed_s)
        if t.slot_s is not None and not job.runs_to_end:
            self.slots.started(job, now_s)
        self.teams.run_started(job, now_s)

    def end_run(self, job: ManagedJob, now_s: float) -> None:
        self.with_runs.pop(job.ticket.job_id, None)
        self.ledger.run_ended(job.ticket.job_id)
        job.reclaimed_for = job.drained_from = job.evicted_for = job.declined_for = None
        self.teams.run_ended(job.ticket.job_id, now_s)
        if job.run_started_s is not None:
            job.executed_s += now_s - job.run_started_s
            job.run_started_s = None
        self.runtimes.run_ended(job.ticket.job_id)

    def end(self, job: ManagedJob, state: JobState, now_s: float, reason: str) -> None:
        job.record.transition(state, now_s, reason)
        self.ended += 1

    def signal_checkpoint(self, job: ManagedJob, now_s: float, why: str, out: list[Command]) -> None:
        job.record.transition(JobState.CHECKPOINTING, now_s, f"checkpoint signal sent: {why}")
        out.append(SignalCheckpoint(job.ticket.job_id, job.record.attempts, why, job.nodes))
        self.teams.run_signalled(job.ticket.job_id)

    def preempt(self, job: ManagedJob, now_s: float, why: str, out: list[Command]) -> None:
        """Preempt the run to make room (a queue's reclaim, a drained node): the checkpoint signal
        now, a stop when its grace ends unless it has exited by then."""
        job.preemptions += 1
        self.signal_checkpoint(job, now_s, why, out)
        self.slots.stop_after_grace(job, now_s)

    def reclaim(self, job: ManagedJob, for_queue: str, now_s: float, why: str, out: list[Command]) -> None:
        """Preempt the run to give its GPUs back to team queue ``for_queue`` (``RunReclaimed``)."""
        job.reclaimed_for = for_queue
        self.preempt(job, now_s, why, out)

    # ------------------------------------------------------------------ events
    def on_estimate_failed(self, e: EstimateFailed, now_s: float, out: list[Command]) -> None:
        job = self.jobs.get(e.job_id)
        if job is not None and job.record.state is JobState.ESTIMATING:
            self.end(job, JobState.FAILED, now_s, f"rejected: {e.reason}")

    def on_checkpoint_requested(self, e: CheckpointRequested, now_s: float, out: list[Command]) -> None:
        job = self.run_of(e.job_id, None)
        if job is not None and job.record.state is JobState.RUNNING:
            self.signal_checkpoint(job, now_s, e.reason, out)

    def on_run_started(self, e: RunStarted, now_s: float, out: list[Command]) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.record.done:
            return
        if job.record.state is JobState.QUEUED and e.attempt == job.record.attempts + 1:
            started_s = now_s if e.started_s is None else e.started_s
            self.start(job, e.placements, started_s, "running on " + where(e.placements))
        # running this very attempt already (the launch took effect when it was commanded): nothing to do

    def on_run_settled(self, e: RunSettled, now_s: float, out: list[Command]) -> None:
        """The run's reservation shrinks to what it settled at (never grows: the node decided)."""
        job = self.run_of(e.job_id, e.attempt)
        if job is not None:
            job.placements = tuple(replace(p, reserved_mib=min(p.reserved_mib, e.reserved_mib))
                                   if e.node is None or p.node == e.node else p for p in job.placements)
            self.teams.run_resized(job, now_s)

    def on_launch_declined(self, e: LaunchDeclined, now_s: float, out: list[Command]) -> None:
        """The run never started: the attempt is taken back and the job waits again. The ranks of a
        gang that did start on other nodes are stopped (a gang runs whole or not at all), and the
        job waits for their ends first: placed again with the same attempt number while an old
        rank still exits, its node would take that rank for the new run's."""
        if e.started:
            out.append(Stop(e.job_id, e.attempt, f"gang: {e.reason}", kill_after_s=GANG_DECLINED_KILL_AFTER_S,
                            nodes=e.started))
        job = self.run_of(e.job_id, e.attempt)
        if job is None:
            return
        declined = f"{where(job.placements)} declined: {e.reason}"
        if e.started and len(job.placements) > 1:
            job.ranks_running = set(e.started)  # (the others hold no GPU from now on: ``live_ranks``)
            job.declined_for = declined
            return
        self._take_back(job, now_s, declined)

    def _take_back(self, job: ManagedJob, now_s: float, declined: str) -> None:
        """(Nothing of the run runs.) The attempt never happened: the job waits again."""
        self.end_run(job, now_s)
        job.record.attempts -= 1
        job.record.transition(JobState.QUEUED, now_s, f"waiting: {declined}")
        self.requeue(job)

    def on_cancel(self, e: CancelRequested, now_s: float, out: list[Command]) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or job.record.done:
            return
        if job.record.state is JobState.QUEUED:
            self.dequeue(e.job_id)
            self.end(job, JobState.CANCELLED, now_s, e.reason + " while queued")
            return
        if job.record.state is JobState.ESTIMATING:
            self.end(job, JobState.CANCELLED, now_s, e.reason + " while its estimate was made")
            return
        job.cancel_requested = True
        out.append(Stop(e.job_id, job.record.attempts, e.reason, nodes=job.nodes))

    def node_lost(self, e: NodeLost, now_s: float, out: list[Command]) -> None:
        """Jobs with a run there lose it: each is requeued (it resumes from its checkpoint, if it
        took one). A gang's rank there is lost as a rank that failed: its ranks on other nodes
        are stopped, and it is requeued once they have exited."""
        for job in list(self.with_runs.values()):
            if e.node not in job.nodes:
                continue
            why = f"{e.reason} ({e.node})"
            if len(job.placements) > 1:
                lost = RunEnded(job.ticket.job_id, job.record.attempts, Failure("lost", why), None, node=e.node)
                self.on_run_ended(lost, now_s, out)
            else:
                self.evict(job, now_s, why)

    def on_run_evicted(self, e: RunEvicted, now_s: float, out: list[Command]) -> None:
        """A drain's deadline stopped the run (its stop is the drain's): the job is requeued when
        the run's end is reported (``on_run_ended``), or at once if its node is lost meanwhile."""
        job = self.run_of(e.job_id, e.attempt)
        if job is not None:
            job.evicted_for = e.reason

    def on_run_reclaimed(self, e: RunReclaimed, now_s: float, out: list[Command]) -> None:
        """(A rebuild from the log: live, planning did this.) The run was signalled to give its
        GPUs back to a team queue."""
        job = self.run_of(e.job_id, e.attempt)
        if job is not None and job.record.state is JobState.RUNNING:
            self.reclaim(job, e.for_queue, now_s, e.reason, out)

    def on_head_waiting(self, e: HeadWaiting, now_s: float, out: list[Command]) -> None:
        """(A rebuild from the log: live, planning set these already.) The head's wait and the
        GPUs held for it, as the plan that blocked it left them."""
        if e.job_id in self.queue:
            q = self.queue[e.job_id]
            q.waiting_since_s, q.held = e.since_s, e.held

    def evict(self, job: ManagedJob, now_s: float, why: str) -> None:
        """The run is over here and now, whatever its processes still do (its node was lost: the
        stops of a gang's other ranks are the caller's): the job is requeued and resumes from its
        last checkpoint, if any; one whose cancel was asked for ends cancelled."""
        self.end_run(job, now_s)
        if job.cancel_requested:
            self.end(job, JobState.CANCELLED, now_s, f"cancelled ({why})")
            return
        self._requeue_lost(job, now_s, why)

    def _requeue_lost(self, job: ManagedJob, now_s: float, why: str) -> None:
        """(Its run ended.) The run's work since its last checkpoint is lost; the job waits again."""
        job.lost_runs += 1
        job.record.transition(JobState.QUEUED, now_s, f"requeued: {why}; resumes from its last checkpoint, if any")
        self.requeue(job)

    def on_run_ended(self, e: RunEnded, now_s: float, out: list[Command]) -> None:
        job = self.run_of(e.job_id, e.attempt)
        if job is None:
            return
        if job.declined_for is not None:  # a rank of a gang that never started whole
            job.ranks_running.discard(e.node)  # (``None``: the whole run, as a node lost reports it)
            if e.node is None or not job.ranks_running:
                self._take_back(job, now_s, job.declined_for)
            return
        if e.node is not None and len(job.placements) > 1:
            whole = gang_rank_ended(job, e, out)
            if whole is None:
                return
            e = whole
        elif job.gang_failed is not None:  # the whole gang's end (the simulator's) after a rank failed
            e = replace(job.gang_failed, node=None)
        rec, q, t = job.record, job.queued, job.ticket
        signalled = rec.state is JobState.CHECKPOINTING
        evicted_for = job.evicted_for
        self.end_run(job, now_s)
        rec.exit_code = e.exit_code
        if e.peak_mib:
            rec.observe_peak(e.peak_mib)
        failure = e.failure
        if job.cancel_requested:
            self.end(job, JobState.CANCELLED, now_s, "cancelled by the user")
            return
        if failure is None:
            self.end(job, JobState.SUCCEEDED, now_s, f"exit code {e.exit_code}")
            ran_on = self.type_of_run(job)
            self.runtimes.job_succeeded((t.signature, ran_on), job.executed_s, rec.oom_crashes)
            if t.learn_peak and rec.observed_peak_mib:
                self.peaks.observe(t.signature, ran_on, rec.observed_peak_mib)
            return
        if failure.kind == "checkpoint_requeue":
            rec.checkpoints += 1
            job.unsaved_preemptions = 0
            q.submit_s = now_s  # back of the queue: the fairness of a time slot
            rec.transition(JobState.QUEUED, now_s, "checkpointed; requeued behind the jobs that waited")
            self.requeue(job)
            return
        if evicted_for is not None:  # stopped at its drain's deadline: however it ended, it runs again
            self._requeue_lost(job, now_s, evicted_for)
            return
        if signalled and failure.kind == "killed":  # stopped at its grace's end without a checkpoint
            job.lost_runs += 1
            job.unsaved_preemptions += 1
            q.submit_s = now_s
            rec.transition(JobState.QUEUED, now_s, "slot ended before it checkpointed: this run's work is lost; "
                                                   + ("it resumes from its last checkpoint" if rec.checkpoints else
                                                      "it restarts from scratch")
                                                   + ("; its next run goes to its end, not preempted"
                                                      if job.runs_to_end else ""))
            self.requeue(job)
            return
        if failure.kind == "lost":  # as when the queue finds the node lost (``node_lost``), seen from the node
            self._requeue_lost(job, now_s, failure.reason)
            return
        if failure.kind == "oom":
            rec.oom_crashes += 1
            q.oom_count += 1
            if e.peak_mib:
                q.observed_peak_mib = max(q.observed_peak_mib or 0.0, e.peak_mib)
        else:
            job.other_failures += 1
        decision = decide_after_failure(failure, attempts=rec.attempts, oom_count=q.oom_count,
                                        other_failures=job.other_failures, policy=self._recovery(t, e))
        if decision.requeue:
            rec.transition(JobState.QUEUED, now_s, decision.reason)
            self.requeue(job)
        else:
            self.end(job, JobState.FAILED, now_s, decision.reason)

    def _recovery(self, t: JobTicket, e: RunEnded) -> RecoveryPolicy:
        base = self.recovery
        retries = base.max_retries_other if t.max_retries is None else t.max_retries
        if t.retry_exit_codes is not None and e.exit_code not in t.retry_exit_codes:
            retries = 0
        if e.failure is not None and e.failure.kind == "start_error":
            retries = 0  # a missing command does not appear by retrying
        return replace(base, max_attempts=t.max_attempts or base.max_attempts, max_retries_other=retries)
