"""``hier-sched bench control-plane``: the live global queue against many nodes.

The real ``GlobalQueue`` actor, on a local Ray cluster this command starts (and ends), reaches
``--nodes`` simulated nodes (``simulated_nodes.SimulatedNodes``, ``--nodes-per-host`` of them
in each actor process: a thousand node actors would be a thousand Ray worker processes) through
the same ``RayNodeSet`` and the same messages as real node actors. ``--queued`` jobs are
submitted in batches (``submit_many``) from this driver as fast as the queue acknowledges
them; each one holds memory on one GPU for an emulated ``duration_s`` and ends. Figures:

* ``submit_p50_ms`` / ``submit_p99_ms``: one ``submit_many`` call of ``batch`` jobs, from the call
  to every job durable and acknowledged;
* ``tick_p50_ms`` / ``tick_p99_ms``: the queue's ticks while the jobs run (gather every node's
  answer, log, decide, launch, stop);
* ``launch_p99_ms``: from the core's decision to the last node of the launch having started its
  order, by the clock in that node's report (each launched job counted once);
* ``queue_cpu_share`` (of one core) and ``queue_rss_mib`` (the most seen) of the queue's process;
* ``jobs_per_s``: jobs ended per second, from the first submission to the last job's end;
* ``lost``: jobs that did not succeed; ``duplicated``: jobs a node was ordered to start more than once.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ControlPlaneConfig", "bench_control_plane"]


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    nodes: int = 100
    gpus_per_node: int = 8
    queued: int = 10_000
    batch: int = 100  # jobs per submit_many call
    nodes_per_host: int = 100  # simulated nodes per actor process
    job_mib: float = 10_000.0  # each job's memory on its GPU: four share an A100-40GB
    duration_s: float = 2_000.0  # each job's run, in emulated seconds
    time_scale: float = 0.001  # wall seconds per emulated second: a job runs 2 s
    timeout_s: float = 3_600.0


def bench_control_plane(config: ControlPlaneConfig) -> dict[str, Any]:
    import psutil
    import ray

    from global_queue.actor import GlobalQueue
    from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE
    from hier_sched.front.bench.simulated_nodes import SimulatedNodes

    temp = tempfile.mkdtemp(prefix="hscp-")  # short: Ray's socket paths must stay below 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, _temp_dir=temp, log_to_driver=False)
    try:
        names = [f"sim{i:05d}" for i in range(config.nodes)]
        hosts: dict[str, str] = {}
        actors = []
        for first in range(0, config.nodes, config.nodes_per_host):
            group, host = names[first:first + config.nodes_per_host], f"hier_sched:simulated:{first}"
            actors.append(SimulatedNodes.options(name=host).remote(group, gpus=config.gpus_per_node,
                                                                   time_scale=config.time_scale))
            hosts.update(dict.fromkeys(group, host))
        ray.get([a.launch_counts.remote() for a in actors])
        started = time.perf_counter()
        queue = GlobalQueue.options(name=GLOBAL_NAME).remote(
            names, state_dir=os.path.join(temp, "state"), node_hosts=hosts, time_scale=config.time_scale,
            estimator="none", node_timeout_s=3_600.0)
        process = psutil.Process(ray.get(queue.__ray_call__.remote(lambda actor: os.getpid())))
        ready_s = time.perf_counter() - started
        result = _run(config, queue, process, ray)
        result["launches"] = Counter()
        for counts in ray.get([a.launch_counts.remote() for a in actors]):
            result["launches"].update(counts)
        ray.get(queue.stop.remote())
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    launches = result.pop("launches")
    states = result.pop("states")
    return {**asdict(config), "gpus": config.nodes * config.gpus_per_node, "queue_ready_s": round(ready_s, 2),
            **result, "states": dict(Counter(states.values())),
            "lost": sum(1 for s in states.values() if s != "succeeded"),
            "duplicated": sum(1 for job in states if launches.get(job, 0) > 1)}


def _run(config: ControlPlaneConfig, queue: Any, process: Any, ray: Any) -> dict[str, Any]:
    spec = {"name": "cp", "gpus": 1, "memory_mib": config.job_mib, "estimator": "none",
            "emulation": {"peak_mib": config.job_mib, "duration_s": config.duration_s}}
    ray.get(queue.__ray_call__.remote(_clear))
    cpu_before = _cpu(process)
    rss = process.memory_info().rss
    started = time.perf_counter()
    submit_s: list[float] = []
    jobs: list[str] = []
    refused: list[str] = []
    for first in range(0, config.queued, config.batch):
        count = min(config.batch, config.queued - first)
        called = time.perf_counter()
        answers = ray.get(queue.submit_many.remote([spec] * count))
        submit_s.append(time.perf_counter() - called)
        jobs += [a["job_id"] for a in answers if "job_id" in a]
        refused += [a["error"] for a in answers if "error" in a]
        rss = max(rss, process.memory_info().rss)
    submitted_s = time.perf_counter() - started
    deadline = time.monotonic() + config.timeout_s
    while time.monotonic() < deadline:
        ended = ray.get(queue.__ray_call__.remote(_ended))
        rss = max(rss, process.memory_info().rss)
        if ended >= len(jobs):
            break
        time.sleep(0.5)
    wall_s = time.perf_counter() - started
    cpu_s = _cpu(process) - cpu_before
    ticks, launches = ray.get(queue.__ray_call__.remote(_timings))
    states = ray.get(queue.states.remote(jobs))
    launch_each = [s for s, count in launches for _ in range(count)]
    return {"submit_p50_ms": _ms(statistics.median(submit_s)), "submit_p99_ms": _ms(_p99(submit_s)),
            "submitted_s": round(submitted_s, 2), "submit_jobs_per_s": round(len(jobs) / submitted_s, 1),
            "refused": len(refused), "refusals": refused[:3],
            "tick_p50_ms": _ms(statistics.median(ticks)), "tick_p99_ms": _ms(_p99(ticks)),
            "tick_max_ms": _ms(max(ticks)), "ticks": len(ticks),
            "launch_p50_ms": _ms(statistics.median(launch_each)) if launch_each else None,
            "launch_p99_ms": _ms(_p99(launch_each)) if launch_each else None,
            "queue_cpu_share": round(cpu_s / wall_s, 3), "queue_rss_mib": round(rss / 2**20, 1),
            "wall_s": round(wall_s, 2), "jobs_per_s": round(len(jobs) / wall_s, 1), "states": states}


def _clear(actor: Any) -> None:
    """In the queue's process: forget the ticks and launches before the run."""
    actor.tick_seconds.clear()
    actor.service.launch_seconds.clear()


def _ended(actor: Any) -> int:
    """In the queue's process: how many jobs have ended."""
    with actor.service.lock:
        return actor.service.scheduler.counts().ended


def _timings(actor: Any) -> tuple[list[float], list[tuple[float, int]]]:
    """In the queue's process: each tick's wall seconds, and each launch round's (seconds, jobs)."""
    return list(actor.tick_seconds), list(actor.service.launch_seconds)


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)
