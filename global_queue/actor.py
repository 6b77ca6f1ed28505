"""The ``GlobalQueue``: the cluster's job queue and the source of truth for every job's status.

A named detached actor (``hier_sched:global``, ``num_cpus=0``). ``submit`` validates a spec
(fields, and that some node can ever hold it with its estimate), estimates its memory and
queues it. A background loop, every ``tick_s`` wall seconds: gathers each node's snapshot and
job events in one call per node, applies the events to the ``JobRecord``s, runs the core's
``plan_cycle`` over the whole cluster to choose each job's node, and offers the job to that
node, which re-decides its GPUs with the same core (so a stale snapshot can only make it wait,
never over-commit). An OOM comes back here: the job returns to the queue with its crash count
and observed peak, where the core's recovery ordering and stepwise margins take over.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hier_sched.actor_names import GLOBAL_NAME, NAMESPACE, node_actor_name
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.job import JobRecord, JobState
from hier_sched.core.presets import preset
from hier_sched.core.queueing import QueuedJob, note_blocked_head, plan_cycle
from hier_sched.core.runtimes import RuntimeHistory
from hier_sched.core.spec import JobSpec, SpecError, check_fits, parse_spec
from global_queue.estimates import estimate_for_spec, observed_peak_feedback
from node_actor.runtime import Assignment

__all__ = ["GlobalQueue", "start_global_queue"]

log = logging.getLogger(__name__)
_EXCHANGE_TIMEOUT_S = 10.0


@dataclass(slots=True)
class _Job:
    record: JobRecord
    spec: JobSpec
    spec_dict: dict[str, Any]
    queued: QueuedJob
    other_failures: int = 0
    payload: bytes | None = None
    result: bytes | None = None
    nodes_ran: list[str] = field(default_factory=list)  # every node an attempt ran on, in order: its logs
    run_started_s: float | None = None  # scheduler clock (``_now``) of the running attempt's launch
    executed_s: float = 0.0  # scheduler-clock seconds of the attempts that ended


@ray.remote(num_cpus=0, max_concurrency=16)
class GlobalQueue:
    def __init__(self, nodes: list[str], *, policy: str = "magm", estimator: str = "auto", time_scale: float = 1.0,
                 gpu_type: str = "A100-40GB", state_dir: str | None = None, tick_s: float = 0.2):
        self.config = preset(policy)
        self.state_dir = state_dir  # on this (the head) node: where the queue's durable state goes
        self.policy = policy
        self.default_estimator = estimator
        self.time_scale = time_scale
        self.gpu_type = gpu_type
        self.tick_s = tick_s
        self.node_names = list(nodes)
        self.nodes = {n: ray.get_actor(node_actor_name(n), namespace=NAMESPACE) for n in nodes}
        self.gpu_totals = dict(zip(nodes, ray.get([h.gpu_totals.remote() for h in self.nodes.values()])))
        self.jobs: dict[str, _Job] = {}
        self.queue: dict[str, QueuedJob] = {}
        self.rr_cursor = 0
        self.runtimes = RuntimeHistory()  # run times of finished jobs, by what they run
        self._seq = 0
        self.cycles = 0
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="global-queue", daemon=True)
        self._thread.start()

    def _now(self) -> float:
        return time.time() / self.time_scale

    # ------------------------------------------------------------------ user calls
    def submit(self, spec_dict: dict[str, Any], payload: bytes | None = None) -> dict[str, Any]:
        """Queue a job: ``{"job_id": ...}``, or ``{"error": reason}`` when it can never run."""
        data = dict(spec_dict)
        if "estimator" not in data and self.default_estimator:
            data["estimator"] = self.default_estimator
        try:
            spec = parse_spec(data, callable_=(lambda: None) if payload is not None else None)
            estimate, source = estimate_for_spec(spec, self.gpu_type)
            check_fits(spec, self.gpu_totals, estimate)
            if spec.is_gang:  # the multi-node issue adds gang launch; queued now it would block the head forever
                raise SpecError([f"gpus_per_node: a gang over {spec.nodes} nodes is not supported by the live "
                                 "scheduler yet; give gpus without gpus_per_node for a single-node job"],
                                f"job spec {spec.name!r}")
        except SpecError as exc:
            return {"error": str(exc), "problems": exc.problems}
        with self.lock:
            self._seq += 1
            job_id = f"{_slug(spec.name)}-{uuid.uuid4().hex[:6]}"
            wall = time.time()
            record = JobRecord(job_id, spec.name, wall, gpus=spec.gpus, estimate_mib=estimate,
                               reason=f"queued; estimate: {source}")
            queued = QueuedJob(job_id, self._now(), gpus=spec.gpus, gpus_per_node=spec.gpus_per_node, need_mib=estimate,
                               smact=None, priority=spec.priority, seq=self._seq)
            self.jobs[job_id] = _Job(record, spec, spec.model_dump(mode="json"), queued, payload=payload)
            self.queue[job_id] = queued
        return {"job_id": job_id}

    def status(self, job_id: str | None = None) -> Any:
        with self.lock:
            if job_id is None:
                return [j.record.to_dict() for j in self.jobs.values()]
            job = self.jobs.get(job_id)
            return job.record.to_dict() if job else None

    def history(self, job_id: str) -> list[tuple[float, str, str, str]] | None:
        with self.lock:
            job = self.jobs.get(job_id)
            return list(job.record.history) if job else None

    def result(self, job_id: str) -> bytes | None:
        with self.lock:
            job = self.jobs.get(job_id)
            return job.result if job else None

    def cancel(self, job_id: str) -> dict[str, Any]:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return {"error": f"no job {job_id!r}"}
            if job.record.done:
                return {"job_id": job_id, "state": job.record.state.value, "note": "already ended"}
            if job.record.state is JobState.QUEUED:
                self.queue.pop(job_id, None)
                job.record.transition(JobState.CANCELLED, time.time(), "cancelled by the user while queued")
                return {"job_id": job_id, "state": "cancelled"}
            node = self.nodes[job.record.node]
        accepted = ray.get(node.cancel.remote(job_id))
        return {"job_id": job_id, "state": "cancelling" if accepted else job.record.state.value}

    def checkpoint(self, job_id: str) -> dict[str, Any]:
        """Ask a running job to checkpoint and requeue itself (SIGUSR1)."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job.record.state is not JobState.RUNNING:
                return {"error": f"job {job_id!r} is not running"}
            node = self.nodes[job.record.node]
        if not ray.get(node.checkpoint.remote(job_id)):
            return {"error": f"job {job_id!r} has no process on its GPU yet; try again"}
        with self.lock:
            if job.record.state is JobState.RUNNING:
                job.record.transition(JobState.CHECKPOINTING, time.time(), "checkpoint signal sent")
        return {"job_id": job_id, "state": "checkpointing"}

    def read_log(self, job_id: str, offset: int = 0) -> dict[str, Any]:
        """The job's output from ``offset`` on: the logs of every node an attempt ran on, in the
        order the job first ran there, read as one stream (each node keeps its own file)."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return {"error": f"no job {job_id!r}"}
            nodes, done = list(job.nodes_ran), job.record.done
        text = "".join(part for part, _ in ray.get([self.nodes[n].read_log.remote(job_id, 0) for n in nodes]))
        data = text.encode("utf-8")
        return {"text": data[offset:].decode("utf-8", "replace"), "offset": len(data), "done": done}

    def cluster(self) -> dict[str, Any]:
        summaries = ray.get([h.summary.remote() for h in self.nodes.values()])
        with self.lock:
            return {"policy": self.policy, "estimator": self.default_estimator, "time_scale": self.time_scale,
                    "gpu_type": self.gpu_type, "state_dir": self.state_dir, "nodes": summaries,
                    "queued": len(self.queue), "cycles": self.cycles}

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep scheduling; the error is in the actor log
                log.exception("global queue tick failed")

    def tick(self) -> None:
        """Gather snapshots and events, apply the events, plan, offer placements to nodes."""
        refs = {name: h.exchange.remote() for name, h in self.nodes.items()}
        snapshots = {}
        for name, ref in refs.items():
            try:
                reply = ray.get(ref, timeout=_EXCHANGE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a slow or restarting node sits this cycle out
                log.warning("node %s did not answer: %s", name, exc)
                continue
            snapshots[name] = reply["snapshot"]
            with self.lock:
                for event in reply["events"]:
                    self._apply(event)
        with self.lock:
            if not self.queue or not snapshots:
                return
            self.cycles += 1
            now = self._now()
            cfg = self.config
            ordered = {n: snapshots[n] for n in self.node_names if n in snapshots}
            plan = plan_cycle(list(self.queue.values()), ClusterIndex.from_snapshots(ordered), cfg.placement, cfg.queue,
                              now, rr_cursor=self.rr_cursor, expected_end=self.runtimes.expected_end)
            cursor, self.rr_cursor = self.rr_cursor, plan.rr_cursor
            offers = [(q, placement) for q, (placement,) in plan.placements]  # no gangs: rejected at submit
            for job_id, reasons in plan.waiting.items():
                self.jobs[job_id].record.reason = "waiting: " + "; ".join(reasons)
            note_blocked_head(self.queue.values(), plan, now)
        for q, placement in offers:  # the node re-decides from the same cursor the plan started from
            cursor = self._offer(q, placement.node, cursor)

    def _offer(self, q: QueuedJob, node: str, rr_cursor: int) -> int:
        """Hand a planned job to its node; returns the round-robin cursor for the next offer."""
        with self.lock:
            job = self.jobs[q.job_id]
            if job.record.state is not JobState.QUEUED:
                return rr_cursor
            assignment = Assignment(q, job.spec_dict, job.record.attempts, job.other_failures, job.payload, rr_cursor)
        reply = ray.get(self.nodes[node].offer.remote(assignment))
        with self.lock:
            if "error" in reply:
                self.queue.pop(q.job_id, None)
                job.record.transition(JobState.FAILED, time.time(), f"could not launch on {node}: {reply['error']}")
            elif reply["launched"]:
                self.queue.pop(q.job_id, None)
                job.record.node = node
                if node not in job.nodes_ran:
                    job.nodes_ran.append(node)
                job.record.gpu_indices = tuple(reply["gpus"])
                job.run_started_s = self._now()
                self.runtimes.run_started(q.job_id, _runtime_signature(job.spec), job.run_started_s, job.executed_s)
                job.record.transition(JobState.RUNNING, time.time(),
                                      f"on {node} GPU(s) {reply['gpus']} ({reply['reason']}; "
                                      f"reserved {reply['reserved_mib']:.0f} MiB)")
            else:
                job.record.reason = f"waiting: {node} declined: {reply['reason']}"
        return reply.get("rr_cursor", rr_cursor)

    def _apply(self, event: dict[str, Any]) -> None:
        job = self.jobs.get(event["job_id"])
        if job is None or job.record.done:
            return
        rec, q, now = job.record, job.queued, time.time()
        self.runtimes.run_ended(rec.job_id)
        if job.run_started_s is not None:
            job.executed_s += self._now() - job.run_started_s
            job.run_started_s = None
        if event.get("peak_mib"):
            rec.observe_peak(event["peak_mib"])
        rec.exit_code = event.get("exit_code")
        outcome = event["outcome"]
        if outcome == "succeeded":
            job.result = event.get("result")
            rec.transition(JobState.SUCCEEDED, now, event["reason"])
            self.runtimes.job_succeeded(_runtime_signature(job.spec), job.executed_s, rec.oom_crashes)
            if rec.observed_peak_mib:
                try:
                    observed_peak_feedback(job.spec, rec.observed_peak_mib, self.gpu_type)
                except Exception:  # noqa: BLE001 - learning is best effort, the job succeeded
                    log.exception("recording the observed peak of %s failed", rec.job_id)
        elif outcome == "cancelled":
            rec.transition(JobState.CANCELLED, now, event["reason"])
        elif outcome == "failed":
            if event.get("failure_kind") == "oom":
                rec.oom_crashes += 1
            rec.transition(JobState.FAILED, now, event["reason"])
        elif outcome == "requeue":
            kind = event.get("failure_kind")
            if kind == "oom":
                rec.oom_crashes += 1
                q.oom_count += 1
                if event.get("peak_mib"):
                    q.observed_peak_mib = max(q.observed_peak_mib or 0.0, event["peak_mib"])
            elif kind == "checkpoint_requeue":
                rec.checkpoints += 1
                q.submit_s = self._now()  # back of the queue: the fairness of a time slot
            else:
                job.other_failures += 1
            q.waiting_since_s = None
            q.held = ()
            rec.transition(JobState.QUEUED, now, event["reason"])
            self.queue[rec.job_id] = q


def _runtime_signature(spec: JobSpec) -> tuple:
    """What makes two submissions "the same job" for learning run times: what runs, how big, how wide."""
    model = spec.model.factory if spec.model else None
    emulated = spec.emulation.model_dump_json() if spec.emulation else None
    return spec.name, spec.command, spec.entrypoint, model, spec.batch_size, spec.gpus, emulated


def _slug(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return keep[:40] or "job"


def start_global_queue(nodes: list[str], *, node_id: str, **kwargs: Any):
    """Create (or find) the global queue, pinned to Ray node ``node_id`` (the head: its state
    directory is a path on that machine, so the queue must not move to another one)."""
    return GlobalQueue.options(name=GLOBAL_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                               ).remote(nodes, **kwargs)
