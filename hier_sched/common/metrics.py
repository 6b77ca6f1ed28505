"""The scheduler's metrics: what it exports through ``ray.util.metrics`` to each node's
Prometheus endpoint (and so to the Ray dashboard's Grafana), with stable names.

``METRICS`` is the one list of them: the name (Ray exports it as ``ray_<name>``), its kind,
unit, tags and meaning. ``docs/metrics.md`` and the Grafana dashboard
(``docs/grafana/hier_sched.json``) are checked against it by the tests.

Two publishers, each called by an actor shell after its loop's tick, never by the core:

* ``QueueMetrics`` (the ``GlobalQueue``, on the head node): queue depths, jobs per state,
  waiting times, OOM crashes and recoveries by step, checkpoints, slot preemptions, the
  estimators' error, and how long a placement decision takes. Counters and histograms are
  read from each job's history of transitions, so a job that passed through a state between
  two publications is still counted. After a restart of the actor, the first publication only
  notes where every job stands (Prometheus sees a counter reset, as after any restart).
* ``NodeMetrics`` (each ``NodeActor``): per-GPU memory (total, reserved, used, free), SMACT
  and its risk score, power, energy, and the jobs resident on each GPU.

Both read the shells' state read-only and hand plain numbers to a ``Sink``: ``RaySink`` in the
actors, ``MemorySink`` in tests. Times of the scheduler's clock (waiting times) are in its
seconds: on an emulated cluster that is emulated time (wall seconds / time scale), as every
time ``hier-sched status`` shows; latencies of our own code are wall seconds.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from hier_sched.core.job import JobState
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.views import JobView, SchedulerCounts

__all__ = ["MetricDef", "METRICS", "metric", "Sink", "MemorySink", "RaySink", "QueueMetrics", "NodeMetrics",
           "estimator_choice", "estimator_label"]

log = logging.getLogger(__name__)

_WAIT_BUCKETS_S = (1, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
_RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
_DECISION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_STATES = tuple(s.value for s in JobState)
_TICK_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str  # without Ray's "ray_" prefix; counters end in _total as exported
    kind: Literal["gauge", "counter", "histogram"]
    unit: str
    tags: tuple[str, ...]
    help: str
    source: Literal["queue", "node"]
    buckets: tuple[float, ...] = ()
    # counters: the tag sets exported at 0 from the start, so no dashboard panel starts empty
    zero_tags: tuple[Mapping[str, str], ...] = ()

    @property
    def exported(self) -> str:
        """The series name on the Prometheus endpoint (histograms add _bucket, _sum, _count)."""
        return f"ray_{self.name}"


METRICS: tuple[MetricDef, ...] = (
    # ---- the global queue
    MetricDef("hier_sched_queue_depth", "gauge", "jobs", ("queue",), "jobs waiting, per queue: main, or recovery "
              "(jobs that crashed with OOM and wait for a larger margin)", "queue"),
    MetricDef("hier_sched_running_jobs", "gauge", "jobs", (), "jobs holding GPUs (running or checkpointing)", "queue"),
    MetricDef("hier_sched_jobs", "gauge", "jobs", ("state",), "jobs the queue knows, per state (queued, running, "
              "checkpointing, succeeded, failed, cancelled)", "queue"),
    MetricDef("hier_sched_oldest_wait_seconds", "gauge", "seconds (scheduler clock)", (),
              "how long the job that has waited longest has been waiting", "queue"),
    MetricDef("hier_sched_wait_seconds", "histogram", "seconds (scheduler clock)", (),
              "waiting time of each run that started: from entering the queue (or being requeued) to starting",
              "queue", _WAIT_BUCKETS_S),
    MetricDef("hier_sched_jobs_submitted_total", "counter", "jobs", (), "jobs accepted into the queue", "queue",
              zero_tags=({},)),
    MetricDef("hier_sched_jobs_ended_total", "counter", "jobs", ("state",),
              "jobs that ended, per final state (succeeded, failed, cancelled)", "queue",
              zero_tags=({"state": "succeeded"}, {"state": "failed"}, {"state": "cancelled"})),
    MetricDef("hier_sched_oom_crashes_total", "counter", "runs", ("step",),
              "runs that crashed with out-of-memory, per recovery step of the run (0: the first run on the "
              "estimate, k: the run after k OOM crashes)", "queue", zero_tags=({"step": "0"},)),
    MetricDef("hier_sched_oom_recoveries_total", "counter", "jobs", ("step",),
              "jobs that succeeded after OOM crashes, per step that worked (k: after k crashes)", "queue",
              zero_tags=({"step": "1"},)),
    MetricDef("hier_sched_checkpoints_requested_total", "counter", "signals", (),
              "checkpoint signals sent (slot ends and `checkpoint` requests)", "queue", zero_tags=({},)),
    MetricDef("hier_sched_checkpoints_completed_total", "counter", "checkpoints", (),
              "runs that saved a checkpoint and exited to be requeued", "queue", zero_tags=({},)),
    MetricDef("hier_sched_slot_preemptions_total", "counter", "preemptions", (),
              "running jobs asked to yield their GPUs (checkpoint first) because their time slot ended, another "
              "team queue reclaimed its share, or a job of higher priority in their queue needed them", "queue",
              zero_tags=({},)),
    # ---- team queues (``hier-sched queues``): one series per queue and figure while queues are configured
    MetricDef("hier_sched_team_queue_gpus", "gauge", "GPUs", ("team_queue", "figure"),
              "a team queue's GPUs: used (held by its runs), nominal, borrowed (used beyond nominal) and fair_share "
              "(nominal, borrowed and fair_share only where the queue governs GPUs)", "queue"),
    MetricDef("hier_sched_team_queue_memory_mib", "gauge", "MiB", ("team_queue", "figure"),
              "a team queue's GPU memory, the same figures (nominal, borrowed and fair_share only where the queue "
              "governs memory)", "queue"),
    MetricDef("hier_sched_team_queue_waiting_jobs", "gauge", "jobs", ("team_queue",), "a team queue's waiting jobs",
              "queue"),
    MetricDef("hier_sched_team_queue_share", "gauge", "fraction", ("team_queue",),
              "a team queue's weighted dominant share of its decayed use: the lowest is served first", "queue"),
    MetricDef("hier_sched_nodes", "gauge", "nodes", ("state",),
              "nodes in the queue's cluster (joined, not lost), per state: open, draining (drained, jobs still "
              "there) and drained (`hier-sched drain`, or Ray's drain: autoscaler scale-down, spot notice)", "queue",
              zero_tags=({"state": "open"}, {"state": "draining"}, {"state": "drained"})),
    MetricDef("hier_sched_estimate_ratio", "histogram", "ratio", ("estimator",),
              "observed peak / estimate of each job that ended with both (1 is exact; above 1 under-estimates)",
              "queue", _RATIO_BUCKETS),
    MetricDef("hier_sched_placement_seconds", "histogram", "seconds (wall)", (),
              "how long one scheduling step of the core takes (events, slot deadlines, placement)", "queue",
              _DECISION_BUCKETS_S),
    MetricDef("hier_sched_tick_seconds", "histogram", "seconds (wall)", (),
              "one tick of the global queue: gathering the nodes' reports, logging, the step, launching", "queue",
              _TICK_BUCKETS_S),
    # ---- each node
    MetricDef("hier_sched_gpu_memory_total_mib", "gauge", "MiB", ("node", "gpu"), "GPU memory", "node"),
    MetricDef("hier_sched_gpu_memory_reserved_mib", "gauge", "MiB", ("node", "gpu"),
              "memory the scheduler reserved for the jobs placed on the GPU (the sum of their estimates)", "node"),
    MetricDef("hier_sched_gpu_memory_used_mib", "gauge", "MiB", ("node", "gpu"), "memory in use (measured)", "node"),
    MetricDef("hier_sched_gpu_memory_free_mib", "gauge", "MiB", ("node", "gpu"),
              "memory free for placement: total - used - memory promised to jobs just started", "node"),
    MetricDef("hier_sched_gpu_smact", "gauge", "fraction", ("node", "gpu"),
              "SM activity of the last sample (DCGM field 1002)", "node"),
    MetricDef("hier_sched_gpu_smact_risk", "gauge", "fraction", ("node", "gpu"),
              "SMACT risk score over the monitoring window, what the utilization gate decides on", "node"),
    MetricDef("hier_sched_gpu_power_watts", "gauge", "W", ("node", "gpu"), "power draw", "node"),
    MetricDef("hier_sched_gpu_energy_joules", "gauge", "J", ("node", "gpu"),
              "the device's energy counter (cumulative; use increase() over a range)", "node"),
    MetricDef("hier_sched_gpu_jobs", "gauge", "jobs", ("node", "gpu"), "jobs resident on the GPU", "node"),
    MetricDef("hier_sched_node_runs", "gauge", "runs", ("node",), "job runs the node actor supervises", "node"),
)
_BY_NAME = {m.name: m for m in METRICS}


def metric(name: str) -> MetricDef:
    return _BY_NAME[name]


class Sink(Protocol):
    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def zero(self, name: str, tags: Mapping[str, str]) -> None:
        """Export counter ``name`` with ``tags`` at its current value (0 before any count)."""
        ...


class MemorySink:
    """Keeps what was published: last gauge values, counter sums, histogram samples (the tests' sink,
    and where a publication sums its counts before recording each series once)."""

    def __init__(self) -> None:
        self.gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self.samples: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = defaultdict(list)

    @staticmethod
    def _key(name: str, tags: Mapping[str, str] | None) -> tuple[str, tuple[tuple[str, str], ...]]:
        definition = metric(name)  # an undefined name is a bug: KeyError
        assert set(tags or {}) == set(definition.tags), (name, tags)
        return name, tuple(sorted((tags or {}).items()))

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.gauges[self._key(name, tags)] = value

    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.counters[self._key(name, tags)] += value

    def zero(self, name: str, tags: Mapping[str, str]) -> None:
        self.counters[self._key(name, tags)] += 0.0

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.samples[self._key(name, tags)].append(value)

    def value(self, name: str, **tags: str) -> float | None:
        key = (name, tuple(sorted(tags.items())))
        return self.gauges.get(key, self.counters.get(key))


class RaySink:
    """Records into ``ray.util.metrics`` objects, made on first use in this process (they need
    the process to be a Ray worker or driver)."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        obj = self._objects.get(name)
        if obj is None:
            from ray.util import metrics

            d = metric(name)
            text = f"{d.help} [{d.unit}]"
            if d.kind == "gauge":
                obj = metrics.Gauge(d.name, text, tag_keys=d.tags)
            elif d.kind == "counter":
                obj = metrics.Counter(d.name, text, tag_keys=d.tags)
            else:
                obj = metrics.Histogram(d.name, text, boundaries=list(d.buckets), tag_keys=d.tags)
            self._objects[name] = obj
        return obj

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._get(name).set(float(value), tags=dict(tags) if tags else None)

    def count(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        if value > 0:
            self._get(name).inc(float(value), tags=dict(tags) if tags else None)

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._get(name).observe(float(value), tags=dict(tags) if tags else None)

    def zero(self, name: str, tags: Mapping[str, str]) -> None:
        # Ray's Counter.inc refuses 0; recording a 0 increment is what makes the series exist
        # (a private call: tests/common/test_metrics pins it to the installed Ray)
        self._get(name)._record(0.0, tags=dict(tags) if tags else None)


def estimator_choice(spec: Mapping[str, Any]) -> str:
    """What a submitted spec (as logged: ``JobSpec.model_dump``) chose for its estimate: ``declared``
    (memory_mib), else its estimator."""
    return "declared" if spec.get("memory_mib") is not None else str(spec.get("estimator") or "auto")


def estimator_label(choice: str | None, estimate_source: str) -> str:
    """A short, bounded label for where a job's estimate came from: ``learned`` (a measured peak of
    an earlier run of the same job), else its spec's choice (``estimator_choice``)."""
    if estimate_source.startswith("measured peak"):
        return "learned"
    return choice or "auto"


class _Throttle:
    def __init__(self, interval_s: float, clock: Callable[[], float]):
        self.interval_s = interval_s
        self.clock = clock
        self.last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        return True


@dataclass(slots=True)
class _Seen:
    """How far a job's history was counted."""

    history: int = 0
    oom_crashes: int = 0
    checkpoints: int = 0
    preemptions: int = 0
    queued_since: float = 0.0
    state: str = "queued"  # when it was last looked at
    looked: bool = False  # looked at once: its state and moves are known (a job's first state is no move)


class QueueMetrics:
    """Publishes the queue's metrics from the core ``Scheduler``'s query API (its job views and counts)."""

    def __init__(self, sink: Sink, *, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.sink = sink
        self.throttle = _Throttle(interval_s, clock)
        self.seen: dict[str, _Seen] = {}
        self.live: set[str] = set()  # seen and not ended: the only jobs a publication looks at again
        self.ended: Counter[str] = Counter()  # state -> jobs seen ended and still known to the scheduler
        self.baseline_taken = False

    def publish(self, scheduler: Scheduler, estimators: Mapping[str, str], now_s: float,
                tick_s: float | None = None, step_s: float | None = None) -> bool:
        """After a tick: latencies always, the rest at most once per ``interval_s`` (``estimators``:
        each job's ``estimator_choice``). Returns whether the full set was published."""
        if tick_s is not None:
            self.sink.observe("hier_sched_tick_seconds", tick_s)
        if step_s is not None:
            self.sink.observe("hier_sched_placement_seconds", step_s)
        if not self.throttle.due():
            return False
        counting = self.baseline_taken
        if not counting:  # the first publication of this actor incarnation
            for d in METRICS:
                for tags in d.zero_tags:
                    self.sink.zero(d.name, tags)
        # Only what may have changed is looked at: the jobs submitted since (the newest, back to the
        # first one seen) and those not ended. A pass over every job known took a third of a second
        # under the queue's lock at 100,000 jobs, once a second.
        fresh = []
        for job_id in scheduler.newest_first():
            if job_id in self.seen:
                break
            fresh.append(job_id)
        for job_id in reversed(fresh):
            self.seen[job_id] = _Seen(queued_since=scheduler.view(job_id).submit_time)
            self.live.add(job_id)
        # Counts are summed here and recorded once per series: a record into Ray's metrics costs
        # ~0.1 ms, and a busy second ends thousands of jobs.
        counts = MemorySink()
        if counting and fresh:
            counts.count("hier_sched_jobs_submitted_total", len(fresh))
        states = dict.fromkeys(_STATES, 0)
        oldest = 0.0
        for job_id in list(self.live):
            moves = scheduler.transitions(job_id)
            if moves is None:  # ended and compacted away between two publications
                self.live.discard(job_id)
                del self.seen[job_id]
                continue
            seen = self.seen[job_id]
            if seen.looked and moves == seen.history:  # nothing happened to it since: no view built (most wait)
                states[seen.state] += 1
                if seen.state == "queued":
                    oldest = max(oldest, now_s - seen.queued_since)
                continue
            job = scheduler.view(job_id)
            seen.state = job.state.value
            seen.looked = True
            if (job.done or len(job.history) != seen.history or job.oom_crashes != seen.oom_crashes
                    or job.checkpoints != seen.checkpoints or job.preemptions != seen.preemptions):
                self._job(job, seen, estimators.get(job_id), counting, counts)
            if job.done:  # counted once (``_job``), never looked at again
                self.live.discard(job_id)
                self.ended[seen.state] += 1
                continue
            states[seen.state] += 1
            if seen.state == "queued":
                oldest = max(oldest, now_s - seen.queued_since)
        self.baseline_taken = True
        for (name, tags), value in counts.counters.items():
            self.sink.count(name, value, dict(tags))
        known = scheduler.counts()
        if len(self.seen) > known.jobs:  # some were compacted out of the scheduler
            for gone in [job_id for job_id in self.seen if not scheduler.knows(job_id)]:
                self.ended[self.seen.pop(gone).state] -= 1
        for state, n in self.ended.items():
            states[state] += n
        self._gauges(known, states, oldest)
        self._nodes(scheduler)
        self._team_queues(scheduler.queue_usage())
        return True

    def _nodes(self, scheduler: Scheduler) -> None:
        """How many of the cluster's nodes are open, draining and drained (every state, zeros too)."""
        present = scheduler.node_totals()
        states = {"open": len(present), "draining": 0, "drained": 0}
        for drain in scheduler.drained_nodes():
            if drain["node"] in present:
                states["open"] -= 1
                states[drain["state"]] += 1
        for state, n in states.items():
            self.sink.gauge("hier_sched_nodes", n, {"state": state})

    def _team_queues(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Each team queue's figures (``Scheduler.queue_usage``); none without a configuration."""
        for row in rows:
            queue = row["name"]
            for currency, name in (("gpus", "hier_sched_team_queue_gpus"), ("mib", "hier_sched_team_queue_memory_mib")):
                for figure in ("used", "nominal", "borrowed", "fair_share"):
                    value = row[f"{figure}_{currency}"]
                    if value is not None:
                        self.sink.gauge(name, value, {"team_queue": queue, "figure": figure})
            self.sink.gauge("hier_sched_team_queue_waiting_jobs", row["waiting"], {"team_queue": queue})
            self.sink.gauge("hier_sched_team_queue_share", row["share"], {"team_queue": queue})

    def _gauges(self, counts: SchedulerCounts, states: Mapping[str, int], oldest: float) -> None:
        queues = {"main": counts.queued - counts.recovering, "recovery": counts.recovering}
        for name, depth in queues.items():
            self.sink.gauge("hier_sched_queue_depth", depth, {"queue": name})
        for state, n in states.items():
            self.sink.gauge("hier_sched_jobs", n, {"state": state})
        self.sink.gauge("hier_sched_running_jobs", states["running"] + states["checkpointing"])
        self.sink.gauge("hier_sched_oldest_wait_seconds", oldest)

    def _job(self, job: JobView, seen: _Seen, estimator: str | None, counting: bool, counts: MemorySink) -> None:
        """Count what happened to the job since it was last looked at (into ``counts``)."""
        history = job.history
        for t, _from, to, _reason in history[seen.history:]:
            if to == "queued":
                seen.queued_since = t
            elif counting and to == "running":
                self.sink.observe("hier_sched_wait_seconds", max(0.0, t - seen.queued_since))
            elif counting and to == "checkpointing":
                counts.count("hier_sched_checkpoints_requested_total", 1)
        seen.history = len(history)
        if counting:
            for step in range(seen.oom_crashes, job.oom_crashes):
                counts.count("hier_sched_oom_crashes_total", 1, {"step": str(step)})
            counts.count("hier_sched_checkpoints_completed_total", job.checkpoints - seen.checkpoints)
            counts.count("hier_sched_slot_preemptions_total", job.preemptions - seen.preemptions)
        seen.oom_crashes, seen.checkpoints, seen.preemptions = job.oom_crashes, job.checkpoints, job.preemptions
        if job.done:
            if not counting:
                return
            state = job.state.value
            counts.count("hier_sched_jobs_ended_total", 1, {"state": state})
            if state == "succeeded" and job.oom_crashes:
                counts.count("hier_sched_oom_recoveries_total", 1, {"step": str(job.oom_crashes)})
            if job.observed_peak_mib and job.estimate_mib:
                self.sink.observe("hier_sched_estimate_ratio", job.observed_peak_mib / job.estimate_mib,
                                  {"estimator": estimator_label(estimator, job.estimate_source)})


class NodeMetrics:
    """Publishes one node's GPU metrics from ``NodeRuntime.summary()`` and the last samples."""

    def __init__(self, node: str, sink: Sink, *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.node = node
        self.sink = sink
        self.throttle = _Throttle(interval_s, clock)

    def due(self) -> bool:
        return self.throttle.due()

    def publish(self, summary: Mapping[str, Any], samples: Iterable[Any]) -> None:
        """``summary``: ``NodeRuntime.summary()``; ``samples``: each GPU's last ``GpuSample`` (or None)."""
        last = {s.index: s for s in samples if s is not None}
        for g in summary["gpu_detail"]:
            tags = {"node": self.node, "gpu": str(g["index"])}
            free = summary["free_mib"][g["index"]]
            values = {"hier_sched_gpu_memory_total_mib": g["total_mib"],
                      "hier_sched_gpu_memory_reserved_mib": g["reserved_mib"],
                      "hier_sched_gpu_memory_used_mib": g["used_mib"], "hier_sched_gpu_memory_free_mib": free,
                      "hier_sched_gpu_smact_risk": g["smact"], "hier_sched_gpu_power_watts": g["power_w"],
                      "hier_sched_gpu_jobs": len(g["residents"])}
            sample = last.get(g["index"])
            if sample is not None:
                values["hier_sched_gpu_smact"] = sample.smact
                values["hier_sched_gpu_energy_joules"] = sample.energy_j
            for name, value in values.items():
                self.sink.gauge(name, value, tags)
        self.sink.gauge("hier_sched_node_runs", len(summary["running"]), {"node": self.node})
