"""The scheduler's query API (``SchedulerQueries``): the only way shells read it.

Shells read the scheduler only through these methods: its jobs, queue and nodes stay its own, and
what a job's view shows is ``views.JobView``. ``wait_reason`` puts why a queued job waits in one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.drains import Drain, Drains
from hier_sched.core.gpu_types import allows
from hier_sched.core.intake import JobIntake
from hier_sched.core.job import JobState
from hier_sched.core.job_queue import JobQueue
from hier_sched.core.lifecycle import JobLifecycle
from hier_sched.core.managed_job import ManagedJob
from hier_sched.core.placement import memory_requirement
from hier_sched.core.queueing import placement_request
from hier_sched.core.scheduler_config import SchedulerConfig
from hier_sched.core.team_queue_part import OpenQueue
from hier_sched.core.units import gib
from hier_sched.core.views import JobView, SchedulerCounts
from hier_sched.core.wait_reasons import NO_NODE_HAS

__all__ = ["SchedulerQueries", "wait_reason", "USABLE_NOTE"]

USABLE_NOTE = "usable = free minus the"  # how a wait reason explains the reserve (``top`` leaves it out)


class SchedulerQueries:
    """Read-only questions about the scheduler's jobs, queue and nodes (``Scheduler`` answers them)."""

    config: SchedulerConfig
    jobs: dict[str, ManagedJob]
    job_queue: JobQueue
    intake: JobIntake
    lifecycle: JobLifecycle
    teams: OpenQueue
    drains: Drains
    cycles: int

    def knows(self, job_id: str) -> bool:
        return job_id in self.jobs

    def job_ids(self) -> list[str]:
        """Every job known, in submission order (ended ones until a log compaction drops them)."""
        return list(self.jobs)

    def view(self, job_id: str) -> JobView | None:
        job = self.jobs.get(job_id)
        return JobView(job) if job is not None else None

    def transitions(self, job_id: str) -> int | None:
        """How many moves the job has made (its history's length; None: not known). Whatever
        happens to a job comes with a move (a crash, a checkpoint, a preemption too), so a reader
        that saw this number already has nothing new to read of it."""
        job = self.jobs.get(job_id)
        return len(job.record.history) if job is not None else None

    def views(self) -> Iterator[JobView]:
        """A view of every job known, in submission order."""
        return map(JobView, self.jobs.values())

    def newest_first(self) -> Iterator[str]:
        """Every job known, the latest submitted first (a reader that saw the older ones stops early)."""
        return reversed(self.jobs)

    def state_of(self, job_id: str) -> JobState | None:
        job = self.jobs.get(job_id)
        return job.record.state if job is not None else None

    def status(self, job_id: str, cluster: ClusterIndex | None = None) -> dict[str, Any]:
        """The job's public status object (``JobRecord.to_dict``, times on the scheduler's clock)
        with why it is where it is, its lost runs, slot preemptions, the ranks of its run and
        when that run started."""
        job = self.jobs[job_id]
        out = job.record.to_dict()
        out["reason"] = self.reason(job_id, cluster)
        out["lost_runs"] = job.lost_runs
        out["preemptions"] = job.preemptions
        out["queue"] = job.queued.queue
        out["ranks"] = [{"rank": i, "node": p.node, "gpus": list(p.gpus)} for i, p in enumerate(job.placements)]
        out["run_start_time"] = job.run_started_s  # the current run's start (``start_time``: the first)
        return out

    def counts(self) -> SchedulerCounts:
        recovering = sum(1 for q in self.job_queue.values() if q.recovering)
        return SchedulerCounts(len(self.jobs), len(self.job_queue), recovering, self.cycles, self.lifecycle.ended)

    def has_queued(self) -> bool:
        return bool(self.job_queue)

    def unfinished(self) -> list[str]:
        """The jobs that have not ended, in submission order."""
        return [job_id for job_id, job in self.jobs.items() if not job.record.done]

    def finished_oldest_first(self) -> list[str]:
        """The jobs that ended, the earliest end first (what a log compaction may drop first)."""
        ended = [(job.record.end_time or 0.0, job_id) for job_id, job in self.jobs.items() if job.record.done]
        return [job_id for _, job_id in sorted(ended)]

    def runs(self, job_id: str, attempt: int) -> bool:
        """Whether run ``attempt`` is the job's current run (a launch the queue still wants)."""
        return self.lifecycle.run_of(job_id, attempt) is not None

    def awaits_checkpoint(self, job_id: str, attempt: int) -> bool:
        """Whether run ``attempt`` of the job was signalled to checkpoint and has not ended yet."""
        job = self.jobs.get(job_id)
        return job is not None and job.record.attempts == attempt and job.record.state is JobState.CHECKPOINTING

    def node_totals(self) -> Mapping[str, tuple[float, ...]]:
        """Node -> per-GPU memory of the nodes that joined and are not lost (admission's picture)."""
        return MappingProxyType(self.intake.nodes)

    def admission(self) -> AdmissionIndex:
        """Admission's picture of the cluster (``JobIntake.admission``): never changed once built, so a
        submission judged outside the queue's lock may keep asking it."""
        return self.intake.admission()

    @property
    def node_types(self) -> Mapping[str, str]:
        """Node -> its GPU type ("" when it did not say), for the nodes that joined."""
        return MappingProxyType(self.intake.node_types)

    def gpu_types_present(self) -> list[str]:
        """The GPU types of the nodes that joined and are not lost, sorted (none reported: [])."""
        return self.intake.gpu_types_present()

    def reservations(self) -> dict[tuple[str, int], float]:
        """(node, GPU) -> the memory reserved there for the runs this scheduler counts as
        running (a gang's ranks that have not ended): what it has promised each GPU, which never
        exceeds the GPU."""
        booked: dict[tuple[str, int], float] = {}
        for job in self.lifecycle.with_runs.values():
            for p in job.live_ranks():
                for gpu in p.gpus:
                    booked[p.node, gpu] = booked.get((p.node, gpu), 0.0) + p.reserved_mib
        return booked

    def waiting_shapes(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(nodes, GPUs on each, GPU types) of every queued job: what it needs at once
        (``JobView.shape``) and, for a job restricted to some types, those of the types the
        cluster has or an autoscaler may add that it may run on (sorted; (): any)."""
        known = sorted(set(self.intake.node_types.values()) | set(self.intake.autoscaled_types.values()) - {""})
        return [(q.nodes, q.per_node, tuple(t for t in known if allows(q.gpu_types, t)) if q.gpu_types else ())
                for q in self.job_queue.values()]

    def drains_by_node(self) -> Mapping[str, Drain]:
        """Node -> its drain, for the nodes drained (``drains``)."""
        return MappingProxyType(self.drains.nodes)

    def drained_nodes(self) -> list[dict[str, Any]]:
        """Each node drained (``drains``), by name: why, since when and its deadline (the scheduler's
        clock; None: none), the jobs still running there and its state: ``draining`` while any is,
        ``drained`` after."""
        nodes = self.drains.nodes
        if not nodes:
            return []
        left: dict[str, list[str]] = {n: [] for n in nodes}
        for job_id, job in self.lifecycle.with_runs.items():
            for node in job.nodes:
                if node in left:
                    left[node].append(job_id)
        return [{"node": n, "state": "draining" if left[n] else "drained", "reason": d.reason, "since": d.since_s,
                 "deadline": d.deadline_s, "jobs": left[n]} for n, d in sorted(nodes.items())]

    def queue_usage(self) -> list[dict[str, Any]]:
        """Each team queue's quota, what its runs hold (beyond its nominal quota: borrowed), its fair
        share and its waiting jobs (``QuotaBook.rows``); empty without a queue configuration."""
        return self.teams.rows()

    def reason(self, job_id: str, cluster: ClusterIndex | None = None) -> str:
        """Why the job is where it is: for a queued job, why it waits (``wait_reason``)."""
        job = self.jobs[job_id]
        if job.record.state is not JobState.QUEUED:
            return job.record.reason
        return wait_reason(job, self.job_queue.waiting.get(job_id, ()), self.config, cluster)


def wait_reason(job: ManagedJob, plan_reasons: Sequence[str], config: SchedulerConfig,
                cluster: ClusterIndex | None) -> str:
    """One line on why a queued job waits, e.g. ``no GPU with 14.2 GiB usable (best: node2 gpu1,
    9.8 GiB; usable = free minus the 0.5 GiB kept free on every GPU)``, ``recovering: needs 15.4
    GiB after an OOM``, ``GPUs held for it, waiting 2.1 h``. Sizes in GiB (``units.gib``)."""
    q = job.queued
    parts = []
    if q.recovering:
        parts.append(f"recovering after {q.oom_count} OOM crash(es)")
    if q.held:
        parts.append("GPUs held for it: " + ", ".join(f"{n} GPU {','.join(map(str, g))}" for n, g in q.held))
    if cluster is not None and cluster.names:
        req = placement_request(q, cluster.gpu_total_mib or float("inf"), config.queue)
        need_free, _ = memory_requirement(req, config.placement)
        if req.exclusive:
            parts.append(f"needs {req.gpus} idle GPU(s) on {q.nodes} node(s)")
        else:
            row, col = divmod(int(cluster.free.argmax()), cluster.free.shape[1])
            best = cluster.free[row, col] - config.placement.free_reserve_mib
            reserve = gib(config.placement.free_reserve_mib)
            parts.append(f"no GPU with {gib(need_free)} usable (best: {cluster.names[row]} gpu{col}, "
                         f"{gib(max(best, 0.0))}; {USABLE_NOTE} {reserve} kept free on every GPU)"
                         if best < need_free else
                         f"needs {gib(need_free)} usable on {req.gpus} GPU(s) of {q.nodes} node(s)")
    if any(p.startswith(("no GPU with", "needs ")) for p in parts):
        # the plan's "no node has N GPU(s) with X usable" says the same again
        plan_reasons = [r for r in plan_reasons if not r.startswith(NO_NODE_HAS)]
    if plan_reasons:
        parts.append("; ".join(plan_reasons))
    elif not parts:
        parts.append(job.record.reason or "queued")
    return "waiting: " + "; ".join(parts)
