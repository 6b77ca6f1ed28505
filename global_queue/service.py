"""The global queue's body, without Ray: the cluster's job queue, durable, and the source of truth
for every job's status. ``global_queue.actor.GlobalQueue`` is the Ray actor around it.

A shell around the core's ``Scheduler``: each ``tick`` *gathers* every node's report (snapshot,
run events, current runs), *logs* the events to the write-ahead log, *steps* the core, and
*applies* the commands (launch orders to nodes, stops, checkpoint signals). User calls (submit,
cancel, checkpoint) are logged and applied at once. Nodes are reached through a ``NodeSet``:
Ray actors in production, in-process fakes in tests.

Durability: every event is in the log before it is acknowledged (to a user, or to the node that
reported it). After a restart the queue rebuilds by feeding the log through the same core, then
reconciles with the nodes: a run a node reports that the log does not know (launched just
before the crash) is re-adopted, ends that happened meanwhile arrive as unacknowledged events,
and nothing is launched twice (a node refuses an order for a run it already has).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from estimators.job_estimate import budgets
from global_queue.estimate_pool import EstimatePool, EstimateRunner, ThreadEstimateRunner
from global_queue.estimates import (
    client_belief, estimate_for_spec, estimate_key, estimate_parts, estimate_request, estimate_warning,
    needs_model_estimate, pending_belief,
)
from global_queue.journal import Journal
from global_queue.launches import LaunchRound
from global_queue.peak_store import JsonPeakStore
from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport
from hier_sched.common.metrics import estimator_choice
from hier_sched.common.paths import job_path, outside_roots
from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.demand import autoscaler_demand, nodes_to_release
from hier_sched.core.events import (
    CancelRequested, CheckpointRequested, EstimateArrived, EstimateFailed, Event, Launch, LaunchDeclined, NodeDraining,
    NodeJoined, NodeLost, NodeUndrained, RunEnded, QueuesConfigured, RunStarted, SignalCheckpoint, Stop, Submitted,
)
from hier_sched.core.job import JobState
from hier_sched.core.learning import PeakLearner
from hier_sched.core.node_types import node_types_from_records, possible_nodes
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueSetup
from hier_sched.core.reported_cluster import ReportedCluster
from hier_sched.core.scheduler import Scheduler, StepResult
from hier_sched.core.spec import JobSpec, SpecError, check_fits, parse_spec, ticket_for_spec

__all__ = ["QueueService", "NodeSet", "CallsOneAtATime"]

log = logging.getLogger(__name__)

# The most jobs a tick starts (``QueueConfig.starts_per_cycle``): a start costs the queue well
# under a millisecond on the project's 2-core box (its launch spec, its order on the node's next
# ask, the node's reply), so 100 keep a tick's starts short and a busy queue still starts hundreds
# of jobs a second (BENCHMARKS.md, "Control plane at scale").
STARTS_PER_TICK = 100


RAY_DRAIN_REASON = "Ray drains its node (an autoscaler's scale-down or a preemption notice)"


class NodeSet(Protocol):
    """How the queue reaches its nodes. A call to a node that does not answer raises."""

    names: list[str]

    def exchange_all(self, acks: Mapping[str, tuple[str, int]]) -> dict[str, NodeReport]:
        """Every answering node's report (a node missing from the answer did not answer)."""
        ...

    def ask_all(self, acks: Mapping[str, tuple[str, int]],
                orders: Mapping[str, list[LaunchOrder]] | None = None) -> set[str]:
        """Ask every node now for the report the next ``exchange_all`` reads, with its launch
        ``orders`` (the report carries their replies): a tick asks at its end, so the nodes answer
        while the queue sleeps, not while it waits. The nodes asked (one whose last ask is still
        in flight is not: its orders wait for a later ask)."""
        ...

    def call(self, node: str, method: str, *args: Any) -> Any:
        """``launch(order)``, ``stop(job, attempt, kill_after_s)``, ``signal_checkpoint(job, attempt)``,
        ``read_log(job, offset)``, ``summary()``, ``gpu_totals()`` on one node."""
        ...

    def call_all(self, calls: Sequence[tuple[str, str, tuple[Any, ...]]]) -> list[Any]:
        """Several ``(node, method, args)`` calls at once; each one's answer, or the exception it raised."""
        ...

    def dead(self) -> set[str]:
        """The nodes known dead without waiting for their silence (Ray's node table)."""
        ...

    def draining(self) -> dict[str, float | None]:
        """The nodes Ray drains, each with its deadline (epoch seconds; None: none)."""
        ...


class CallsOneAtATime:
    """A ``NodeSet`` for node sets whose calls cost nothing to wait for (in-process ones): each
    ``call_all`` one ``call`` after another, and ``ask_all``'s orders each a ``launch`` at once,
    their replies kept for the node's next report (``reports``: what the nodes answer ``exchange``
    with); none of their nodes is known dead but by its silence, nor drained but by the queue's
    own calls."""

    def __init__(self) -> None:
        self._replies: dict[str, list[LaunchReply]] = {}  # node -> its replies for its next report

    def dead(self) -> set[str]:
        return set()

    def draining(self) -> dict[str, float | None]:
        return {}

    def reports(self, acks: Mapping[str, tuple[str, int]]) -> dict[str, NodeReport]:
        raise NotImplementedError

    def exchange_all(self, acks: Mapping[str, tuple[str, int]]) -> dict[str, NodeReport]:
        reports = self.reports(acks)
        replies = self._replies
        return {node: replace(report, launched=replies.pop(node)) if node in replies else report
                for node, report in reports.items()}

    def ask_all(self, acks: Mapping[str, tuple[str, int]],
                orders: Mapping[str, list[LaunchOrder]] | None = None) -> set[str]:
        """The orders launched now; nothing else to ask ahead (``exchange_all`` answers at once).
        A node whose launch raises did not answer: its next report carries no replies."""
        replies = self._replies
        for node, launches in (orders or {}).items():
            try:
                launched = [self.call(node, "launch", o) for o in launches]  # type: ignore[attr-defined]
                replies.setdefault(node, []).extend(launched)
            except Exception:  # noqa: BLE001 - like a remote call that failed
                replies.pop(node, None)
        return set(orders or {})

    def call_all(self, calls: Sequence[tuple[str, str, tuple[Any, ...]]]) -> list[Any]:
        answers: list[Any] = []
        for node, method, args in calls:
            try:
                answers.append(self.call(node, method, *args))  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - reported to the caller, like a remote failure
                answers.append(exc)
        return answers


@dataclass(frozen=True, slots=True)
class _Arrival:
    """Submissions logged together, waiting to be applied to the core (``QueueService._state``)."""

    events: list[Event]
    records: list[dict[str, Any]]
    now: float


class QueueService:
    def __init__(self, nodes: NodeSet, *, state_dir: str | Path, generation: str = "current", policy: str = "auto",
                 estimator: str = "auto",
                 time_scale: float = 1.0, clock: Callable[[], float] = time.time,
                 node_timeout_s: float = 20.0, allowed_roots: Sequence[str] = (),
                 estimate_runner: EstimateRunner | None = None, estimate_timeout_s: float | None = None,
                 estimate_host_mib: float | None = None, autoscaled_node_types: Sequence[Mapping[str, Any]] = (),
                 starts_per_tick: int | None = STARTS_PER_TICK):
        self.policy = policy
        self.allowed_roots = tuple(allowed_roots)  # job paths must lie under one of these (none: anywhere)
        self.default_estimator = estimator
        self.time_scale = time_scale
        self.clock = clock
        self.state_dir = Path(state_dir)
        self.node_names = list(nodes.names)
        self.nodes = nodes
        config = preset(policy)
        config = replace(config, queue=replace(config.queue, starts_per_cycle=starts_per_tick))
        self.scheduler = Scheduler(config, peaks=PeakLearner(JsonPeakStore(self.state_dir / "learned_peaks.json")))
        # before the log is read: a job admitted for nodes an autoscaler may add is admitted again on replay
        self.scheduler.allow_autoscaled(*possible_nodes(node_types_from_records(autoscaled_node_types)))
        # job -> its submission record, whose launch spec (what its launches need of its validated spec) is
        # decoded when it launches: not on the submission's path, nor for every job a restart replays
        self.submissions: dict[str, dict[str, Any]] = {}
        self.estimate_parts: dict[str, dict[str, dict[str, Any]]] = {}  # job -> GPU type -> what its estimate holds
        self.estimators: dict[str, str] = {}  # job -> its spec's estimate choice (metrics.estimator_choice)
        self.payloads: dict[str, bytes] = {}  # job -> cloudpickled callable of hs.submit(fn)
        self.requests: dict[str, str] = {}  # a client's request id -> the job its submission created
        self.results: dict[str, bytes] = {}  # job -> pickled return value
        self.acks: dict[str, tuple[str, int]] = {}  # node -> (incarnation, last event number logged)
        self.unsent_signals: dict[tuple[str, str], int] = {}  # (job, node) -> attempt whose checkpoint signal waits
        self.unsent_stops: dict[tuple[str, str], Stop] = {}  # (job, node) -> a stop its node has not answered yet
        # Nodes whose runs are to be compared with the scheduler's at their next answer: each one after
        # a restart (no incarnation acknowledged yet), a node actor's restart (a new incarnation), a node
        # back from lost, a launch it did not answer. Not every tick: that walks every run of the cluster.
        self.reconcile_due: set[str] = set()
        self.ray_drains_seen: dict[str, float | None] = {}  # node -> the deadline of Ray's drain taken in
        self.addresses: dict[str, str] = {}  # node -> its IP address (a gang's rendezvous)
        self.node_timeout_s = node_timeout_s
        self.last_seen: dict[str, float] = {}  # node -> wall time of its last answer
        self.lost: set[str] = set()  # nodes declared lost (their jobs requeued) until they answer again
        self.idle_since: dict[str, float] = {}  # node -> wall time since it runs nothing (``observe_nodes``)
        self.strays: list[Stop] = []  # runs nodes have that the scheduler does not count
        self.reported = ReportedCluster()  # one ClusterIndex, kept across ticks
        self.cluster_index: ClusterIndex | None = None
        self.last_step_s: float | None = None  # wall seconds the core's last step took (metrics)
        self.last_events = 0  # events the last tick gathered (the actor ticks sooner while there are some)
        self.launch_seconds: deque[tuple[float, int]] = deque(maxlen=100_000)  # (decision to nodes started, jobs)
        self.launches = LaunchRound()  # launch orders on their way to the nodes, and their replies
        self.lock = threading.RLock()  # the queue's state; taken through ``_state()``
        # Submissions are logged under a lock of their own and applied to the core the next time its
        # state is taken (``_state``): a submission never waits for a tick, which holds ``lock``
        # while it gathers and decides (at a thousand nodes, a few hundred milliseconds).
        self.intake_lock = threading.Lock()
        self.arrivals: list[_Arrival] = []  # logged, not applied yet (under ``intake_lock``)
        self.arriving: set[str] = set()  # their job ids
        self.early_estimates: list[tuple[str, dict[str, Any]]] = []  # estimates of jobs still arriving
        # Estimates that need the job's model are made where its code lives (the actor passes a
        # runner of Ray tasks; without one, a thread of this process runs ``estimators.job_estimate``).
        self.estimates = EstimatePool(estimate_runner or ThreadEstimateRunner(_estimate_here), time.monotonic)
        timeout_s, host_mib = budgets()
        self.estimate_timeout_s = estimate_timeout_s or timeout_s
        self.estimate_host_mib = estimate_host_mib or host_mib
        self.estimate_requests: dict[str, dict[str, Any]] = {}  # estimating job -> its logged request
        started = time.time()
        self.log_dir = self.state_dir / "queue" / generation  # this cluster's queue: its restarts find it here
        self.journal, replayed, damage = Journal.open(self.log_dir)
        self.recovery = {"records": len(replayed), "damage": damage, "seconds": 0.0}
        self._rebuild(replayed)
        # nodes that joined after the queue was created (an autoscaler's) are in the log, not in ``nodes``
        self._add_nodes([n for n in self.scheduler.node_totals() if n not in self.lost])
        # A fresh cluster: the nodes' GPUs (sizes, types) are what admission and placement judge
        # against; a log written before nodes reported their types learns them now.
        known = self.scheduler.node_totals()
        joining = [n for n in self.node_names if not known or (n in known and not self.scheduler.node_types.get(n))]
        if joining:
            self._log_and_apply([NodeJoined(n, tuple(nodes.call(n, "gpu_totals")), tuple(nodes.call(n, "gpu_types")))
                                 for n in joining], self._now())
        for job_id, request in self.estimate_requests.items():  # their tasks died with the last incarnation
            if self.scheduler.state_of(job_id) is JobState.ESTIMATING:
                self.estimates.request(job_id, estimate_key(request), request)
        self._publish_admission()
        self.recovery["seconds"] = round(time.time() - started, 3)
        if damage:
            log.warning("write-ahead log: %s", damage)

    def _now(self) -> float:
        return self.clock() / self.time_scale

    @contextmanager
    def _state(self) -> Iterator[None]:
        """The queue's state, under its lock, with every submission logged so far taken in."""
        with self.lock:
            with self.intake_lock:
                self._take_in_arrivals()
            yield
            self._publish_admission()

    def _take_in_arrivals(self) -> None:
        """(Holding both locks.) Apply the submissions logged and not yet applied, in the log's order."""
        arrivals, self.arrivals = self.arrivals, []
        for arrival in arrivals:
            for event, record in zip(arrival.events, arrival.records):
                self._remember(event, record)
            self.scheduler.apply(arrival.events, arrival.now)
            self.arriving.difference_update(e.ticket.job_id for e in arrival.events)

    def _log(self, events: list[Event], now: float, extras: list[dict[str, Any]] | None = None, *,
             sync: bool = True) -> list[dict[str, Any]]:
        """(Holding the state's lock.) Log ``events``, the submissions logged before them taken in
        first: the core takes in everything in the log's order, as a restart replays it (a
        submission logged before a change of the team queues joins its queue before the change)."""
        with self.intake_lock:
            self._take_in_arrivals()
            return self.journal.append(events, now, extras, sync=sync)

    def _publish_admission(self) -> None:
        """What a submission is judged against, left where it reads it without the lock: admission's
        index of the cluster (never changed once built) and the GPU types present."""
        self.judged_against = (self.scheduler.admission(), self.scheduler.gpu_types_present())

    # ------------------------------------------------------------------ durability
    def _rebuild(self, records: list[dict[str, Any]]) -> None:
        """Feed the log through the core (``Scheduler.rebuild``: it holds placement until every
        node has answered), then re-issue the stops still owed."""
        events = [(self.journal.event(record), record["t"]) for record in records]
        for (event, _), record in zip(events, records):
            self._remember(event, record)
        self._carry_out(self.scheduler.rebuild(events))

    def _remember(self, event: Event, record: dict[str, Any]) -> None:
        """Keep what the core does not: the launch spec, estimate choice and payload of a submission,
        a callable's result."""
        if isinstance(event, Submitted):
            self.submissions[event.ticket.job_id] = record
            self.estimators[event.ticket.job_id] = estimator_choice(record["spec"])
            if record.get("estimate_request") is not None:
                self.estimate_requests[event.ticket.job_id] = record["estimate_request"]
            if record.get("request_id") is not None:
                self.requests[record["request_id"]] = event.ticket.job_id
            if record.get("payload") is not None:
                self.payloads[event.ticket.job_id] = record["payload"]
            if record.get("estimate_parts"):  # estimated by the submitting process
                self.estimate_parts[event.ticket.job_id] = record["estimate_parts"]
        elif isinstance(event, EstimateArrived) and record.get("estimate_parts"):
            self.estimate_parts[event.job_id] = record["estimate_parts"]
        elif isinstance(event, RunEnded) and record.get("result") is not None:
            self.results[event.job_id] = record["result"]
        elif isinstance(event, NodeLost):
            self.lost.add(event.node)
            self.launches.lost(event.node)  # its launches are the loss's now (``LaunchRound.lost``)
            self.reconcile_due.add(event.node)  # its runs are strays if it answers again
        elif isinstance(event, NodeJoined):
            self.lost.discard(event.node)

    def _log_and_apply(self, events: list[Event], now: float, extras: list[dict[str, Any]] | None = None) -> list:
        records = self._log(events, now, extras)
        for event, record in zip(events, records):
            self._remember(event, record)
        return self.scheduler.apply(events, now)

    # ------------------------------------------------------------------ user calls
    def submit(self, spec_dict: dict[str, Any], payload: bytes | None = None,
               request_id: str | None = None, estimate: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue a job: ``{"job_id": ...}``, or ``{"error": reason, "problems": [...]}`` when it can never run.
        ``request_id`` makes a retried call (after a queue restart) return the first call's job.
        ``estimate``: the figures the submitting process estimated itself (``estimates.client_belief``).
        A job whose estimate needs its model, and came without one, is accepted ``estimating``: the
        answer comes at once, and the job joins the queue when its estimate arrives (``tick``)."""
        return self.submit_many([spec_dict], [payload], [request_id], [estimate])[0]

    def submit_many(self, specs: Sequence[dict[str, Any]], payloads: Sequence[bytes | None] | None = None,
                    request_ids: Sequence[str | None] | None = None,
                    estimates: Sequence[dict[str, Any] | None] | None = None) -> list[dict[str, Any]]:
        """Queue several jobs with one durable write (one fsync): each one's answer, in order, as
        ``submit`` gives it. Each spec is judged alone: one that can never run is refused by its
        own answer (``error`` names the spec), and the others are accepted all the same. Every
        accepted job is in the log before any answer returns. A request id the queue has seen
        (this batch included) answers with that first submission's job."""
        count = len(specs)
        payloads, request_ids, estimates = (list(x) if x is not None else [None] * count
                                            for x in (payloads, request_ids, estimates))
        if not len(payloads) == len(request_ids) == len(estimates) == count:
            raise ValueError(f"submit_many: {count} specs but {len(payloads)} payloads, {len(request_ids)} request "
                             f"ids and {len(estimates)} estimates")
        admission, gpu_types = self.judged_against  # the tick thread changes the nodes: their last picture
        no_estimate_mib = self.scheduler.config.placement.no_estimate_mib
        judged = [self._judge(spec, payload, estimate, admission, gpu_types)
                  for spec, payload, estimate in zip(specs, payloads, estimates)]
        logged = [None if isinstance(verdict, dict) else self.journal.submission(verdict[0], payload, request_id)
                  for verdict, payload, request_id in zip(judged, payloads, request_ids)]
        answers: list[dict[str, Any]] = [{} for _ in range(count)]
        accepted: list[tuple[int, str, JobSpec, Any, dict[str, Any] | None]] = []
        with self.intake_lock:
            events: list[Event] = []
            extras: list[dict[str, Any]] = []
            batch: dict[str, str] = {}  # request id -> job id, for this batch
            for i, (verdict, payload, request_id) in enumerate(zip(judged, payloads, request_ids)):
                # logged already (a client's retry, or Ray's replay of this call on a restarted queue),
                # or earlier in this batch
                if (repeated := self._repeated(request_id)) is not None:
                    answers[i] = repeated
                    continue
                if request_id in batch:
                    answers[i] = {"job_id": batch[request_id], "repeated": True}
                    continue
                if isinstance(verdict, dict):  # refused
                    answers[i] = verdict
                    continue
                spec, belief, request = verdict
                job_id = self._new_job_id(spec.name)
                self.arriving.add(job_id)
                if request_id is not None:
                    batch[request_id] = job_id
                ticket = ticket_for_spec(job_id, spec, belief)
                events.append(Submitted(replace(ticket, estimating=True) if request is not None else ticket))
                extras.append({**logged[i], "estimate_request": request,
                               "estimate_parts": estimate_parts(estimates[i]) if estimates[i] else None})
                accepted.append((i, job_id, spec, belief, request))
            if events:
                now = self._now()
                records = self.journal.append(events, now, extras)  # durable before any answer
                self.requests.update(batch)
                self.arrivals.append(_Arrival(events, records, now))
        for i, job_id, spec, belief, request in accepted:
            if request is not None:
                self.estimate_requests[job_id] = request  # owed from now on (``_remember`` keeps it on replay)
                self.estimates.request(job_id, estimate_key(request), request)
                answers[i] = {"job_id": job_id, "state": JobState.ESTIMATING.value, "estimate_mib": None,
                              "estimate_source": belief.source}
                continue
            answers[i] = {"job_id": job_id, "estimate_mib": belief.need_mib, "estimate_source": belief.source}
            if warning := estimate_warning(spec, belief.need_mib, no_estimate_mib):
                answers[i]["warning"] = warning
        return answers

    def _judge(self, spec_dict: dict[str, Any], payload: bytes | None, estimate: dict[str, Any] | None,
               admission: AdmissionIndex, gpu_types: list[str]) -> tuple[JobSpec, Any, dict[str, Any] | None] | dict[str, Any]:
        """A submission's spec, its memory belief and its estimate request (None: no estimate
        task needed); or, when it can never run, the refusal's answer."""
        data = dict(spec_dict)
        if "estimator" not in data and self.default_estimator:
            data["estimator"] = self.default_estimator
        request = None
        try:
            name = data.get("name")
            spec = parse_spec(data, source=f"job spec {name!r}" if isinstance(name, str) else "job spec",
                              callable_=(lambda: None) if payload is not None else None)
            if estimate is not None:
                belief = client_belief(spec, estimate)
            elif needs_model_estimate(spec):
                request = estimate_request(spec, gpu_types, timeout_s=self.estimate_timeout_s,
                                           host_budget_mib=self.estimate_host_mib)
                belief = pending_belief(spec, request)
            else:
                belief = estimate_for_spec(spec)
            check_fits(spec, admission, belief.need_mib, needs=belief.needs)
            if problems := outside_roots(spec.workdir, spec.checkpoint_dir, self.allowed_roots):
                raise SpecError(problems, f"job spec {spec.name!r}")
            _check_checkpoint_dir(spec)
        except SpecError as exc:
            return {"error": str(exc), "problems": exc.problems}
        return spec, belief, request

    # ------------------------------------------------------------------ an elastic cluster
    def observe_nodes(self, alive: Sequence[str], dead: Sequence[str], release_after_s: float | None = None
                      ) -> dict[str, Any]:
        """What Ray's node table says (``hier_sched.front.node_watcher``): node actors of nodes
        that joined (``alive``: they join on their first answer), and nodes Ray knows dead, lost
        at once rather than after ``node_timeout_s`` of silence. Answers ``{"demand": the
        autoscaler's demand, "demand_types": the GPU types each bundle may land on ([]: any),
        "release": nodes handed back (``core.demand.nodes_to_release``; with ``release_after_s``),
        "waiting": whether jobs wait}``."""
        with self._state():
            self._add_nodes(alive)
            waiting = self.scheduler.waiting_shapes()
            busy = Counter(node for node, _ in self.scheduler.reservations())
            release = [] if release_after_s is None else nodes_to_release(
                self.idle_since, [n for n in alive if n in self.scheduler.node_totals()], busy, self.clock(),
                release_after_s, bool(waiting))
            gone = [n for n in dead if n in self.node_names]
            commands = self._log_and_apply(
                [NodeLost(n, "Ray's node table says its node is dead") for n in gone if n not in self.lost]
                + [NodeLost(n, "idle: handed back to the autoscaler") for n in release], self._now())
            self._set_node_names([n for n in self.node_names if n not in gone and n not in release])
            demand = autoscaler_demand(waiting, busy)
            answer = {"demand": [bundle for bundle, _ in demand], "demand_types": [list(types) for _, types in demand],
                      "release": release, "waiting": bool(waiting)}
        self._carry_out(commands)
        return answer

    def _add_nodes(self, names: Iterable[str]) -> None:
        self._set_node_names(self.node_names + [n for n in dict.fromkeys(names) if n not in self.node_names])

    def _set_node_names(self, names: list[str]) -> None:
        self.node_names = names
        self.nodes.names = list(names)

    def _repeated(self, request_id: str | None) -> dict[str, Any] | None:
        """The answer to a submission already logged under ``request_id`` (held ``intake_lock``), else None."""
        if request_id is not None and request_id in self.requests:
            return {"job_id": self.requests[request_id], "repeated": True}
        return None

    def cluster_gpu_types(self) -> list[str]:
        """The GPU types of the cluster's nodes (joined, not lost), sorted: an estimate is made for each."""
        with self._state():
            return self.scheduler.gpu_types_present()

    def _estimate_events(self) -> tuple[list[Event], list[dict[str, Any]]]:
        """The estimates that arrived (or failed, or ran out of time) since the last tick, each with
        its record's extra: what each GPU type's figure is made of (``estimate_parts``)."""
        events: list[Event] = []
        extras: list[dict[str, Any]] = []
        outcomes, self.early_estimates = [*self.early_estimates, *self.estimates.poll()], []
        for job_id, outcome in outcomes:
            if job_id in self.arriving:  # asked by a submission this tick's state did not take in yet
                self.early_estimates.append((job_id, outcome))
                continue
            self.estimate_requests.pop(job_id, None)
            if "needs" in outcome:
                needs = tuple(sorted((t, float(m)) for t, m in outcome["needs"].items()))
                events.append(EstimateArrived(job_id, max(m for _, m in needs), outcome["source"], needs))
                extras.append({"estimate_parts": estimate_parts(outcome)})
            else:
                events.append(EstimateFailed(job_id, outcome["reject"]))
                extras.append({})
        return events, extras

    def _stop_estimating(self, job_id: str) -> None:
        """The job no longer waits for an estimate (it was cancelled)."""
        self.estimates.forget(job_id)
        self.estimate_requests.pop(job_id, None)

    def _new_job_id(self, name: str) -> str:
        """``<name>-<8 hex>``, never one the queue knows or is taking in (held ``intake_lock``): the
        core takes a known id's submission for a repeat of it, so a second job drawing the same id
        would be lost (with 6 hex digits, 10,000 jobs of one name drew a known one about three times)."""
        while True:
            job_id = f"{_slug(name)}-{uuid.uuid4().hex[:8]}"
            if not self.scheduler.knows(job_id) and job_id not in self.arriving:
                return job_id

    def status(self, job_id: str | None = None) -> Any:
        with self._state():
            if job_id is None:
                return [self._status(j) for j in self.scheduler.job_ids()]
            return self._status(job_id) if self.scheduler.knows(job_id) else None

    def _status(self, job_id: str) -> dict[str, Any]:
        out = self.scheduler.status(job_id, self.cluster_index)
        if out["state"] == JobState.ESTIMATING.value:
            out["reason"] = self.estimates.describe(job_id) or out["reason"]
        elif out["estimate_mib"] is not None:  # a type the estimate does not name takes its single figure
            out["estimates"] = {t: out["estimates"].get(t, out["estimate_mib"]) for t in self.cluster_gpu_types()}
        if job_id in self.estimate_parts:
            out["estimate_parts"] = self.estimate_parts[job_id]
        scale = self.time_scale
        for key in ("submit_time", "start_time", "end_time", "run_start_time"):  # scheduler clock -> wall clock
            out[key] = out[key] * scale if out[key] is not None else None
        return out

    def states(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        """Just the state of each job (None: unknown), for waiting on many at once."""
        with self._state():
            states = {j: self.scheduler.state_of(j) for j in job_ids}
            return {j: (state.value if state is not None else None) for j, state in states.items()}

    def history(self, job_id: str) -> list[tuple[float, str, str, str]] | None:
        with self._state():
            job = self.scheduler.view(job_id)
            return [(t * self.time_scale, a, b, r) for t, a, b, r in job.history] if job else None

    def result(self, job_id: str) -> bytes | None:
        with self._state():
            return self.results.get(job_id)

    def cancel(self, job_id: str) -> dict[str, Any]:
        with self._state():
            job = self.scheduler.view(job_id)
            if job is None:
                return {"error": f"no job {job_id!r}"}
            if job.done:
                return {"job_id": job_id, "state": job.state.value, "note": "already ended"}
            commands = self._log_and_apply([CancelRequested(job_id)], self._now())
            self._stop_estimating(job_id)
            state = job.state.value
        self._carry_out(commands)
        return {"job_id": job_id, "state": "cancelled" if state == "cancelled" else "cancelling"}

    def checkpoint(self, job_id: str) -> dict[str, Any]:
        """Ask a running job to checkpoint and requeue itself (SIGUSR1)."""
        with self._state():
            if self.scheduler.state_of(job_id) is not JobState.RUNNING:
                return {"error": f"job {job_id!r} is not running"}
            commands = self._log_and_apply([CheckpointRequested(job_id)], self._now())
        self._carry_out(commands)
        return {"job_id": job_id, "state": "checkpointing"}

    def drain_node(self, node: str, deadline_s: float | None = None,
                   reason: str = "asked by an operator") -> dict[str, Any]:
        """Take no new work on ``node`` and move its runs off it (``core.drains``): those that
        checkpoint get the signal now; ``deadline_s`` (wall seconds from now): what still runs
        there then is stopped and requeued. Answers the node's drain (``drained_nodes``)."""
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s >= 0):
            return {"error": f"deadline must be a number of seconds >= 0 (got {deadline_s})"}
        with self._state():
            if node not in self.node_names:
                return {"error": f"no node {node!r} in this cluster (nodes: {', '.join(self.node_names) or 'none'})"}
            now = self._now()
            deadline = None if deadline_s is None else now + deadline_s / self.time_scale
            commands = self._log_and_apply([NodeDraining(node, reason, deadline)], now)
            (drain,) = [d for d in self.scheduler.drained_nodes() if d["node"] == node]
        self._carry_out(commands)
        return drain

    def undrain_node(self, node: str) -> dict[str, Any]:
        """The node takes new work again."""
        with self._state():
            if node not in self.scheduler.drains_by_node():
                return {"error": f"node {node!r} is not drained"}
            self._log_and_apply([NodeUndrained(node)], self._now())
        return {"node": node, "state": "open"}

    def apply_queues(self, setup: QueueSetup) -> list[dict[str, Any]]:
        """Set the team queues, their quotas and the priority classes (validated: ``queues_spec.parse_queues``), logged
        so that a restart keeps them; answers as ``queues`` does."""
        with self._state():
            self._carry_out(self._log_and_apply([QueuesConfigured(setup)], self._now()))
        return self.queues()

    def queues(self) -> list[dict[str, Any]]:
        """Each queue's quota and what its jobs use and wait for (``Scheduler.queue_usage``)."""
        with self._state():
            return self.scheduler.queue_usage()

    def read_log(self, job_id: str, offset: int = 0) -> dict[str, Any]:
        """The job's output from ``offset`` on: the logs of every node an attempt ran on, in the
        order the job first ran there, read as one stream (each node keeps its own file).
        ``waiting_on`` names the nodes that did not answer this time; the caller asks again."""
        with self._state():
            job = self.scheduler.view(job_id)
            if job is None:
                return {"error": f"no job {job_id!r}"}
            nodes = [n for n in job.nodes_ran if n in self.node_names]
            done = job.done
        answers = self.nodes.call_all([(n, "read_log", (job_id, 0)) for n in nodes])
        silent = [n for n, a in zip(nodes, answers) if isinstance(a, Exception)]
        if silent:  # a node busy answering a tick: the stream is whole only with every node's part
            return {"text": "", "offset": offset, "done": False, "waiting_on": silent}
        data = "".join(text for text, _ in answers).encode("utf-8")
        return {"text": data[offset:].decode("utf-8", "replace"), "offset": len(data), "done": done}

    def settings(self) -> dict[str, Any]:
        """The cluster's placement policy, default estimator and time scale (wall seconds per
        scheduler second: the status objects' times are wall clock; ``front.durations``)."""
        return {"policy": self.policy, "estimator": self.default_estimator, "time_scale": self.time_scale}

    def cluster(self) -> dict[str, Any]:
        """The settings, the queue's counts and each node's ``summary``. ``waiting_on`` names the
        live nodes that did not answer this time (busy with a tick's exchange); the caller asks again."""
        names = list(self.node_names)
        answers = self.nodes.call_all([(n, "summary", ()) for n in names])
        summaries = [a for a in answers if not isinstance(a, Exception)]
        with self._state():
            waiting = [n for n, a in zip(names, answers) if isinstance(a, Exception) and n not in self.lost]
            counts = self.scheduler.counts()
            return {**self.settings(),
                    "gpu_types": self.scheduler.gpu_types_present(), "nodes": summaries, "queued": counts.queued,
                    "cycles": counts.cycles, "state_dir": str(self.state_dir), "log_dir": str(self.log_dir),
                    "recovery": self.recovery, "allowed_roots": list(self.allowed_roots),
                    "queues": self.scheduler.queue_usage(), "drains": self.scheduler.drained_nodes(),
                    "waiting_on": waiting}

    def drain(self, reason: str = "the cluster was shut down") -> int:
        """Cancel every job that has not ended (``hier-sched down``): logged, so a queue rebuilt
        later from this log does not run them again. Returns how many."""
        with self._state():
            live = self.scheduler.unfinished()
            commands = self._log_and_apply([CancelRequested(job_id, reason) for job_id in live], self._now())
            for job_id in live:
                self._stop_estimating(job_id)
        self._carry_out(commands)
        return len(live)

    # ------------------------------------------------------------------ the loop
    def tick(self, plan: bool = True) -> StepResult:
        """Gather the nodes' reports, log their events, step the core, carry out its commands.
        ``plan=False``: apply what happened but place nothing this time."""
        reports = self.nodes.exchange_all(self._acks())
        with self._state():
            now = self._now()
            declined_stops = self._settle_launches(reports, now)
            events, extras, acks = self._gather(reports)
            estimated, parts = self._estimate_events()
            events += estimated
            extras += parts
            self.last_events = len(events)
            if events:
                self._log(events, now, extras)
                for event, extra in zip(events, extras):
                    self._remember(event, extra)
            self.acks.update(acks)
            ordered = {n: reports[n].snapshot for n in self.node_names if n in reports and n not in self.lost}
            self.cluster_index = self.reported.refresh(ordered)  # updated for the nodes whose snapshot changed
            self.scheduler.heard_from(reports.keys())
            stepping = time.perf_counter()
            result = self.scheduler.step(events, self.cluster_index if plan else None, now)
            self.last_step_s = time.perf_counter() - stepping
            if result.decided:  # (applied already: the log catches up, so a rebuild decides the same)
                self._log(result.decided, now)
            if result.noted:  # (likewise; a busy queue blocks a new head most ticks: no fsync of its own)
                self._log(result.noted, now, sync=False)
            if self.journal.due():
                self.journal.compact(self.scheduler.finished_oldest_first, in_background=True)
            strays, self.strays = self.strays, []
        self._stop_all(strays + declined_stops)
        self._carry_out(result.commands)
        self._ask_ahead()
        return result

    def _acks(self) -> dict[str, tuple[str, int]]:
        """Per node, (its incarnation, the last of its events logged): what the nodes are told."""
        with self._state():
            return dict(self.acks)

    def _ask_ahead(self) -> None:
        """Ask every node for its next report, with its launch orders: answered while the loop
        sleeps, the next tick reads them at once. An order for a run the queue no longer wants
        (cancelled since, or requeued with a lost node) is not sent."""
        with self._state():
            acks = dict(self.acks)
            orders = self.launches.to_send(
                lambda o: None if self.scheduler.runs(o.job_id, o.launch.attempt) else "no longer wanted")
        asked = self.nodes.ask_all(acks, orders)
        with self.lock:  # (the launch round alone: no submission to take in for it)
            self.launches.asked(asked)

    def _settle_launches(self, reports: Mapping[str, NodeReport], now: float) -> list[Stop]:
        """(Holding the state's lock.) The replies the reports carry to the launch orders: each
        launch whose every rank has its reply is settled -- its ``RunStarted`` logged, before any
        event its nodes report of it, or its attempt taken back; the stops of a gang's ranks that
        did start where another node declined."""
        for name, report in reports.items():
            if not self.launches.answered(report):
                log.warning("node %s: launch orders not answered", name)
                self.reconcile_due.add(name)  # it may have started them all the same
        started: list[Event] = []
        stops: list[Stop] = []
        for launch in self.launches.settle():
            if launch.started:
                started.append(RunStarted(launch.cmd.job_id, launch.cmd.attempt, launch.cmd.placements,
                                          launch.decided_s))
                self.launch_seconds.append((launch.seconds * self.time_scale, 1))
            else:
                stops += self._declined(launch.cmd, launch.orders, launch.replies,
                                        [r for r in launch.replies if not r.launched])
        if started:  # one write (and fsync) for all: a restart before it re-adopts them from the nodes' reports
            self._log(started, now)
        return stops

    def _ray_drains(self, wall: float, dead: set[str]) -> list[Event]:
        """Ray's own drains as the queue's: a node Ray drains (its autoscaler's scale-down, a spot
        node's preemption notice, ``ray drain-node``) is drained here with Ray's deadline; one whose
        Ray drain went away while it lives is open again, if Ray's was its only drain."""
        events: list[Event] = []
        draining = self.nodes.draining()
        for name, deadline in draining.items():
            if self.ray_drains_seen.get(name, "") != deadline:
                self.ray_drains_seen[name] = deadline
                at = None if deadline is None else self._now() + max(0.0, deadline - wall) / self.time_scale
                events.append(NodeDraining(name, RAY_DRAIN_REASON, at))
        held = self.scheduler.drains_by_node()
        for name in [n for n in self.ray_drains_seen if n not in draining]:
            del self.ray_drains_seen[name]
            if name not in dead and name in held and held[name].reason == RAY_DRAIN_REASON:
                events.append(NodeUndrained(name))
        return events

    def _gather(self, reports: dict[str, NodeReport]
                ) -> tuple[list[Event], list[dict[str, Any]], dict[str, tuple[str, int]]]:
        """The events of this tick: nodes lost (their Ray node died, or silent past ``node_timeout_s``) or back, runs that
        ended (not seen before), and runs a node has that the queue does not know as running
        (launched just before a restart: re-adopted; strays are stopped); and per reporting
        node, the acknowledgement its events taken in allow. A run's events wait in its node's
        report (unacknowledged) while its launch is not settled: a gang's other node has not replied."""
        wall = self.clock()
        dead = self.nodes.dead()
        events = self._ray_drains(wall, dead)
        extras: list[dict[str, Any]] = [{}] * len(events)
        for name in self.node_names:
            report = reports.get(name)
            if name in dead and name not in self.lost:
                events.append(NodeLost(name, "its Ray node died"))
                extras.append({})
                continue
            if report is None:
                silent = wall - self.last_seen.setdefault(name, wall)
                if silent > self.node_timeout_s and name not in self.lost:
                    events.append(NodeLost(name, f"no answer for {silent:.0f} s"))
                    extras.append({})
                continue
            self.last_seen[name] = wall
            if name in self.lost or name not in self.scheduler.node_totals():  # back, or new
                events.append(NodeJoined(name, tuple(g.memory_total_mib for g in report.snapshot),
                                         tuple(g.gpu_type for g in report.snapshot)))
                extras.append({})
        acks: dict[str, tuple[str, int]] = {}
        for name, report in reports.items():
            incarnation, seen = self.acks.get(name, ("", 0))
            upto = seen if report.incarnation == incarnation else 0
            for seq, event, result in report.events:
                if self.launches.awaits(event.job_id):
                    break
                if report.incarnation != incarnation or seq > seen:
                    events.append(event)
                    extras.append({"result": result} if result is not None else {})
                upto = max(upto, seq)
            acks[name] = (report.incarnation, upto)
            if report.incarnation == incarnation and name not in self.reconcile_due:
                continue
            self.reconcile_due.discard(name)
            adopt, stray = self.scheduler.reconcile(name, ((r.job_id, r.attempt, r.placement) for r in report.runs))
            events += adopt
            extras += [{}] * len(adopt)
            self.strays += stray
        return events, extras, acks

    # ------------------------------------------------------------------ carrying out
    def _carry_out(self, commands: list) -> None:
        self._order_launches([cmd for cmd in commands if type(cmd) is Launch])
        with self._state():
            for cmd in commands:
                if type(cmd) is SignalCheckpoint:
                    for node in cmd.nodes:  # every rank of a gang
                        self.unsent_signals[(cmd.job_id, node)] = cmd.attempt
        self._stop_all([cmd for cmd in commands if type(cmd) is Stop])
        self._retry_signals()

    def _stop_all(self, stops: list[Stop]) -> None:
        """Send the stops, all at once, with those owed from earlier ticks (a node that did not
        answer is asked again each tick, until it answers or is lost: its runs are then requeued,
        and stopped as strays if it comes back)."""
        with self._state():
            for stop in stops:
                for node in stop.nodes:
                    self.unsent_stops[(stop.job_id, node)] = stop
            for key in [k for k in self.unsent_stops if k[1] in self.lost]:
                del self.unsent_stops[key]
            pending = list(self.unsent_stops.items())
        if not pending:
            return
        answers = self.nodes.call_all([(node, "stop", (stop.job_id, stop.attempt, stop.kill_after_s))
                                       for (_, node), stop in pending])
        with self._state():
            for (key, stop), answer in zip(pending, answers):
                if isinstance(answer, Exception):
                    log.warning("node %s: stop of %s failed: %s", key[1], stop.job_id, answer)
                elif self.unsent_stops.get(key) is stop:
                    del self.unsent_stops[key]

    def _order_launches(self, launches: list[Launch]) -> None:
        """Each launch's orders, one per rank, to go with their nodes' next asks (``_ask_ahead``)."""
        now = self._now()
        for cmd in launches:
            orders = self._orders(cmd)
            with self._state():
                self.launches.add(cmd, orders, now)

    def _orders(self, cmd: Launch) -> list[LaunchOrder]:
        """Each node's part of a run: its rank, the spec, the payload, and a gang's rendezvous."""
        with self._state():
            spec = self.journal.launch_spec(self.submissions[cmd.job_id])
            payload = self.payloads.get(cmd.job_id)
        rendezvous = {}
        if len(cmd.placements) > 1:  # torchrun's rendezvous: rank 0's node and a port there
            first = cmd.placements[0].node
            if first not in self.addresses:
                self.addresses[first] = self._call(first, "address") or first
            rendezvous = {"MASTER_ADDR": self.addresses[first], "MASTER_PORT": str(29500 + secrets.randbelow(20000))}
        return [LaunchOrder(cmd, rank, spec, payload, rendezvous) for rank in range(len(cmd.placements))]

    def _declined(self, cmd: Launch, orders: list[LaunchOrder], replies: list[LaunchReply],
                  declined: list[LaunchReply]) -> list[Stop]:
        """A node declined its part (its fresh snapshot no longer fits): the core takes the launch
        back and returns the stops for the parts other nodes did start."""
        started = tuple(order.placement.node for order, reply in zip(orders, replies) if reply.launched)
        reason = "; ".join(r.reason for r in declined)
        with self._state():
            commands = self.scheduler.apply([LaunchDeclined(cmd.job_id, cmd.attempt, reason, started)], self._now())
        return [c for c in commands if type(c) is Stop]

    def _retry_signals(self) -> None:
        """A checkpoint signal waits until the job's process shows up on its GPU (before that it
        may not have its handler installed); try again each tick while the run lasts, all nodes at once."""
        with self._state():
            for key, attempt in list(self.unsent_signals.items()):
                if not self.scheduler.awaits_checkpoint(key[0], attempt):
                    del self.unsent_signals[key]
            pending = list(self.unsent_signals.items())
        if not pending:
            return
        answers = self.nodes.call_all([(node, "signal_checkpoint", (job_id, attempt))
                                       for (job_id, node), attempt in pending])
        with self._state():
            for ((job_id, node), _), answer in zip(pending, answers):
                if isinstance(answer, Exception):
                    log.warning("node %s: checkpoint signal to %s failed: %s", node, job_id, answer)
                elif answer:
                    self.unsent_signals.pop((job_id, node), None)

    def _call(self, node: str, method: str, *args: Any) -> Any:
        try:
            return self.nodes.call(node, method, *args)
        except Exception as exc:  # noqa: BLE001 - the node answers again next tick
            log.warning("node %s: %s failed: %s", node, method, exc)
            return None


def _estimate_here(request: Mapping[str, Any]) -> dict[str, Any]:
    """An estimate made by this process's tracing worker (queues without Ray: tests)."""
    from estimators.job_estimate import estimate_for_request

    return estimate_for_request(request, where="this process")


def _check_checkpoint_dir(spec: JobSpec) -> None:
    """A checkpoint directory the job could never write is refused now, not found out at its first
    slot's end. Judged on this machine (the head): where the path, or its nearest existing parent,
    exists here and cannot be written. A path that does not exist here at all may live on the nodes'
    own disks, and is accepted."""
    if not spec.checkpoint_dir:
        return
    path = job_path(spec.checkpoint_dir, spec.workdir)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or existing == Path(existing.anchor):
        return
    if not existing.is_dir():
        raise SpecError([f"checkpoint_dir: {existing} is a file, not a directory"], f"job spec {spec.name!r}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecError([f"checkpoint_dir: {path} cannot be written ({existing} is not writable by this user)"],
                        f"job spec {spec.name!r}")


def _slug(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return keep[:40] or "job"
