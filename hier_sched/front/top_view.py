"""What ``hier-sched top`` shows, read from what the scheduler already serves.

The view is built from three payloads, validated here so that a field the scheduler does not
send (yet) degrades the view instead of breaking it: every field below has a default.

``status()`` — a list of job objects (``JobRecord.to_dict``):
    job_id, name, state, node, nodes, gpus (GPU indices once placed, else the count), attempts,
    oom_crashes, checkpoints, estimate_mib, estimate_source, observed_peak_mib, submit_time,
    start_time, end_time, exit_code, reason (for a queued job: why it waits).
  Optional, shown when present:
    progress        0..1, how far a running job is (a bar; else what its node says,
                    ``nodes[i].runs``; else the time since it started)
    slot_left_s     wall seconds left in a running job's time slot
    run_start_time  when the current run started (else ``start_time``, the first start)
    queue           "main" | "recovery" (else: recovery when it had an OOM crash)

``cluster()`` — policy, estimator, time_scale, gpu_types, queued, cycles, and ``nodes``: one
summary per node with node, gpu_type, backend, gpus, idle_gpus, running (job ids), free_mib
(per GPU), smact_risk (per GPU), launched_total.
  Optional, shown when present:
    nodes[i].gpu_detail  per GPU: {index, total_mib, used_mib, reserved_mib, smact, power_w,
                         residents (job ids)}; without it the memory bar shows in use = total
                         (from the GPU type) - free, SMACT is smact_risk, power is blank
    nodes[i].runs        per run on the node: {job_id, attempt, progress (0..1, as the job last
                         reported it: ``hier_sched.report_progress``; None: it reports none),
                         peak_mib (the most GPU memory monitoring has seen the run hold)}: a
                         running job's progress and peak while it runs (its status object has
                         its peak once a run ended)
    events               recent events, newest last: {t, job_id, kind, text}; kind one of
                         oom, recovery, checkpoint, preemption, requeue, failed, cancelled;
                         without it they are read from ``history(job_id)`` of the jobs that
                         had any (``ApiFetcher``)

``history(job_id)`` — (t, from_state, to_state, reason) tuples.

Times are wall-clock seconds since the epoch (the scheduler's own clock runs at ``wall /
time_scale``: ``hier_sched.front.durations``); the view carries its own ``now`` so the renderer
stays a pure function of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["GpuDetail", "RunDetail", "NodeSummary", "ClusterSummary", "JobRow", "Event", "TopView",
           "events_from_history", "ApiFetcher", "file_fetcher", "EVENT_KINDS"]

EVENT_KINDS = ("oom", "recovery", "checkpoint", "preemption", "requeue", "failed", "cancelled")


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # newer fields must not break an older top


class GpuDetail(_Payload):
    index: int
    total_mib: float
    used_mib: float | None = None
    reserved_mib: float | None = None
    smact: float | None = None
    power_w: float | None = None
    residents: list[str] = []


class RunDetail(_Payload):
    job_id: str
    attempt: int = 0
    progress: float | None = None
    peak_mib: float | None = None


class NodeSummary(_Payload):
    node: str
    gpu_type: str = ""
    backend: str = ""
    gpus: int = 0
    idle_gpus: int | None = None
    running: list[str] = []
    free_mib: list[float] = []
    smact_risk: list[float] = []
    launched_total: int | None = None
    gpu_detail: list[GpuDetail] | None = None
    runs: list[RunDetail] = []


class Event(_Payload):
    t: float
    job_id: str = ""
    kind: str
    text: str = ""


class TeamQueue(_Payload):
    """One row of ``hier-sched queues`` (``QuotaBook.rows``): what top shows of it."""

    name: str
    nominal_gpus: float | None = None
    nominal_mib: float | None = None
    used_gpus: float = 0.0
    used_mib: float = 0.0
    borrowed_gpus: float | None = None
    fair_share_gpus: float | None = None
    fair_share_mib: float | None = None
    waiting: int = 0


class NodeDrain(_Payload):
    """A drained node (``hier-sched drain``, or Ray's): ``draining`` while jobs are left there."""

    node: str
    state: str = "draining"


class ClusterSummary(_Payload):
    policy: str = "?"
    estimator: str = "?"
    time_scale: float = 1.0
    gpu_types: list[str] = []
    queued: int = 0
    cycles: int = 0
    nodes: list[NodeSummary] = []
    events: list[Event] | None = None
    queues: list[TeamQueue] = []  # while team queues are configured (``hier-sched queues``)
    drains: list[NodeDrain] = []


class JobRow(_Payload):
    job_id: str
    name: str = ""
    state: str
    node: str | None = None
    nodes: list[str] = []
    gpus: list[int] | int = 1
    attempts: int = 0
    oom_crashes: int = 0
    checkpoints: int = 0
    estimate_mib: float | None = None
    estimate_source: str = ""
    observed_peak_mib: float | None = None
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str = ""
    progress: float | None = None
    slot_left_s: float | None = None
    run_start_time: float | None = None
    queue: str | None = None  # its team queue

    @property
    def gpu_count(self) -> int:
        return len(self.gpus) if isinstance(self.gpus, list) else self.gpus

    @property
    def in_recovery(self) -> bool:
        return self.oom_crashes > 0

    def with_runs(self, runs: list[RunDetail]) -> JobRow:
        """This job with what its nodes tell of its current run (every rank of a gang has one):
        how far it says it is, and the most memory it has held so far on any of them."""
        current = [r for r in runs if r.attempt == self.attempts]
        if self.state not in ("running", "checkpointing") or not current:
            return self
        said = [r.progress for r in current if r.progress is not None]
        peaks = [r.peak_mib for r in current if r.peak_mib is not None]
        progress = self.progress if self.progress is not None else max(said, default=None)
        return self.model_copy(update={"progress": progress,
                                       "observed_peak_mib": max(peaks) if peaks else self.observed_peak_mib})


class TopView(_Payload):
    """One frame's data: what the renderer draws."""

    now: float
    cluster: ClusterSummary = ClusterSummary()
    jobs: list[JobRow] = []
    events: list[Event] = []
    error: str | None = None  # the scheduler could not be read; the last good frame is kept

    @classmethod
    def from_payloads(cls, cluster: dict[str, Any], jobs: list[dict[str, Any]], events: list[dict[str, Any]] | None,
                      now: float) -> TopView:
        summary = ClusterSummary.model_validate(cluster)
        found = summary.events if summary.events is not None else [Event.model_validate(e) for e in events or ()]
        runs: dict[str, list[RunDetail]] = {}
        for node in summary.nodes:
            for run in node.runs:
                runs.setdefault(run.job_id, []).append(run)
        rows = [JobRow.model_validate(j) for j in jobs]
        return cls(now=now, cluster=summary, jobs=[j.with_runs(runs.get(j.job_id, [])) for j in rows],
                   events=sorted(found, key=lambda e: e.t))


def events_from_history(job_id: str, history: list[tuple[float, str, str, str]] | list[list[Any]]) -> list[Event]:
    """The notable moves of one job's history, as events (a start or a success is not one)."""
    events: list[Event] = []
    crashed = False
    for t, was, to, reason in history:
        text = reason.lower()
        kind = None
        if to == "queued" and was in ("running", "checkpointing"):
            if "out of memory" in text or "oom" in text:
                kind, crashed = "oom", True
            elif "slot ended" in text:  # killed at its slot's end before it checkpointed
                kind = "preemption"
            elif "checkpointed" in text:
                kind = "checkpoint"
            else:
                kind = "requeue"
        elif to == "checkpointing":
            kind = "preemption"
        elif to == "running" and crashed:
            kind, crashed = "recovery", False
        elif to in ("failed", "cancelled"):
            kind = to
        if kind is not None:
            events.append(Event(t=float(t), job_id=job_id, kind=kind, text=reason))
    return events


Call = Callable[..., Any]  # call(method, payload) -> the scheduler's answer (``connection.Scheduler.call``)


class ApiFetcher:
    """Builds a ``TopView`` per call from the scheduler's API; an unreachable scheduler gives the
    last good view with ``error`` set. Histories are read only for jobs with something to tell
    (a crash, a checkpoint, a retry, an end that was not a success) and only when that changed."""

    def __init__(self, call: Call, *, clock: Callable[[], float] = time.time, max_events: int = 200):
        self.call = call
        self.clock = clock
        self.max_events = max_events
        self._histories: dict[str, tuple[tuple[Any, ...], list[Event]]] = {}
        self._last: TopView | None = None

    def __call__(self) -> TopView:
        now = self.clock()
        try:
            cluster = self.call("cluster", {})
            waiting = set(cluster.get("waiting_on") or ())
            if waiting and self._last:  # a node busy with a tick's exchange keeps its last row, not a gap
                cluster = {**cluster, "nodes": cluster["nodes"] + [n.model_dump() for n in self._last.cluster.nodes
                                                                   if n.node in waiting]}
            jobs = self.call("status", {})
            events = None if cluster.get("events") is not None else self._events(jobs)
            self._last = TopView.from_payloads(cluster, jobs, events, now)
        except (OSError, RuntimeError, ValidationError, KeyError, TypeError, AttributeError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            base = self._last or TopView(now=now)
            return base.model_copy(update={"now": now, "error": message})
        return self._last

    def _events(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found: list[Event] = []
        for job in jobs:
            if not (job.get("oom_crashes") or job.get("checkpoints") or job.get("attempts", 0) > 1
                    or job.get("state") in ("failed", "cancelled", "checkpointing")):
                continue
            key = (job.get("state"), job.get("attempts"), job.get("oom_crashes"), job.get("checkpoints"))
            cached = self._histories.get(job["job_id"])
            if cached is None or cached[0] != key:
                history = self.call("history", {"job_id": job["job_id"]}) or []
                cached = (key, events_from_history(job["job_id"], history))
                self._histories[job["job_id"]] = cached
            found.extend(cached[1])
        found.sort(key=lambda e: e.t)
        return [e.model_dump() for e in found[-self.max_events:]]


def file_fetcher(path: str | Path) -> Callable[[], TopView]:
    """A fixed view from a JSON file ``{"now", "cluster", "jobs", "events"}`` (demos, tests)."""
    where = Path(path)
    try:
        data = json.loads(where.read_text())
        view = TopView.from_payloads(data.get("cluster", {}), data.get("jobs", []), data.get("events"),
                                     float(data["now"]))
    except (OSError, ValueError, KeyError, ValidationError) as exc:
        raise ValueError(f"{where}: not a top view ({str(exc).splitlines()[0]})") from None
    return lambda: view
