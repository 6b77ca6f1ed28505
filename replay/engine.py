"""The discrete-event simulator: the live scheduler's decisions, on a virtual clock.

A shell around the core's ``Scheduler``, as the live GlobalQueue is: each instant it *gathers*
what happened on the emulated GPUs (arrivals, runs that finished, crashed with OOM or exited
after a checkpoint) as events, calls ``Scheduler.step`` — the very lifecycle the live queue
runs — and *applies* the commands (launch on these GPUs, send the checkpoint signal, stop).

What happens to a job on its GPUs is the device model's business: a job attaches (CUDA context
and activity) at launch, allocates its peak when its warm-up ends, and fails with OOM there if
the GPU cannot give it that memory. Speed under collocation is ``training_rate``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hier_sched.core.events import (
    Event, JobTicket, Launch, NodeJoined, Reject, RunEnded, SignalCheckpoint, Stop, Submitted,
)
from hier_sched.core.failures import REQUEUE_EXIT_CODE, Failure
from hier_sched.core.gpu import Placement, SharingMode
from hier_sched.core.gpu_model import GpuOutOfMemory, JobActivity, training_rate, warmup_s
from hier_sched.core.gpu_types import gpu_type
from hier_sched.core.job import JobState
from hier_sched.core.learning import job_signature
from hier_sched.core.lifecycle import ManagedJob, Scheduler
from hier_sched.core.presets import SchedulerConfig
from replay.cluster import ClusterShape, SimCluster, SimGpu
from replay.estimates import TraceEstimator
from traces.schema import Trace, TraceJob

__all__ = ["SlotSettings", "SimJob", "Simulator"]

# Device-side event kinds, in the order they are handled within one instant.
FINISH, ALLOC, CKPT_EXIT, ARRIVAL, SLOT, WAKE = range(6)

_STATE_NAMES = {JobState.SUCCEEDED: "done", JobState.FAILED: "failed", JobState.QUEUED: "queued",
                JobState.RUNNING: "running", JobState.CHECKPOINTING: "checkpointing", JobState.CANCELLED: "cancelled"}


@dataclass(frozen=True, slots=True)
class SlotSettings:
    """Fixed time slots with the checkpoint-signal protocol (thesis Ch. 7.3)."""

    length_s: float
    grace_s: float = 600.0
    checkpoint_s: float = 60.0  # time a job needs to write its checkpoint after the signal


@dataclass(slots=True)
class SimJob:
    """A trace job's life on the emulated devices; its lifecycle lives in the core (``managed``)."""

    trace: TraceJob
    managed: ManagedJob | None = None  # set once submitted
    rejected: bool = False  # admission refused it
    remaining_s: float = 0.0  # solo-seconds of work left
    rate: float = 1.0
    progress_at_s: float = 0.0
    run_id: int = 0  # changes at every launch and stop: ALLOC/CKPT_EXIT events of older runs are void
    finish_version: int = 0  # changes with every new speed: older FINISH events are void
    attempt: int = 0  # the core's attempt number of the run on the devices
    gpus: list[SimGpu] = field(default_factory=list)
    placements: tuple[Placement, ...] = ()
    peak_mib: float = 0.0  # of the current run, once allocated

    @property
    def state(self) -> str:
        if self.rejected:
            return "unschedulable"
        return "pending" if self.managed is None else _STATE_NAMES[self.managed.record.state]

    @property
    def attempts(self) -> int:
        return self.managed.record.attempts if self.managed else 0

    @property
    def oom_crashes(self) -> int:
        return self.managed.record.oom_crashes if self.managed else 0

    @property
    def checkpoints(self) -> int:
        return self.managed.record.checkpoints if self.managed else 0

    @property
    def first_start_s(self) -> float | None:
        return self.managed.record.start_time if self.managed else None

    @property
    def end_s(self) -> float | None:
        return None if self.managed is None or self.rejected else self.managed.record.end_time

    @property
    def exec_s(self) -> float:
        return self.managed.executed_s if self.managed else 0.0

    @property
    def reason(self) -> str:
        return self.managed.record.reason if self.managed else ""


class Simulator:
    def __init__(
        self,
        trace: Trace,
        shape: ClusterShape,
        config: SchedulerConfig,
        estimator: TraceEstimator,
        *,
        slots: SlotSettings | None = None,
        window: int = 30,
        record_series: bool | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.trace = trace
        self.config = config
        self.cluster = SimCluster(shape, window=window, record_series=record_series)
        self.scheduler = Scheduler(config, mig=shape.sharing is SharingMode.MIG)
        self.scheduler.apply([NodeJoined(n, tuple(g.device.memory_total_mib for g in gpus))
                              for n, gpus in self.cluster.gpus.items()], 0.0)
        self.slots = slots
        self.window = window
        self.progress = progress
        self.jobs: dict[str, SimJob] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.now = 0.0
        self.events = 0
        self.last_util_change_s = -math.inf
        self._wake_at = math.inf
        self._slot_wake_at = math.inf
        self._stopped = False
        self.estimator = estimator
        self._reference_speed = gpu_type(trace.duration_gpu).relative_speed if trace.duration_gpu else None
        for tj in trace.jobs:
            self.add_job(tj)
        first_submit = min((tj.submit_s for tj in trace.jobs), default=0.0)
        for g in self.cluster.all_gpus():  # energy and windows start with the trace
            g.last_power_s = g.last_flush_s = first_submit

    @property
    def queue(self):
        return self.scheduler.queue

    @property
    def cycles(self) -> int:
        return self.scheduler.cycles

    @property
    def finished(self) -> int:
        return self.scheduler.ended

    def add_job(self, tj: TraceJob) -> None:
        """One more job, arriving at its ``submit_s`` (or now, if that has passed)."""
        if tj.job_id in self.jobs:
            raise ValueError(f"job {tj.job_id!r} is already in the simulation")
        self.jobs[tj.job_id] = SimJob(tj, remaining_s=tj.duration_s)
        self._push(max(tj.submit_s, self.now), ARRIVAL, tj.job_id)

    def stop(self) -> None:
        """End ``run`` after the current instant, with jobs still queued or running."""
        self._stopped = True

    # -- event plumbing ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, job_id, version))

    def run(self) -> float:
        """Run to completion; returns wall seconds spent."""
        t0 = time.perf_counter()
        heap = self.heap
        total = len(self.jobs)
        while heap and not self._stopped:
            t = heap[0][0]
            self.now = t
            self.cluster.now_s = t
            dirty = slot_due = False
            events: list[Event] = []
            while heap and heap[0][0] == t:
                _, kind, _, job_id, version = heapq.heappop(heap)
                self.events += 1
                if kind == SLOT:  # a slot deadline is due: the core decides (no placement for this alone)
                    self._slot_wake_at = math.inf
                    slot_due = True
                else:
                    dirty |= self._handle(kind, job_id, version, events)
            if events or dirty or slot_due:
                self._step(events, plan=dirty)
            if self.progress is not None and self.events % 4096 == 0:
                self.progress(self.finished, total)
        if self.progress is not None:
            self.progress(self.finished, total)
        end = self.makespan_end
        for g in self.cluster.all_gpus():
            g.before_change(end)
        return time.perf_counter() - t0

    @property
    def makespan_end(self) -> float:
        ends = [j.end_s for j in self.jobs.values() if j.end_s is not None]
        return max(ends, default=self.now)

    def _handle(self, kind: int, job_id: str, version: int, events: list[Event]) -> bool:
        """Turn one device-side happening into scheduler events; True when placement should run."""
        if kind == WAKE:
            self._wake_at = math.inf
            return True
        job = self.jobs[job_id]
        if kind == ARRIVAL:
            events.append(Submitted(self._ticket(job.trace)))
            return True
        if version != (job.finish_version if kind == FINISH else job.run_id):
            return False  # superseded: a newer speed, or a run that already ended
        if kind == FINISH:
            self._stop_running(job, lose_progress=False)
            job.remaining_s = 0.0
            events.append(RunEnded(job_id, job.attempt, None, 0, job.peak_mib or None))
        elif kind == ALLOC:
            failure = self._allocate(job)
            if failure is not None:
                events.append(failure)
        elif kind == CKPT_EXIT:
            self._stop_running(job, lose_progress=False)
            events.append(RunEnded(job_id, job.attempt, Failure("checkpoint_requeue", "checkpointed"),
                                   REQUEUE_EXIT_CODE))
        return True

    def _ticket(self, tj: TraceJob) -> JobTicket:
        """What is known at submission: the trace job's shape and the chosen estimator's value."""
        need, smact = self.estimator.estimate(tj)
        slot = self.slots
        return JobTicket(tj.job_id, tj.workload, gpus=tj.gpus, gpus_per_node=tj.gpus_per_node, need_mib=need,
                         smact=smact, priority=tj.priority, signature=job_signature(tj.workload, tj.batch_size, tj.gpus),
                         learn_peak=self.estimator.learns(tj),
                         slot_s=slot.length_s if slot else None, slot_grace_s=slot.grace_s if slot else 600.0)

    # -- the core's step and its commands ---------------------------------------------------
    def _step(self, events: list[Event], *, plan: bool) -> None:
        result = self.scheduler.step(events, self.cluster.index if plan else None, self.now)
        for e in events:
            if type(e) is Submitted:
                self.jobs[e.ticket.job_id].managed = self.scheduler.jobs[e.ticket.job_id]
        self._carry_out(result.commands)
        if result.wake_at_s is not None and result.wake_at_s < self._slot_wake_at:
            self._slot_wake_at = result.wake_at_s
            self._push(result.wake_at_s, SLOT)
        if plan and self.scheduler.queue:
            self._schedule_wake()

    def _carry_out(self, commands) -> None:
        for cmd in commands:
            kind = type(cmd)
            if kind is Launch:
                failure = self._launch(self.jobs[cmd.job_id], cmd)
                if failure is not None:  # not even the CUDA context fit: the run ends at once
                    self._carry_out(self.scheduler.apply([failure], self.now))
            elif kind is SignalCheckpoint:
                job = self.jobs[cmd.job_id]
                assert self.slots is not None
                self._push(self.now + min(self.slots.checkpoint_s, self.slots.grace_s), CKPT_EXIT, cmd.job_id, job.run_id)
            elif kind is Stop:  # the slot's end passed before the checkpoint was written: killed
                job = self.jobs[cmd.job_id]
                self._stop_running(job, lose_progress=True)
                self._carry_out(self.scheduler.apply([RunEnded(cmd.job_id, cmd.attempt, Failure("killed", cmd.reason),
                                                               143)], self.now))
            elif kind is Reject:
                self.jobs[cmd.job_id].rejected = True

    def _schedule_wake(self) -> None:
        """Monitoring windows keep moving for ``window`` s after a utilization change; look
        again once they have settled, as the live once-a-second loop would have."""
        settle = self.last_util_change_s + self.window
        if self.now < settle < self._wake_at:
            self._wake_at = settle
            self._push(settle, WAKE)

    # -- the devices ------------------------------------------------------------------------
    def _launch(self, job: SimJob, cmd: Launch) -> RunEnded | None:
        tj = job.trace
        job.attempt = cmd.attempt
        job.placements = cmd.placements
        job.run_id += 1
        job.gpus = []
        job.peak_mib = 0.0
        job.progress_at_s = self.now
        activity = JobActivity(tj.smact, tj.smocc, tj.drama)
        try:
            for p in cmd.placements:
                for idx in p.gpus:
                    g = self.cluster.gpus[p.node][idx]
                    was_idle = not g.device.residents
                    g.before_change(self.now)
                    g.last_launch_s = self.now
                    g.device.attach(tj.job_id, activity)  # its CUDA context
                    g.pending[tj.job_id] = p.reserved_mib
                    g.multi_gpu_jobs += tj.gpus > 1
                    g.after_change(self.now)
                    self.cluster.refresh_index(g, -1 if was_idle else 0)
                    job.gpus.append(g)
        except GpuOutOfMemory as oom:
            g.after_change(self.now)
            return self._oom(job, oom)
        self.last_util_change_s = self.now
        self._push(self.now + self.config.placement.launch_grace_s, WAKE)  # the GPUs are offered again
        self._push(self.now + warmup_s(tj.duration_s), ALLOC, tj.job_id, job.run_id)
        self._rerate(job.gpus)
        return None

    def _allocate(self, job: SimJob) -> RunEnded | None:
        tj = job.trace
        touched = list(job.gpus)
        for g in job.gpus:
            g.before_change(self.now)
            g.pending.pop(tj.job_id, None)
        try:
            for g in job.gpus:
                g.device.allocate_peak(tj.job_id, tj.peak_mib)
        except GpuOutOfMemory as oom:
            for g in touched:
                g.after_change(self.now)
            return self._oom(job, oom)
        for g in touched:
            g.after_change(self.now)
            self.cluster.refresh_index(g)
        job.peak_mib = max(g.device.job_memory_mib(tj.job_id) for g in touched)
        self.last_util_change_s = self.now
        return None

    def _oom(self, job: SimJob, oom: GpuOutOfMemory) -> RunEnded:
        self._stop_running(job, lose_progress=True)
        failure = Failure("oom", f"CUDA out of memory: tried {oom.requested_mib:.0f} MiB, {oom.free_mib:.0f} MiB free")
        return RunEnded(job.trace.job_id, job.attempt, failure, 1, oom.wanted_mib)

    def _stop_running(self, job: SimJob, *, lose_progress: bool) -> None:
        """Detach the job from its GPUs and account its progress."""
        self._account_progress(job)
        job.run_id += 1
        job.finish_version += 1
        released = []
        for g in job.gpus:
            g.before_change(self.now)
            g.pending.pop(job.trace.job_id, None)
            g.device.detach(job.trace.job_id)
            g.multi_gpu_jobs -= job.trace.gpus > 1
            g.after_change(self.now)
            self.cluster.refresh_index(g, 1 if not g.device.residents else 0)
            released.append(g)
        job.gpus = []
        if lose_progress:
            job.remaining_s = job.trace.duration_s
        self.last_util_change_s = self.now
        self._rerate(released)

    # -- speed ------------------------------------------------------------------------------
    def _account_progress(self, job: SimJob) -> None:
        job.remaining_s -= (self.now - job.progress_at_s) * job.rate
        job.progress_at_s = self.now

    def _rerate(self, gpus: list[SimGpu]) -> None:
        """Collocation changed on these GPUs: new speeds and finish times for their residents."""
        seen: set[str] = set()
        for g in gpus:
            for job_id in g.device.residents:
                if job_id in seen:
                    continue
                seen.add(job_id)
                job = self.jobs[job_id]
                self._account_progress(job)
                job.rate = training_rate([x.device for x in job.gpus], job_id, self._reference_speed)
                job.finish_version += 1
                self._push(self.now + max(job.remaining_s, 0.0) / job.rate, FINISH, job_id, job.finish_version)
