"""The door into the queue (``JobIntake``): a submitted job gets the need to reserve, passes
admission (can any node ever hold it?) and joins the queue, or fails with the reason.

It also keeps what admission reads of the cluster: each node's per-GPU memory and GPU type, as the
nodes joined (``NodeJoined``) and until they are lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.events import Command, EstimateArrived, JobTicket, Reject, Submitted
from hier_sched.core.job import JobRecord, JobState
from hier_sched.core.learning import PeakLearner
from hier_sched.core.lifecycle import JobLifecycle
from hier_sched.core.managed_job import ManagedJob
from hier_sched.core.queued_job import QueuedJob
from hier_sched.core.team_queue_part import OpenQueue

__all__ = ["JobIntake"]


class JobIntake:
    def __init__(self, jobs: dict[str, ManagedJob], lifecycle: JobLifecycle, peaks: PeakLearner,
                 node_types: dict[str, str], *, mig: bool):
        self.jobs = jobs
        self.lifecycle = lifecycle
        self.peaks = peaks
        self.mig = mig
        self.teams: OpenQueue = OpenQueue()  # set by the scheduler (``Scheduler.teams``)
        self.nodes: dict[str, tuple[float, ...]] = {}  # node -> per-GPU memory (admission)
        self.node_types = node_types  # node -> its GPU type ("" when it did not say); the lifecycle reads it too
        self._admission: AdmissionIndex | None = None  # built on demand, dropped when nodes change
        self._types_present: list[str] | None = None  # the same
        # nodes an autoscaler may add (name -> per-GPU memory, GPU type): admission counts them,
        # placement does not (``allow_autoscaled``)
        self.autoscaled_nodes: dict[str, tuple[float, ...]] = {}
        self.autoscaled_types: dict[str, str] = {}
        self._seq = 0  # the queue's tie-break: submission order

    # ------------------------------------------------------------------ nodes
    def node_joined(self, node: str, gpu_totals_mib: tuple[float, ...], gpu_type: str) -> None:
        self.nodes[node] = tuple(gpu_totals_mib)
        self.node_types[node] = gpu_type
        self._admission = self._types_present = None

    def allow_autoscaled(self, nodes: Mapping[str, tuple[float, ...]], types: Mapping[str, str]) -> None:
        """Admit jobs that only nodes an autoscaler may add could hold (``core.node_types``); they
        wait for those nodes to join."""
        self.autoscaled_nodes, self.autoscaled_types = dict(nodes), dict(types)
        self._admission = None

    def node_lost(self, node: str) -> None:
        self.nodes.pop(node, None)
        self._admission = self._types_present = None

    def admission(self) -> AdmissionIndex:
        """The cluster's shape as admission reads it (the nodes that joined and those an autoscaler
        may add), built once per change of the node set: a submission asks it in microseconds."""
        if self._admission is None:
            self._admission = AdmissionIndex({**self.autoscaled_nodes, **self.nodes},
                                             {**self.autoscaled_types, **self.node_types})
        return self._admission

    def gpu_types_present(self) -> list[str]:
        """The GPU types of the nodes that joined and are not lost, sorted (none reported: [])."""
        if self._types_present is None:  # asked at every submission and estimate: kept until nodes change
            self._types_present = sorted({self.node_types.get(n, "") for n in self.nodes} - {""})
        return list(self._types_present)

    # ------------------------------------------------------------------ jobs
    def on_submitted(self, e: Submitted, now_s: float, out: list[Command]) -> None:
        t = e.ticket
        if t.job_id in self.jobs:
            return  # a repeated submission (a replayed log) changes nothing
        self._seq += 1
        record = JobRecord(t.job_id, t.name, now_s, gpus=t.gpus)
        priority, queue = self.teams.entry(t)
        queued = QueuedJob(t.job_id, now_s, gpus=t.gpus, gpus_per_node=t.gpus_per_node, smact=t.smact,
                           priority=priority, seq=self._seq, exclusive=t.exclusive, queue=queue, gpu_types=t.gpu_types)
        job = self.jobs[t.job_id] = ManagedJob(t, record, queued)
        if t.estimating:
            record.state = JobState.ESTIMATING  # its first state: admission waits for the figures
            record.estimate_source = t.estimate_source
            record.reason = t.estimate_source or "estimating"
            return
        self._set_need(job)
        self._admit(job, now_s, out)

    def on_estimate_arrived(self, e: EstimateArrived, now_s: float, out: list[Command]) -> None:
        """A job accepted while estimating gets its figures and goes through admission into the queue."""
        job = self.jobs.get(e.job_id)
        if job is None or job.record.state is not JobState.ESTIMATING:
            return  # already ended (cancelled), or a repeated event
        job.ticket = replace(job.ticket, need_mib=e.need_mib, estimate_source=e.source, needs=e.needs,
                             estimating=False)
        self._set_need(job)
        job.record.transition(JobState.QUEUED, now_s, f"estimate arrived: {job.record.estimate_source}")
        self._admit(job, now_s, out)

    def _set_need(self, job: ManagedJob) -> None:
        """The need to reserve, on the whole and per GPU type, and where it comes from, into the job's
        record and queue entry: a measured peak of the same job on a type, when the ticket learns one,
        replaces the estimate there; measured on every type present, it is the need."""
        t = job.ticket
        need, source, needs = t.need_mib, t.estimate_source, dict(t.needs)
        learned = self._learned_needs(t) if t.learn_peak else {}
        if learned:
            needs.update(learned)
            source = f"measured peak of an earlier run of the same job (+{self.peaks.margin:.0%})"
            if len(learned) > 1:
                source += f" on {', '.join(sorted(learned))}"
            if set(learned) >= set(self._types_to_learn()):
                need = max(learned.values())
        rec, queued = job.record, job.queued
        rec.estimate_mib, rec.estimate_source, rec.estimates = need, source, tuple(sorted(needs.items()))
        queued.need_mib, queued.needs = need, tuple(needs.items())

    def _admit(self, job: ManagedJob, now_s: float, out: list[Command]) -> None:
        """Admission (can any node ever hold it?), then into the queue, or ``failed`` with the reason."""
        t, record, queued = job.ticket, job.record, job.queued
        need, source = record.estimate_mib, record.estimate_source
        field_name = "gpus_per_node" if t.gpus_per_node else "gpus"
        problems = self.admission().problems(queued.per_node, t.nodes, need, needs=queued.needs, gpu_types=t.gpu_types,
                                            per_node_field=field_name, mig=self.mig)
        problems = [*problems, *self.teams.problems(t)]
        if problems:
            reason = "; ".join(problems)
            self.lifecycle.end(job, JobState.FAILED, now_s, f"rejected: {reason}")
            out.append(Reject(t.job_id, reason))
            return
        record.reason = f"queued; estimate: {source}" if source else "queued"
        self.lifecycle.enqueue(queued)

    def _learned_needs(self, t: JobTicket) -> dict[str, float]:
        """GPU type -> the need learned from earlier runs of the same job on that type."""
        return {gpu_type: mib for gpu_type in self._types_to_learn()
                if (mib := self.peaks.need(t.signature, gpu_type)) is not None}

    def _types_to_learn(self) -> list[str]:
        """The types peaks are learned for: those present ("" where no node reported its type)."""
        return self.gpu_types_present() or [""]
