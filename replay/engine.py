"""The discrete-event simulator: the live scheduler's decisions, on a virtual clock.

A shell around the core's ``Scheduler``, as the live GlobalQueue is: each instant it *gathers*
what happened in the simulated world (``replay.world``: arrivals, runs that finished, crashed
with OOM or exited after a checkpoint) as events, calls ``Scheduler.step`` — the very lifecycle
the live queue runs — and *applies* the commands to the world's emulated GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hier_sched.core.events import Event, JobTicket, NodeJoined, QueuesConfigured, Submitted
from hier_sched.core.quotas import QueueSetup
from hier_sched.core.gpu import SharingMode
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.scheduler_config import SchedulerConfig
from hier_sched.core.slots import Slot
from hier_sched.core.tickets import make_ticket
from replay.cluster import REPORT_DELAY_S, ClusterShape
from replay.estimates import TraceEstimator
from replay.world import SimJob, SimWorld, SlotSettings
from traces.schema import Trace, TraceJob

__all__ = ["SlotSettings", "SimJob", "Simulator"]


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
        report_delay_s: float = REPORT_DELAY_S,
        queues: QueueSetup | None = None,
    ):
        self.trace = trace
        self.config = config
        self.world = SimWorld(trace, shape, placement=config.placement, slots=slots, window=window,
                              record_series=record_series, report_delay_s=report_delay_s)
        self.cluster = self.world.cluster
        self.jobs = self.world.jobs
        self.slots = slots
        self.estimator = estimator
        self.progress = progress
        self.scheduler = Scheduler(config, mig=shape.sharing is SharingMode.MIG)
        self.scheduler.apply([NodeJoined(n, tuple(g.device.memory_total_mib for g in gpus),
                                         (self.cluster.gpu_type_of[n],) * len(gpus))
                              for n, gpus in self.cluster.gpus.items()], 0.0)
        if queues is not None:  # team queues with quotas (``--queues``): the live queue's ``queues apply``
            self.scheduler.apply([QueuesConfigured(queues)], 0.0)
        self._stopped = False

    def add_job(self, tj: TraceJob) -> None:
        """One more job, arriving at its ``submit_s`` (or now, if that has passed)."""
        self.world.add_job(tj)

    def stop(self) -> None:
        """End ``run`` after the current instant, with jobs still queued or running."""
        self._stopped = True

    @property
    def cycles(self) -> int:
        return self.scheduler.counts().cycles

    @property
    def finished(self) -> int:
        return self.scheduler.counts().ended

    @property
    def events(self) -> int:
        return self.world.events

    @property
    def now(self) -> float:
        return self.world.now

    @property
    def makespan_end(self) -> float:
        return self.world.makespan_end

    def run(self) -> float:
        """Run to completion; returns wall seconds spent."""
        t0 = time.perf_counter()
        world = self.world
        total = len(self.jobs)
        reported = 0
        while not self._stopped and (instant := world.pop_instant()) is not None:
            arrivals, events, external, dirty, slot_due = instant
            if external:  # a user's call reaches the live queue between its rounds: applied at once
                self.apply_now(external)
            if arrivals:
                events = [Submitted(self.ticket(tj)) for tj in arrivals] + events
            if events or dirty or slot_due:
                self.step(events, plan=dirty)
            if self.progress is not None and world.events - reported >= 4096:
                reported = world.events
                self.progress(self.finished, total)
        if self.progress is not None:
            self.progress(self.finished, total)
        world.finish()
        return time.perf_counter() - t0

    def ticket(self, tj: TraceJob) -> JobTicket:
        """What is known at submission: the trace job's shape and the chosen estimator's belief.
        ``--slot`` is the cluster's fairness rule: it yields only to waiters (extends)."""
        slot = self.slots
        return make_ticket(tj.job_id, tj.workload, workload=tj.workload, batch_size=tj.batch_size, gpus=tj.gpus,
                           gpus_per_node=tj.gpus_per_node,
                           belief=self.estimator.belief(tj), priority=tj.priority, user=tj.user,
                           checkpoints=True,  # a simulated job saves when signalled (``SimWorld``'s CKPT_EXIT)
                           slot=Slot(slot.length_s, slot.grace_s, extends=True) if slot else None)

    def apply_now(self, events: list[Event]) -> list:
        """Apply events outside a round (no placement), with what their commands cause."""
        now = self.world.now
        commands = self.scheduler.apply(events, now)
        caused = self.world.carry_out(commands)
        while caused:
            follow = self.scheduler.apply(caused, now)
            commands += follow
            caused = self.world.carry_out(follow)
        return commands

    def step(self, events: list[Event], *, plan: bool) -> list:
        """One gather -> step -> apply round; returns the commands, in order."""
        now = self.world.now
        result = self.scheduler.step(events, self.cluster.index if plan else None, now)
        for e in events:
            if type(e) is Submitted:
                self.jobs[e.ticket.job_id].managed = self.scheduler.view(e.ticket.job_id)
        commands = list(result.commands)
        caused = self.world.carry_out(result.commands)
        if caused:  # events the commands caused at once (a stopped run): the core hears of them now
            commands += self.apply_now(caused)
        self.world.after_step(result.wake_at_s, plan and self.scheduler.has_queued(), result.plan_at_s)
        return commands
