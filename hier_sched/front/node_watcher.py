"""The node watcher: the scheduler's eyes on a cluster whose nodes come and go.

A detached actor on the head (``num_cpus=0``, restarted by Ray), started by ``up`` when an
autoscaler adds the GPU nodes (``up --autoscale``). Every second it reads Ray's node table and:

* starts a node actor on each GPU node that joined, named by the node's Ray id (``n-`` and its
  last 12 hex digits: stable while the node lives, never reused, unlike a position), with the
  GPU type its ``hier-sched/gpu-type`` label names, asking Ray for each job's share of ``GPU``
  so that a node running a job never looks idle to the autoscaler;
* tells the queue which of those nodes are alive and which Ray knows dead (``observe_nodes``:
  a dead node is lost at once, not after the queue's silence timeout);
* asks Ray's autoscaler for the queue's demand (``core.demand``) through
  ``ray.autoscaler.sdk.request_resources``, whenever it changed: each request replaces the last,
  so it is always the whole demand, and ``[]`` once nothing waits or runs; a bundle of a job
  restricted to some GPU types carries a label selector on the nodes' ``hier-sched/gpu-type``
  label (``type_selector``);
* ends the node actors of the nodes the queue released (idle while no job waits): Ray counts a
  node with any live worker process, an actor's too, as busy, so only a node without our actor
  can go after the autoscaler's idle timeout. Should a job wait before the autoscaler removed
  such a node, its actor is started again.

Why an actor of its own rather than the queue's loop: starting a node actor needs the node
actor's class, and the queue never imports the node side (the floors, docs/architecture.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE, ON_THE_HEAD, WATCHER_NAME
from hier_sched.front.autoscaling import GPU_TYPE_LABEL, elastic_node_name

__all__ = ["NodeWatcher", "start_node_watcher", "type_selector"]

log = logging.getLogger(__name__)
_LOOK_S = 1.0
_RELEASE_AFTER_S = 5.0  # idle this long while no job waits: released (``core.demand.nodes_to_release``)


def type_selector(types: list[str]) -> dict[str, str]:
    """Ray's label selector for a bundle that may land on nodes of ``types`` ([]: any node)."""
    if not types:
        return {}
    return {GPU_TYPE_LABEL: types[0] if len(types) == 1 else f"in({','.join(types)})"}


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class NodeWatcher:
    def __init__(self, node_actor_options: dict[str, Any], default_gpu_type: str, look_s: float = _LOOK_S,
                 release_after_s: float = _RELEASE_AFTER_S):
        self.options = node_actor_options  # what every node actor gets (backend, policy, state dir...)
        self.default_gpu_type = default_gpu_type
        self.look_s = look_s
        self.release_after_s = release_after_s
        self.started: dict[str, str] = {}  # Ray node id -> the scheduler's name of its node
        self.released: set[str] = set()  # Ray node ids whose node actor ended: left to the autoscaler
        self.demand: tuple[list, list] | None = None  # the last request made (bundles, their GPU types)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-watcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.look_s):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a missed look is made up a second later; said in the log
                log.exception("node watcher: a look at the cluster failed")

    def look(self) -> dict[str, Any]:
        """One round: node actors for new GPU nodes, the queue told, the autoscaler asked,
        released nodes' actors ended."""
        from ray.autoscaler.sdk import request_resources

        alive, dead, idle_released = [], [], []
        for node in ray.nodes():
            gpus = int(node["Resources"].get("GPU", 0)) if node["Alive"] else 0
            node_id = node["NodeID"]
            if not node["Alive"]:  # the queue ignores names it does not know (a restarted watcher knows none)
                dead.append(elastic_node_name(node_id))
                self.started.pop(node_id, None)
                self.released.discard(node_id)
            elif node_id in self.released:
                idle_released.append((node, gpus))
            elif gpus > 0:
                if node_id not in self.started:
                    self._start_node_actor(node, gpus)
                alive.append(self.started[node_id])
        queue = ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE)
        answer = ray.get(queue.observe_nodes.remote(alive, dead, self.release_after_s), timeout=30)
        for name in answer["release"]:
            self._release(name)
        if answer["waiting"]:  # a job waits: released nodes the autoscaler has not removed yet serve again
            for node, gpus in idle_released:
                self.released.discard(node["NodeID"])
                self._start_node_actor(node, gpus)
        demand = (answer["demand"], answer["demand_types"])
        if demand != self.demand:
            selectors = [type_selector(types) for types in answer["demand_types"]]
            request_resources(bundles=answer["demand"], bundle_label_selectors=selectors if any(selectors) else None)
            log.info("asked the autoscaler for %s", answer["demand"] or "nothing")
            self.demand = demand
        return answer

    def _release(self, name: str) -> None:
        from hier_sched.common.actor_names import node_actor_name

        node_id = next((i for i, n in self.started.items() if n == name), None)
        if node_id is None:
            return
        try:
            actor = ray.get_actor(node_actor_name(name), namespace=NAMESPACE)
            ray.get(actor.shutdown.remote(), timeout=30)  # its fork server too: no process of ours is left
            ray.kill(actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - gone already
            log.info("node %s released; its node actor: %s", name, exc)
        del self.started[node_id]
        self.released.add(node_id)
        log.info("node %s idle: its node actor ended, the node is left to the autoscaler", name)

    def _start_node_actor(self, node: dict[str, Any], gpus: int) -> None:
        from node_actor.actor import start_node_actor

        name = elastic_node_name(node["NodeID"])
        gpu_type = (node.get("Labels") or {}).get(GPU_TYPE_LABEL, self.default_gpu_type)
        actor = start_node_actor(name, node["NodeID"], gpu_type=gpu_type, gpus=gpus, ray_resources="gpu_share",
                                 **self.options)
        ray.get(actor.summary.remote(), timeout=120)  # up and answering before the queue is told of it
        self.started[node["NodeID"]] = name
        log.info("node %s joined (%d x %s): node actor %s started", node["NodeID"], gpus, gpu_type, name)

    def shutdown(self) -> None:
        self._stop.set()


def start_node_watcher(node_actor_options: dict[str, Any], default_gpu_type: str):
    return NodeWatcher.options(name=WATCHER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                               **ON_THE_HEAD).remote(node_actor_options, default_gpu_type)
