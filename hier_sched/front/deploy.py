"""Putting the scheduler on a Ray cluster and taking it off: what ``up`` and ``down`` do.

``start_cluster``: attach to ``config.address``, or start a local Ray cluster of ``ray start``
processes (``local_cluster``); then submit the scheduler's Ray job (``control``), whose driver
starts one node actor on every alive Ray node and the global queue pinned to the head node,
wait until it says it is ready, write a note of it on this machine (``cluster_record``) and
return. Nothing of ours keeps running here: the driver lives on the head, managed by Ray's job
submission, and clients reach the queue through Ray (``connection``) from any node. A cluster
without a dashboard (no job submission) gets the actors from this process instead, as a
driver that exits: their jobs' Ray tasks then show FAILED once it has (``control``).

``stop_cluster`` undoes what ``up`` started: the scheduler's actors (their running jobs are
cancelled first), and the Ray processes only when ``up`` started them itself.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hier_sched.common.actor_names import GLOBAL_NAME, HEAD_RESOURCE, NAMESPACE, NODE_NAME_PREFIX, WATCHER_NAME
from hier_sched.common.paths import state_dir
from hier_sched.front.autoscaling import worker_node_types
from hier_sched.front.cluster_info import dashboard_url
from hier_sched.front.cluster_record import ClusterRecord, read_record, remove_record, write_record
from hier_sched.front.connection import SchedulerUnavailable, connect_ray, disconnect, gcs_answers
from hier_sched.front.local_cluster import (SCHEDULER_NODE_PREFIX, ClusterConfig, local_ray_alive, restart_local_head,
                                            restart_local_node, start_local_ray, stop_local_ray, wait_for_nodes)

__all__ = ["RayNode", "ray_nodes", "start_cluster", "stop_cluster", "attach_scheduler", "detach_scheduler",
           "rejoin_local_node", "scheduler_job_id", "DeployError", "READY"]

# The line the scheduler's driver (``control``) prints once its actors are up: ``up`` waits for it.
READY = "hier_sched scheduler ready"


class DeployError(RuntimeError):
    """``up`` or ``down`` cannot do what was asked; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class RayNode:
    name: str  # the scheduler's name for it (node0 is the head)
    node_id: str
    declared: bool  # declares our hs_node_/hs_gpu*_mem_mib resources (clusters `up` started)


def ray_nodes() -> list[RayNode]:
    """The alive Ray nodes, named: by their ``hs_node_<name>`` resource when they declare one,
    else by position (the head first, then by node id)."""
    import ray

    from node_actor.launcher import NODE_RESOURCE_PREFIX

    alive = sorted((n for n in ray.nodes() if n["Alive"]),
                   key=lambda n: (HEAD_RESOURCE not in n["Resources"], n["NodeID"]))
    declared = {n["NodeID"]: r[len(NODE_RESOURCE_PREFIX):] for n in alive for r in n["Resources"]
                if r.startswith(NODE_RESOURCE_PREFIX)}
    taken, position, named = set(declared.values()), 0, []
    for n in alive:
        name = declared.get(n["NodeID"])
        if name is None:
            while (name := f"{SCHEDULER_NODE_PREFIX}{position}") in taken:
                position += 1
            taken.add(name)
        named.append(RayNode(name, n["NodeID"], n["NodeID"] in declared))
    return named


def _our_actors() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and (a["name"] in (GLOBAL_NAME, WATCHER_NAME)
                                                or a["name"].startswith(NODE_NAME_PREFIX))]


def attach_scheduler(config: ClusterConfig, scheduler_state_dir: str, generation: str) -> list[RayNode]:
    """Start the node actors and the global queue on the cluster this process is a driver of:
    they, and every task they submit, belong to this driver's Ray job (``control``)."""
    import ray

    from global_queue.actor import start_global_queue

    if existing := _our_actors():
        raise DeployError(f"a hier_sched scheduler already runs on this Ray cluster ({', '.join(sorted(existing))}); "
                          "stop it first with `hier-sched down` (RAY_ADDRESS set to this cluster)")
    for stale in Path(scheduler_state_dir).glob("nodes/*/devices"):  # emulated GPUs of an earlier scheduler
        shutil.rmtree(stale, ignore_errors=True)
    nodes = ray_nodes()
    elastic = config.autoscale is not None
    if elastic:  # the node watcher starts the GPU workers' node actors as the autoscaler adds them
        nodes = []
    try:
        actors = [_start_node_actor(config, n, scheduler_state_dir) for n in nodes]
        ray.get([a.summary.remote() for a in actors])
        queue = start_global_queue([n.name for n in nodes], policy=config.policy,
                                   estimator=config.estimator, time_scale=config.time_scale,
                                   state_dir=scheduler_state_dir, generation=generation,
                                   allowed_roots=config.allowed_roots,
                                   autoscaled_node_types=worker_node_types(config) if elastic else ())
        ray.get(queue.status.remote())
        if elastic:
            from hier_sched.front.node_watcher import start_node_watcher

            start_node_watcher(_node_actor_options(config, scheduler_state_dir),
                               config.node_specs[0][0])
    except BaseException:
        detach_scheduler()  # all of them are ours: none ran before
        raise
    return nodes


def _start_node_actor(config: ClusterConfig, node: RayNode, scheduler_state_dir: str):
    from node_actor.actor import start_node_actor

    kind, gpus = config.node_spec(node.name)
    return start_node_actor(node.name, node.node_id, gpu_type=kind, gpus=gpus,
                            ray_resources="declared" if node.declared else "none",
                            **_node_actor_options(config, scheduler_state_dir))


def _node_actor_options(config: ClusterConfig, scheduler_state_dir: str) -> dict[str, Any]:
    """What every node actor of this cluster gets, whatever its node."""
    return dict(backend=config.backend, time_scale=config.time_scale, policy=config.policy, sharing=config.sharing,
                state_dir=scheduler_state_dir, use_mps_daemon=config.mps_daemon)


def rejoin_local_node(directory: Path, index: int, timeout_s: float = 120.0) -> str:
    """Bring worker node ``index`` of the local cluster ``up`` started in ``directory`` back after
    it died (``kill_local_node``): its Ray node, then its node actor under the same name (the
    global queue finds it by name and takes the node back). Returns the node's name. For the
    chaos benchmark and failure tests."""
    record, config = _local_record(directory)
    name = f"{SCHEDULER_NODE_PREFIX}{index}"
    connect_ray(record.address, "recorded by `up`", "rejoin a node")
    gone = _end_node_actor(name)
    local = restart_local_node(record.local_ray, config, record.address, index)
    write_record(replace(record, local_ray=local), directory)
    _start_node_actor_again(record, config, name, gone, timeout_s)
    return name


def restart_head(directory: Path, timeout_s: float = 120.0) -> float:
    """Kill the head of the local cluster ``up`` started in ``directory`` and start it again
    (``restart_local_head``; the workers live through it only under GCS fault tolerance). The
    global queue, placed on whichever node is the head (``ON_THE_HEAD``), is restarted there by
    Ray and rebuilt from its log; the head's node actor is started again. Returns the seconds
    until the queue answered again. For the chaos benchmark and failure tests."""
    import ray

    record, config = _local_record(directory)
    name = f"{SCHEDULER_NODE_PREFIX}0"
    connect_ray(record.address, "recorded by `up`", "restart the head")
    gone = {n.node_id for n in ray_nodes() if n.name == name}
    disconnect(force=True)  # a driver whose head dies goes down with it
    t0 = time.monotonic()
    local = restart_local_head(record.local_ray, config, Path(record.state_dir) / "nodes" / name,
                               int((record.dashboard_url or ":8265").rsplit(":", 1)[1]))
    write_record(replace(record, local_ray=local), directory)
    connect_ray(record.address, "recorded by `up`", "restart the head")
    try:
        _end_node_actor(name)
        _start_node_actor_again(record, config, name, gone, timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get(ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE).status.remote(), timeout=5)
                return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - restarting, rebuilding from its log
                if time.monotonic() > deadline:
                    raise DeployError(f"the global queue did not answer within {timeout_s:.0f} s of the head's restart")
                time.sleep(0.5)
    finally:
        # No connection is left behind: Ray ends a driver whose cluster has been gone for a minute,
        # and the caller's process (a test run, say) outlives the cluster stopped by someone else.
        disconnect(force=True)


def _local_record(directory: Path) -> tuple[ClusterRecord, ClusterConfig]:
    record = read_record(directory)
    if record is None or record.local_ray is None:
        raise DeployError(f"no local cluster started by `up` is recorded in {directory}")
    return record, ClusterConfig(**record.config)


def _end_node_actor(name: str) -> set[str]:
    """End a dead node's actor for good (pinned to a Ray node that is gone, it could never run
    again, and it holds the name); the Ray node ids that carried the node's name (Ray may not
    have noticed the death yet)."""
    import ray

    from hier_sched.common.actor_names import node_actor_name

    try:
        ray.kill(ray.get_actor(node_actor_name(name), namespace=NAMESPACE), no_restart=True)
    except ValueError:  # already gone
        pass
    return {n.node_id for n in ray_nodes() if n.name == name}


def _start_node_actor_again(record: ClusterRecord, config: ClusterConfig, name: str, gone: set[str],
                            timeout_s: float) -> None:
    """Once node ``name`` is back on a new Ray node, its node actor under the same name."""
    import ray

    from hier_sched.common.actor_names import node_actor_name

    deadline = time.time() + timeout_s
    while (node := next((n for n in ray_nodes() if n.name == name and n.node_id not in gone), None)) is None \
            or _named(node_actor_name(name)):
        if time.time() > deadline:
            raise DeployError(f"{name} did not rejoin within {timeout_s:.0f} s")
        time.sleep(0.2)
    ray.get(_start_node_actor(config, node, record.state_dir).summary.remote(), timeout=timeout_s)


def _named(actor_name: str) -> bool:
    import ray

    try:
        ray.get_actor(actor_name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _generation() -> str:
    """Each `up` starts a new queue: it survives restarts of its actor (Ray passes the same
    directory again), and `down` ends it; earlier generations stay on disk for inspection."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def scheduler_job_id(generation: str) -> str:
    """The Ray Job (submission id) whose driver owns the scheduler's actors (``control``)."""
    return f"hier_sched-{generation}"


def _submit_scheduler_job(config: ClusterConfig, scheduler_state_dir: str, address: str, dashboard: str, *,
                          local: bool, timeout_s: float = 120.0) -> str:
    """Submit the scheduler's Ray job and wait until its driver has started the actors; returns
    its submission id. Its entrypoint runs on the head: this Python when ``up`` started the
    cluster here, else ``python`` on the head's PATH (which must import hier_sched, as for the
    actors themselves)."""
    from ray.job_submission import JobSubmissionClient

    generation = _generation()
    job_id = scheduler_job_id(generation)
    python = sys.executable if local else "python"
    client = JobSubmissionClient(dashboard)
    client.submit_job(
        entrypoint=shlex.join([python, "-m", "hier_sched.front.control", "--address", address,
                               "--config", json.dumps(asdict(config)),
                               "--state-dir", scheduler_state_dir, "--generation", generation]),
        submission_id=job_id, entrypoint_num_cpus=0,
        metadata={"hier_sched": "scheduler", "generation": generation, "state_dir": scheduler_state_dir})
    deadline = time.time() + timeout_s
    while READY not in (logs := client.get_job_logs(job_id)):
        status = client.get_job_status(job_id)
        if status.is_terminal() or time.time() > deadline:
            if not status.is_terminal():
                client.stop_job(job_id)
            said = "ended " + str(status) if status.is_terminal() else f"was not ready within {timeout_s:.0f} s"
            raise DeployError(f"the scheduler's Ray job {job_id} {said}; its log ends:\n{logs[-2000:]}")
        time.sleep(0.3)
    return job_id


def _end_scheduler_job(dashboard: str, job_id: str, timeout_s: float = 10.0) -> None:
    """The scheduler's Ray job ends by itself once its queue is gone; stopped after ``timeout_s``."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    deadline = time.time() + timeout_s
    while not client.get_job_status(job_id).is_terminal():
        if time.time() > deadline:
            client.stop_job(job_id)
            return
        time.sleep(0.5)


def detach_scheduler(timeout_s: float = 20.0) -> int:
    """Stop the scheduler's actors on the cluster this process is a driver of: the queue's loop
    first (nothing new launches), then every node's running jobs; returns how many actors."""
    import ray

    handles = {}
    for name in _our_actors():
        try:
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # died in between
            continue
    if WATCHER_NAME in handles:  # first: it starts no node actor after the list above was made
        ray.kill(handles.pop(WATCHER_NAME), no_restart=True)
    try:
        if GLOBAL_NAME in handles:  # every job that has not ended is cancelled, in the log too: a queue
            ray.get(handles[GLOBAL_NAME].drain.remote(), timeout=timeout_s)  # rebuilt from it runs none again
    except Exception as exc:  # noqa: BLE001 - stopping goes on whatever the queue says
        print(f"warning: draining the queue: {type(exc).__name__}: {exc}", file=sys.stderr)
    calls = [h.stop.remote() if name == GLOBAL_NAME else h.shutdown.remote() for name, h in handles.items()]
    try:
        ray.get(calls, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - stopping goes on whatever an actor says
        print(f"warning: stopping the scheduler's actors: {type(exc).__name__}: {exc}", file=sys.stderr)
    for handle in handles.values():
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    return len(handles)


def start_cluster(config: ClusterConfig, *, directory: Path | None = None,
                  scheduler_state_dir: Path | None = None) -> ClusterRecord:
    """``up``: returns the record it wrote to ``directory`` (default: the state directory).
    ``scheduler_state_dir``: the actors' state directory on the cluster's nodes (default: the same)."""
    directory = Path(directory or state_dir()).expanduser().resolve()
    actors_dir = Path(scheduler_state_dir or directory).expanduser().resolve()
    previous = read_record(directory)
    if previous is not None and previous.local_ray is not None and local_ray_alive(previous.local_ray):
        raise DeployError(f"the cluster `up` started from {directory} still runs (Ray at {previous.address}); "
                          "`hier-sched down` first")
    started = time.time()
    local = None
    try:
        if config.address is None:
            local, address, dashboard = start_local_ray(config)
            # noted at once: should this process die before the end, `down` still finds the Ray it started
            write_record(ClusterRecord(address, str(actors_dir), dashboard, local, asdict(config)), directory)
            connect_ray(address, "the local cluster `up` started", "hier-sched up")
            wait_for_nodes(config.nodes)
        else:
            if "://" not in config.address and not gcs_answers(config.address):
                raise DeployError(f"no Ray cluster answers at --address {config.address}; start one "
                                  "(`ray start --head`) or give the head's HOST:PORT that it printed")
            address = connect_ray(config.address, "--address", "hier-sched up")
            dashboard = dashboard_url()
        if dashboard is not None:
            scheduler_job = _submit_scheduler_job(config, str(actors_dir), address, dashboard, local=local is not None)
        else:
            print("warning: this Ray cluster runs no dashboard, so no Ray job can be submitted: the scheduler's "
                  "actors are started by this process, and Ray marks their jobs' tasks FAILED once it exits "
                  "(hier_sched's own states stay right)", file=sys.stderr)
            scheduler_job = None
            attach_scheduler(config, str(actors_dir), _generation())
    except BaseException:
        if local is not None:
            disconnect()
            stop_local_ray(local)
            remove_record(directory)
        raise
    record = ClusterRecord(address=address, state_dir=str(actors_dir), dashboard_url=dashboard, local_ray=local,
                           config=asdict(config), ready_s=round(time.time() - started, 1), scheduler_job=scheduler_job)
    write_record(record, directory)
    return record


def stop_cluster(directory: Path | None = None, *, fallback_address: str | None = None) -> str | None:
    """``down``: stop what ``up`` recorded in ``directory``; without a record, the scheduler on
    the cluster at ``fallback_address`` (``down`` passes RAY_ADDRESS). Never "auto": ``down``
    must not stop someone else's scheduler that happens to run on this machine. Returns what
    was done; None: there was nothing to stop."""
    directory = Path(directory or state_dir()).expanduser()
    record = read_record(directory)
    target = record.address if record is not None else fallback_address
    if target is None:
        return None
    done = []
    if "://" in target or gcs_answers(target):
        try:
            connect_ray(target, "recorded by `up`" if record else "given", "hier-sched down")
            done.append(f"{detach_scheduler()} scheduler actor(s) stopped")
            if record is not None and record.local_ray is None and record.scheduler_job and record.dashboard_url:
                _end_scheduler_job(record.dashboard_url, record.scheduler_job)  # Ray outlives it: ends well
        except SchedulerUnavailable as exc:
            print(f"warning: {exc}", file=sys.stderr)
        finally:
            disconnect()
    if record is not None and record.local_ray is not None:
        done.append(f"{stop_local_ray(record.local_ray)} Ray process(es) of the local cluster ended")
    if record is not None:
        remove_record(directory)
    return "; ".join(done) or f"nothing of hier_sched ran at {target}"
