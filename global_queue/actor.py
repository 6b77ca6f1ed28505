"""The ``GlobalQueue`` Ray actor: the queue service (``global_queue.service``) living in the cluster.

A named detached actor (``hier_sched:global`` in namespace ``hier_sched``, ``num_cpus=0``) that
Ray restarts whenever it dies (``max_restarts=-1``); each incarnation rebuilds the queue from its
write-ahead log in ``state_dir`` and reconciles with the node actors. ``state_dir`` is a path on
the node the actor is pinned to (the head node, see ``start_global_queue``): the log must stay
on one machine's local disk (or a shared file system with working ``flock`` and ``fsync``), so
a restart finds it. A background thread ticks the service every ``tick_s`` wall seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import ray

from global_queue.estimate_task import RayEstimateRunner
from global_queue.service import QueueService
from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE, ON_THE_HEAD, node_actor_name
from hier_sched.common.collector import freeze_after_full_collections
from hier_sched.common.messages import LaunchOrder, NodeReport
from hier_sched.common.metrics import QueueMetrics, RaySink

__all__ = ["GlobalQueue", "RayNodeSet", "start_global_queue"]

log = logging.getLogger(__name__)
_CALL_TIMEOUT_S = 10.0
_EXCHANGE_BUDGET_S = 0.1  # how long a tick waits for the nodes' answers, all of them together
_BUSY_TICKS = 5
_NODE_TABLE_EVERY_S = 1.0  # how often Ray's node table is read for nodes that died


class RayNodeSet:
    """The node actors, reached by name; each round of ``exchange`` calls is sent to every node at
    once and waited on at once, with one budget per tick (``exchange_budget_s``).

    A node that has not answered within the budget sits the tick out, and is not asked again until
    its answer comes: its call stays in flight and is only looked at, not waited for, in later
    ticks. A hung node so costs one tick the budget, the ticks after it nothing, and never piles up
    calls (before, each node was waited on in turn, 10 s each, every tick). Calls to a node
    whose exchange has been in flight longer than the budget fail at once (it is not answering);
    the queue retries what must arrive (stops, checkpoint signals).

    A tick asks every node for its next report when it ends (``ask_all``), and the next tick reads
    the answers that came while the queue slept without waiting for any: at 1,000 nodes the wait
    was a third of a tick (BENCHMARKS.md, "Control plane at scale"). Only a node not asked before
    the tick (the first tick, a node that could not be asked at the last one's end) is waited
    for, within the budget. The tick's launch orders ride on those asks, and their replies on the
    reports (``global_queue.launches``): a node slow to start its runs is one more node slow to
    answer, not a wait of the whole tick.

    A node answers "nothing changed" (``NodeReport.unchanged``) when its snapshot and runs are
    still the version it last sent; the report is completed here from that version, so the queue
    sees every answering node's whole picture.

    A node that does not answer is looked up by name again before the next call: a node actor
    that died for good (its machine died) may be replaced by a new actor under the same name
    (the machine came back, ``hier_sched.front.deploy.rejoin_local_node``), and the old handle would
    never answer again. A node whose name is unknown to Ray sits the round out, and so does one that
    died while the queue restarted (an autoscaler removed it): it is lost after its silence, or at
    once when Ray's node table says so.

    ``hosts``: nodes that share one actor with others (``node -> that actor's name``), whose
    methods take the node's name first and whose ``exchange_many`` answers for all its nodes in
    one call -- the simulated nodes of ``hier-sched bench control-plane``, packed many per process."""

    def __init__(self, names: list[str], hosts: Mapping[str, str] | None = None,
                 exchange_budget_s: float = _EXCHANGE_BUDGET_S):
        self.names = list(names)
        self.hosts = dict(hosts or {})
        self._shared = set(self.hosts.values())  # the actors that host several nodes
        self.exchange_budget_s = exchange_budget_s
        self.handles: dict[str, Any] = {}  # actor name -> handle
        # (actor name, method) -> the handle's method: Ray builds one on every attribute read, and a
        # busy tick of a large cluster reads hundreds (a tenth of its time at 1,000 nodes)
        self.methods: dict[tuple[str, str], Any] = {}
        self.in_flight: dict[str, Any] = {}  # actor name -> its exchange not answered yet
        self.asked_at: dict[str, float] = {}  # actor name -> when its exchange in flight was sent (monotonic)
        self.pictures: dict[str, NodeReport] = {}  # node -> its last whole report (what "unchanged" refers to)
        self.ray_nodes: dict[str, Any] = {}  # actor name -> the Ray node it runs on (its id, or the ask in flight)
        # actor name -> the Ray node its last actor ran on, while a new actor under that name is asked
        # where it runs: a machine that died and came back is marked dead by Ray only after its health
        # checks fail (~15 s), and by then the name's actor runs on another Ray node
        self.ray_nodes_before: dict[str, str] = {}
        self._dead: set[str] = set()
        self._draining: dict[str, float | None] = {}
        self._table_read = 0.0
        for actor in {self._actor(n) for n in self.names}:
            try:
                self._handle(actor)
            except ValueError as exc:  # a node that died while the queue restarted: it sits the rounds out
                self._silent(actor, exc)

    def _actor(self, node: str) -> str:
        return self.hosts.get(node) or node_actor_name(node)

    def _handle(self, actor: str) -> Any:
        handle = self.handles.get(actor)
        if handle is None:
            handle = self.handles[actor] = ray.get_actor(actor, namespace=NAMESPACE)
            if isinstance(known := self.ray_nodes.pop(actor, None), str):  # maybe a new actor: asked again
                self.ray_nodes_before[actor] = known
        return handle

    def _ray_node(self, actor: str) -> str | None:
        """The Ray node ``actor`` runs on as last heard (its last actor's while a new one is asked)."""
        known = self.ray_nodes.get(actor)
        return known if isinstance(known, str) else self.ray_nodes_before.get(actor)

    def _method(self, actor: str, method: str) -> Any:
        bound = self.methods.get((actor, method))
        if bound is None:
            bound = self.methods[(actor, method)] = getattr(self._handle(actor), method)
        return bound

    def _silent(self, actor: str, exc: Exception) -> None:
        log.warning("%s did not answer: %s", actor, exc)
        self.handles.pop(actor, None)
        for key in [k for k in self.methods if k[0] == actor]:
            del self.methods[key]

    def exchange_all(self, acks: Mapping[str, tuple[str, int]]) -> dict[str, NodeReport]:
        asked_before = list(self.in_flight.values())  # by ``ask_all`` or an earlier tick: not waited for
        fresh, _ = self._ask(acks, {})
        ready = set(self._wait(fresh, self.exchange_budget_s)) | set(self._wait(asked_before, 0))
        reports: dict[str, NodeReport] = {}
        for actor, ref in list(self.in_flight.items()):
            if ref not in ready:
                continue
            del self.in_flight[actor]
            try:
                answer = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a restarting node sits this round out
                self._silent(actor, exc)
                continue
            for report in (answer.values() if isinstance(answer, dict) else (answer,)):
                whole = self._whole(report)
                if whole is not None:
                    reports[report.node] = whole
        return reports

    def ask_all(self, acks: Mapping[str, tuple[str, int]],
                orders: Mapping[str, list[LaunchOrder]] | None = None) -> set[str]:
        return self._ask(acks, orders or {})[1]

    def _ask(self, acks: Mapping[str, tuple[str, int]],
             orders: Mapping[str, list[LaunchOrder]]) -> tuple[list[Any], set[str]]:
        """Send an ``exchange`` to every actor without one in flight, each node's launch
        ``orders`` with it; the calls sent, and the nodes asked."""
        # actor -> node -> (ack, incarnation, version, orders)
        asks: dict[str, dict[str, tuple[int, str, int, list[LaunchOrder]]]] = {}
        for n in self.names:
            incarnation, seen = acks.get(n, ("", 0))
            held = self.pictures.get(n)
            version = held.version if held is not None and held.incarnation == incarnation else -1
            asks.setdefault(self._actor(n), {})[n] = (seen, incarnation, version, orders.get(n, []))
        sent = []
        asked: set[str] = set()
        now = time.monotonic()
        for actor, nodes in asks.items():
            if actor in self.in_flight:
                continue
            try:
                if actor in self._shared:
                    ref = self._method(actor, "exchange_many").remote(nodes)
                else:
                    ((seen, incarnation, version, launches),) = nodes.values()
                    ref = self._method(actor, "exchange").remote(seen, incarnation, version, launches or None)
            except ValueError as exc:  # no actor of that name (yet)
                self._silent(actor, exc)
                continue
            self.in_flight[actor] = ref
            self.asked_at[actor] = now
            sent.append(ref)
            asked.update(nodes)
        return sent, asked

    def _not_answering(self, actors: set[str]) -> set[str]:
        """Those of ``actors`` whose exchange has been in flight longer than the budget, unanswered
        (one asked just now is not late, nor one answered and waiting for the next tick to read
        it); their answers looked at all at once."""
        now = time.monotonic()
        overdue = {a: ref for a in actors if (ref := self.in_flight.get(a)) is not None
                   and now - self.asked_at[a] > self.exchange_budget_s}
        answered = set(self._wait(list(overdue.values()), 0))
        return {a for a, ref in overdue.items() if ref not in answered}

    def _whole(self, report: NodeReport) -> NodeReport | None:
        """The report with its picture: an "unchanged" one takes the version held (None: that
        version is no longer held, so the node sits the tick out and is asked afresh)."""
        if not report.unchanged:
            self.pictures[report.node] = report
            return report
        held = self.pictures.get(report.node)
        if held is None or held.version != report.version or held.incarnation != report.incarnation:
            self.pictures.pop(report.node, None)
            return None
        return replace(report, snapshot=held.snapshot, runs=held.runs)

    @staticmethod
    def _wait(refs: list[Any], timeout_s: float) -> list[Any]:
        """The refs answered within ``timeout_s``, all waited on at once."""
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=True)
        return ready

    def dead(self) -> set[str]:
        """The nodes whose Ray node Ray's node table says died: lost at once, not after a silence
        (a node actor that stops answering on a live Ray node is judged by its silence)."""
        self._read_node_table()
        return self._dead

    def draining(self) -> dict[str, float | None]:
        """The nodes whose Ray node Ray drains (its autoscaler's scale-down, a preemption notice,
        ``ray drain-node``), each with Ray's deadline (epoch seconds; None: none)."""
        self._read_node_table()
        return self._draining

    def _read_node_table(self) -> None:
        """Ray's node table and its drains, read at most every ``_NODE_TABLE_EVERY_S``; each actor
        is asked once where it runs."""
        now = time.monotonic()
        if now - self._table_read < _NODE_TABLE_EVERY_S:
            return
        self._table_read = now
        for actor in {self._actor(n) for n in self.names} - self.ray_nodes.keys():
            if (handle := self.handles.get(actor)) is not None:
                # a function of its own, pickled by value: the node's process need not import this module
                self.ray_nodes[actor] = handle.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
        asks = [ref for ref in self.ray_nodes.values() if not isinstance(ref, str)]
        for ref in self._wait(asks, 0):
            actor = next(a for a, r in self.ray_nodes.items() if r is ref)
            try:
                self.ray_nodes[actor] = ray.get(ref)
                self.ray_nodes_before.pop(actor, None)
            except Exception:  # noqa: BLE001 - asked again at the next read
                del self.ray_nodes[actor]
        gone = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
        self._dead = {n for n in self.names if self._ray_node(self._actor(n)) in gone}
        drains = _ray_drains()
        self._draining = {n: drains[ray_node] for n in self.names
                          if (ray_node := self._ray_node(self._actor(n))) in drains and n not in self._dead}
        for actor in {self._actor(n) for n in self._dead}:
            self.ray_nodes.pop(actor, None)  # a node that comes back under its name runs on a new Ray node
            self.ray_nodes_before.pop(actor, None)

    def call(self, node: str, method: str, *args: Any) -> Any:
        (answer,) = self.call_all([(node, method, args)])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def call_all(self, calls: Sequence[tuple[str, str, tuple[Any, ...]]]) -> list[Any]:
        """Sent at once, waited on at once: each call's answer, or the exception it raised (a node
        whose exchange is overdue is not answering, and is not waited on)."""
        refs: list[Any] = []
        silent = self._not_answering({self._actor(node) for node, _, _ in calls})
        for node, method, args in calls:
            actor = self._actor(node)
            if actor in silent:
                refs.append(TimeoutError(f"node {node} is not answering"))
                continue
            try:
                bound = self._method(actor, method)
                refs.append(bound.remote(node, *args) if node in self.hosts else bound.remote(*args))
            except Exception as exc:  # noqa: BLE001 - no actor of that name (yet)
                self._silent(actor, exc)
                refs.append(exc)
        ready = set(self._wait([r for r in refs if not isinstance(r, Exception)], _CALL_TIMEOUT_S))
        answers: list[Any] = []
        for (node, method, _), ref in zip(calls, refs):
            if isinstance(ref, Exception):
                answers.append(ref)
                continue
            try:
                if ref not in ready:
                    raise TimeoutError(f"node {node}: {method} not answered in {_CALL_TIMEOUT_S:.0f} s")
                answers.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                self._silent(self._actor(node), exc)
                answers.append(exc)
        return answers


def _ray_drains() -> dict[str, float | None]:
    """Ray node id -> the deadline of Ray's drain of it (epoch seconds; None: none). Ray keeps its
    drains in the GCS; ``ray._private.state.state.get_draining_nodes`` is how Ray's own libraries
    (Train's preemption watcher, Serve) read them -- no public API says it yet -- in milliseconds,
    0 for no deadline. Should it fail, no drain is seen this time: a node is then lost when it dies."""
    try:
        drains = ray._private.state.state.get_draining_nodes()
    except Exception as exc:  # noqa: BLE001 - an older or newer Ray without it, a GCS that is away
        log.warning("Ray's drains could not be read: %s", exc)
        return {}
    return {node_id: (deadline_ms / 1000.0 if deadline_ms else None) for node_id, deadline_ms in drains.items()}


@ray.remote(num_cpus=0, max_concurrency=16, max_restarts=-1, max_task_retries=-1)
class GlobalQueue:
    def __init__(self, nodes: list[str], *, state_dir: str, tick_s: float = 0.2, busy_tick_s: float = 0.02,
                 node_hosts: dict[str, str] | None = None, **settings: Any):
        self._label = (f"{len(nodes)} node(s), policy {settings.get('policy', 'auto')}, estimator "
                       f"{settings.get('estimator', 'auto')}, time x{settings.get('time_scale', 1.0):g}, "
                       f"generation {settings.get('generation', '-')}")
        self.service = QueueService(RayNodeSet(nodes, node_hosts), state_dir=state_dir, estimate_runner=RayEstimateRunner(),
                                    **settings)
        self.tick_s = tick_s
        self.busy_tick_s = busy_tick_s
        self._wake = threading.Event()  # a submission: look now, not at the next tick
        self.metrics = QueueMetrics(RaySink())
        self._metrics_failed = False
        self.tick_seconds: deque[float] = deque(maxlen=100_000)  # the latest ticks' wall seconds (bench control-plane)
        freeze_after_full_collections()  # (the queue keeps every job it knows: ``hier_sched.common.collector``)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="global-queue", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        """The Actors page's Repr (Ray asks once, after ``__init__``) and Ray's name for its tasks."""
        return f"GlobalQueue({self._label})"

    def _loop(self) -> None:
        """Tick every ``tick_s``; at once when a job arrives; and every ``busy_tick_s`` for the
        next ``_BUSY_TICKS`` ticks after one that changed something (runs ended, jobs launched):
        a run that ends makes room, and a GPU that just got a job is offered again once its
        post-launch grace has passed -- waiting for the next full tick would pace a busy queue at
        the tick (BENCHMARKS.md, "Dispatch")."""
        busy = 0
        while not self._stop.is_set():
            self._wake.wait(self.busy_tick_s if busy else self.tick_s)
            self._wake.clear()
            started = time.perf_counter()
            try:
                result = self.service.tick()
                busy = _BUSY_TICKS if result.commands or self.service.last_events else max(0, busy - 1)
            except Exception:  # noqa: BLE001 - keep scheduling; the error is in the actor log
                log.exception("global queue tick failed")
                busy = 0
            took = time.perf_counter() - started
            self.tick_seconds.append(took)
            self._publish(took)

    def _publish(self, tick_s: float) -> None:
        """The queue's metrics (``hier_sched.common.metrics``), read under the service's lock."""
        service = self.service
        try:
            with service.lock:
                step_s, service.last_step_s = service.last_step_s, None
                self.metrics.publish(service.scheduler, service.estimators, service._now(), tick_s, step_s)
        except Exception:  # noqa: BLE001 - metrics must never stop scheduling; said once
            if not self._metrics_failed:
                log.exception("publishing the queue's metrics failed")
            self._metrics_failed = True

    # the service's public calls, one to one
    def submit(self, spec: dict[str, Any], payload: bytes | None = None, request_id: str | None = None,
               estimate: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = self.service.submit(spec, payload, request_id, estimate)
        self._wake.set()
        return answer

    def submit_many(self, specs: list[dict[str, Any]], payloads: list[bytes | None] | None = None,
                    request_ids: list[str | None] | None = None,
                    estimates: list[dict[str, Any] | None] | None = None) -> list[dict[str, Any]]:
        answers = self.service.submit_many(specs, payloads, request_ids, estimates)
        self._wake.set()
        return answers

    @ray.method(enable_task_events=False)  # every second, by the node watcher
    def observe_nodes(self, alive: list[str], dead: list[str], release_after_s: float | None = None) -> dict[str, Any]:
        return self.service.observe_nodes(alive, dead, release_after_s)

    @ray.method(enable_task_events=False)  # polled by clients
    def status(self, job_id: str | None = None) -> Any:
        return self.service.status(job_id)

    @ray.method(enable_task_events=False)  # polled by clients
    def states(self, job_ids: list[str]) -> dict[str, str | None]:
        return self.service.states(job_ids)

    @ray.method(enable_task_events=False)  # polled by clients
    def history(self, job_id: str) -> Any:
        return self.service.history(job_id)

    @ray.method(enable_task_events=False)  # polled by clients
    def result(self, job_id: str) -> bytes | None:
        return self.service.result(job_id)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.service.cancel(job_id)

    def checkpoint(self, job_id: str) -> dict[str, Any]:
        return self.service.checkpoint(job_id)

    def drain_node(self, node: str, deadline_s: float | None = None,
                   reason: str = "asked by an operator") -> dict[str, Any]:
        answer = self.service.drain_node(node, deadline_s, reason)
        self._wake.set()  # its jobs go elsewhere: look now
        return answer

    def undrain_node(self, node: str) -> dict[str, Any]:
        answer = self.service.undrain_node(node)
        self._wake.set()  # room came back: look now
        return answer

    def apply_queues(self, queues: list[Any]) -> list[dict[str, Any]]:
        answer = self.service.apply_queues(queues)
        self._wake.set()  # quotas changed: look now
        return answer

    @ray.method(enable_task_events=False)  # polled by clients and the scheduler's Ray job
    def queues(self) -> list[dict[str, Any]]:
        return self.service.queues()

    @ray.method(enable_task_events=False)  # polled by clients
    def read_log(self, job_id: str, offset: int = 0) -> dict[str, Any]:
        return self.service.read_log(job_id, offset)

    @ray.method(enable_task_events=False)  # polled by clients
    def cluster(self) -> dict[str, Any]:
        return self.service.cluster()

    @ray.method(enable_task_events=False)  # polled by clients
    def settings(self) -> dict[str, Any]:
        return self.service.settings()

    @ray.method(enable_task_events=False)
    def loaded_modules(self, prefix: str) -> list[str]:
        """The modules this process has imported whose names start with ``prefix`` (a check that
        the queue never imports a job's code)."""
        import sys

        return sorted(name for name in list(sys.modules) if name.startswith(prefix))

    def drain(self, reason: str = "the cluster was shut down") -> int:
        return self.service.drain(reason)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.service.journal.close()


def start_global_queue(nodes: list[str], **kwargs: Any):
    """Create (or find) the global queue, on the head (``ON_THE_HEAD``)."""
    return GlobalQueue.options(name=GLOBAL_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                               **ON_THE_HEAD).remote(nodes, **kwargs)
