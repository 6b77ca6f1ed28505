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
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from global_queue.estimate_task import RayEstimateRunner
from global_queue.service import QueueService
from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE, node_actor_name
from hier_sched.common.messages import NodeReport
from hier_sched.common.metrics import QueueMetrics, RaySink

__all__ = ["GlobalQueue", "RayNodeSet", "start_global_queue"]

log = logging.getLogger(__name__)
_CALL_TIMEOUT_S = 10.0
_LAUNCH_TIMEOUT_S = 30.0
_BUSY_TICKS = 5


class RayNodeSet:
    """The node actors, reached by name; one round of ``exchange`` calls runs in parallel.

    A node that does not answer is looked up by name again before the next call: a node actor
    that died for good (its machine died) may be replaced by a new actor under the same name
    (the machine came back, ``hier_sched.front.deploy.rejoin_local_node``), and the old handle would
    never answer again. A node whose name is unknown to Ray sits the round out: handles are looked
    up when first used, so a queue restarted after an autoscaler removed a node comes back (that
    node is lost after its silence, or at once when Ray's node table says so)."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.handles: dict[str, Any] = {}

    def _handle(self, node: str) -> Any:
        handle = self.handles.get(node)
        if handle is None:
            handle = self.handles[node] = ray.get_actor(node_actor_name(node), namespace=NAMESPACE)
        return handle

    def _silent(self, node: str, exc: Exception) -> None:
        log.warning("node %s did not answer: %s", node, exc)
        self.handles.pop(node, None)

    def exchange_all(self, acks: Mapping[str, tuple[str, int]]) -> dict[str, NodeReport]:
        refs = {}
        for n in self.names:
            try:
                refs[n] = self._handle(n).exchange.remote(acks.get(n, ("", 0))[1], acks.get(n, ("", 0))[0])
            except ValueError as exc:  # no actor of that name (yet)
                self._silent(n, exc)
        reports = {}
        for name, ref in refs.items():
            try:
                reports[name] = ray.get(ref, timeout=_CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a slow or restarting node sits this round out
                self._silent(name, exc)
        return reports

    def call(self, node: str, method: str, *args: Any) -> Any:
        (answer,) = self.call_all([(node, method, args)])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def call_all(self, calls: Sequence[tuple[str, str, tuple[Any, ...]]]) -> list[Any]:
        refs: list[Any] = []
        for node, method, args in calls:
            try:
                refs.append(getattr(self._handle(node), method).remote(*args))
            except Exception as exc:  # noqa: BLE001 - no actor of that name (yet)
                self._silent(node, exc)
                refs.append(exc)
        answers: list[Any] = []
        for (node, method, _), ref in zip(calls, refs):
            if isinstance(ref, Exception):
                answers.append(ref)
                continue
            try:
                answers.append(ray.get(ref, timeout=_LAUNCH_TIMEOUT_S if method == "launch" else _CALL_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                self._silent(node, exc)
                answers.append(exc)
        return answers


@ray.remote(num_cpus=0, max_concurrency=16, max_restarts=-1, max_task_retries=-1)
class GlobalQueue:
    def __init__(self, nodes: list[str], *, state_dir: str, tick_s: float = 0.2, busy_tick_s: float = 0.02,
                 **settings: Any):
        self._label = (f"{len(nodes)} node(s), policy {settings.get('policy', 'auto')}, estimator "
                       f"{settings.get('estimator', 'auto')}, time x{settings.get('time_scale', 1.0):g}, "
                       f"generation {settings.get('generation', '-')}")
        self.service = QueueService(RayNodeSet(nodes), state_dir=state_dir, estimate_runner=RayEstimateRunner(),
                                    **settings)
        self.tick_s = tick_s
        self.busy_tick_s = busy_tick_s
        self._wake = threading.Event()  # a submission: look now, not at the next tick
        self.metrics = QueueMetrics(RaySink())
        self._metrics_failed = False
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
            self._publish(time.perf_counter() - started)

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


def start_global_queue(nodes: list[str], *, node_id: str, **kwargs: Any):
    """Create (or find) the global queue, pinned to Ray node ``node_id`` (the head: its log is a
    path on that machine, so the queue must not move to another one when Ray restarts it)."""
    return GlobalQueue.options(name=GLOBAL_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                               ).remote(nodes, **kwargs)
