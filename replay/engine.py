"""The discrete-event simulator: the live scheduler's decisions, on a virtual clock.

Events (arrival, end of warm-up allocation, finish, end of post-launch grace, time-slot
signal, checkpoint exit) jump the clock. After all events of one instant the core's
``plan_cycle`` runs — the very function the live global queue calls — on snapshots built
from the emulated GPUs and their monitoring windows, and its placements are launched.

What happens to a job is the device model's business: a job attaches (CUDA context and
activity) at launch, allocates its peak when its warm-up ends, and fails with OOM there if
the GPU cannot give it that memory. Speed under collocation is ``EmulatedGpu.slowdown``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hier_sched.core.failures import Failure
from hier_sched.core.gpu import Placement, SharingMode
from hier_sched.core.gpu_model import GpuOutOfMemory, JobActivity
from hier_sched.core.gpu_types import gpu_type
from hier_sched.core.presets import SchedulerConfig
from hier_sched.core.queueing import QueuedJob, note_blocked_head, plan_cycle
from hier_sched.core.recovery import decide_after_failure
from hier_sched.core.runtimes import RuntimeHistory
from replay.cluster import ClusterShape, SimCluster, SimGpu
from replay.estimates import TraceEstimator, job_signature
from traces.schema import Trace, TraceJob

__all__ = ["SlotSettings", "SimJob", "Simulator"]

# Event kinds, in the order they are handled within one instant.
FINISH, ALLOC, CKPT_EXIT, ARRIVAL, SLOT, WAKE = range(6)


@dataclass(frozen=True, slots=True)
class SlotSettings:
    """Fixed time slots with the checkpoint-signal protocol (thesis Ch. 7.3)."""

    length_s: float
    grace_s: float = 600.0
    checkpoint_s: float = 60.0  # time a job needs to write its checkpoint after the signal


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    queued: QueuedJob
    state: str = "pending"  # pending, queued, running, checkpointing, done, failed, unschedulable
    remaining_s: float = 0.0  # solo-seconds of work left
    rate: float = 1.0
    progress_at_s: float = 0.0
    run_id: int = 0  # changes at every launch and stop: ALLOC/SLOT/CKPT_EXIT events of older runs are void
    finish_version: int = 0  # changes with every new speed: older FINISH events are void
    gpus: list[SimGpu] = field(default_factory=list)
    placements: tuple[Placement, ...] = ()
    first_start_s: float | None = None
    run_start_s: float = 0.0
    end_s: float | None = None
    exec_s: float = 0.0
    attempts: int = 0
    oom_crashes: int = 0
    checkpoints: int = 0
    reason: str = ""


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
        self.slots = slots
        self.window = window
        self.progress = progress
        self.jobs: dict[str, SimJob] = {}
        self.queue: dict[str, QueuedJob] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.now = 0.0
        self.rr_cursor = 0
        self.events = 0
        self.cycles = 0
        self.last_util_change_s = -math.inf
        self._wake_at = math.inf
        self.finished = 0
        self.estimator = estimator
        self.runtimes = RuntimeHistory()  # what the scheduler learns of run times, as the live queue does
        self._reference_speed = gpu_type(trace.duration_gpu).relative_speed if trace.duration_gpu else None
        for i, tj in enumerate(trace.jobs):
            q = QueuedJob(tj.job_id, tj.submit_s, gpus=tj.gpus, gpus_per_node=tj.gpus_per_node, priority=tj.priority, seq=i)
            self.jobs[tj.job_id] = SimJob(tj, q, remaining_s=tj.duration_s)
            self._push(tj.submit_s, ARRIVAL, tj.job_id)
        first_submit = min((tj.submit_s for tj in trace.jobs), default=0.0)
        for g in self.cluster.all_gpus():  # energy and windows start with the trace
            g.last_power_s = g.last_flush_s = first_submit

    # -- event plumbing ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, job_id, version))

    def run(self) -> float:
        """Run to completion; returns wall seconds spent."""
        t0 = time.perf_counter()
        heap = self.heap
        total = len(self.jobs)
        while heap:
            t = heap[0][0]
            self.now = t
            self.cluster.now_s = t
            dirty = False
            while heap and heap[0][0] == t:
                _, kind, _, job_id, version = heapq.heappop(heap)
                self.events += 1
                dirty |= self._handle(kind, job_id, version)
            if dirty and self.queue:
                self._cycle()
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

    def _handle(self, kind: int, job_id: str, version: int) -> bool:
        if kind == WAKE:
            self._wake_at = math.inf
            return True
        job = self.jobs[job_id]
        if kind == ARRIVAL:
            return self._arrive(job)
        if version != (job.finish_version if kind == FINISH else job.run_id):
            return False  # superseded: a newer speed, or a run that already ended
        if kind == FINISH:
            self._finish(job)
        elif kind == ALLOC:
            return self._allocate(job)
        elif kind == SLOT:
            return self._slot_signal(job)
        elif kind == CKPT_EXIT:
            self._checkpoint_exit(job)
        return True

    # -- job life ---------------------------------------------------------------------------
    def _arrive(self, job: SimJob) -> bool:
        tj = job.trace
        problem = self._unschedulable(tj)
        if problem:
            job.state, job.reason, job.end_s = "unschedulable", problem, None
            self.finished += 1
            return False
        job.state = "queued"
        job.queued.need_mib, job.queued.smact = self.estimator.estimate(tj)  # what is known at submission
        self.queue[tj.job_id] = job.queued
        return True

    def _unschedulable(self, tj: TraceJob) -> str:
        c = self.cluster
        per_node = tj.gpus_per_node or tj.gpus
        if per_node > c.largest_node:
            return f"needs {per_node} GPUs on one node; the largest node has {c.largest_node}"
        if tj.nodes > len(c.gpus):
            return f"needs {tj.nodes} nodes; the cluster has {len(c.gpus)}"
        if c.shape.sharing is SharingMode.MIG and tj.gpus > 1:
            return "multi-GPU training is not possible on MIG slices"
        if tj.peak_mib > c.largest_gpu_mib:
            return f"needs {tj.peak_mib:.0f} MiB per GPU; the largest GPU has {c.largest_gpu_mib:.0f}"
        return ""

    def _cycle(self) -> None:
        self.cycles += 1
        cfg = self.config
        plan = plan_cycle(list(self.queue.values()), self.cluster.index, cfg.placement, cfg.queue, self.now,
                          rr_cursor=self.rr_cursor, expected_end=self.runtimes.expected_end)
        self.rr_cursor = plan.rr_cursor
        for q, placements in plan.placements:
            self._launch(self.jobs[q.job_id], placements)
        if self.queue:
            note_blocked_head(self.queue.values(), plan, self.now)
            self._schedule_wake()

    def _schedule_wake(self) -> None:
        """Monitoring windows keep moving for ``window`` s after a utilization change; look
        again once they have settled, as the live once-a-second loop would have."""
        settle = self.last_util_change_s + self.window
        if self.now < settle < self._wake_at:
            self._wake_at = settle
            self._push(settle, WAKE)

    def _launch(self, job: SimJob, placements: tuple[Placement, ...]) -> None:
        del self.queue[job.trace.job_id]
        tj = job.trace
        job.state = "running"
        job.attempts += 1
        job.placements = placements
        job.run_id += 1
        job.gpus = []
        if job.first_start_s is None:
            job.first_start_s = self.now
        job.run_start_s = job.progress_at_s = self.now
        self.runtimes.run_started(tj.job_id, job_signature(tj), self.now, job.exec_s)
        activity = JobActivity(tj.smact, tj.smocc, tj.drama)
        try:
            for p in placements:
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
        except GpuOutOfMemory as oom:  # not even the CUDA context fits
            g.after_change(self.now)
            self._fail_oom(job, oom)
            return
        self.last_util_change_s = self.now
        self._push(self.now + self.config.placement.launch_grace_s, WAKE)  # the GPUs are offered again
        warmup = min(tj.duration_s * 0.5, _WARMUP_S)
        self._push(self.now + warmup, ALLOC, tj.job_id, job.run_id)
        self._rerate(job.gpus)
        if self.slots is not None:
            self._push(self.now + self.slots.length_s - self.slots.grace_s, SLOT, tj.job_id, job.run_id)

    def _allocate(self, job: SimJob) -> bool:
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
            self._fail_oom(job, oom)
            return True
        for g in touched:
            g.after_change(self.now)
            self.cluster.refresh_index(g)
        self.estimator.observe(tj, max(g.device.job_memory_mib(tj.job_id) for g in touched))
        self.last_util_change_s = self.now
        return True

    def _fail_oom(self, job: SimJob, oom: GpuOutOfMemory) -> None:
        tj = job.trace
        job.oom_crashes += 1
        q = job.queued
        q.oom_count += 1
        q.observed_peak_mib = max(q.observed_peak_mib or 0.0, oom.wanted_mib)
        self._stop_running(job, lose_progress=True)
        failure = Failure("oom", f"CUDA out of memory: tried {oom.requested_mib:.0f} MiB, {oom.free_mib:.0f} MiB free")
        decision = decide_after_failure(
            failure, attempts=job.attempts, oom_count=q.oom_count, other_failures=0, policy=self.config.recovery
        )
        if decision.requeue:
            job.state = "queued"
            job.reason = decision.reason
            self.queue[tj.job_id] = q
        else:
            job.state, job.reason, job.end_s = "failed", decision.reason, self.now
            self.finished += 1

    def _stop_running(self, job: SimJob, *, lose_progress: bool) -> None:
        """Detach the job from its GPUs and account its run time."""
        self._account_progress(job)
        job.exec_s += self.now - job.run_start_s
        self.runtimes.run_ended(job.trace.job_id)
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

    def _finish(self, job: SimJob) -> None:
        self._stop_running(job, lose_progress=False)
        self.runtimes.job_succeeded(job_signature(job.trace), job.exec_s, job.oom_crashes)
        job.state, job.end_s, job.remaining_s = "done", self.now, 0.0
        self.finished += 1

    def _slot_signal(self, job: SimJob) -> bool:
        """Slot almost over: checkpoint and yield if anyone waits, else run another slot."""
        assert self.slots is not None
        if not self.queue:
            self._push(self.now + self.slots.length_s, SLOT, job.trace.job_id, job.run_id)
            return False
        job.state = "checkpointing"
        self._push(self.now + min(self.slots.checkpoint_s, self.slots.grace_s), CKPT_EXIT, job.trace.job_id, job.run_id)
        return False

    def _checkpoint_exit(self, job: SimJob) -> None:
        self._stop_running(job, lose_progress=False)
        job.checkpoints += 1
        q = job.queued
        q.submit_s = self.now  # back of the queue: that is the fairness of a slot
        q.waiting_since_s = None
        q.held = ()
        job.state = "queued"
        self.queue[job.trace.job_id] = q

    # -- speed ------------------------------------------------------------------------------
    def _speed(self, job: SimJob) -> float:
        """Solo speed on the job's GPUs relative to the GPU its duration was measured on."""
        if self._reference_speed is None:
            return 1.0
        return min(x.device.gpu_type.relative_speed for x in job.gpus) / self._reference_speed

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
                slowdown = max(x.device.slowdown(job_id) for x in job.gpus)
                job.rate = self._speed(job) / slowdown
                job.finish_version += 1
                self._push(self.now + max(job.remaining_s, 0.0) / job.rate, FINISH, job_id, job.finish_version)


_WARMUP_S = 10.0  # seconds from launch to a training job's peak allocation

