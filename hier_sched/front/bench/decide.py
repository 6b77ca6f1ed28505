"""How long the core takes to decide, at scale: ``hier-sched bench decide``.

One *decision* is one ``Scheduler.step`` that plans: something changed (a run ended or allocated
its memory, a job arrived, a GPU's post-launch grace or monitoring window settled), the shell
hands the core the event(s) and the cluster's snapshots, and the step returns the commands —
the launches of whatever now fits, often none. Its time is the latency from the event to the
command: the delay an operator sees between a GPU freeing up and the next job being sent there.
Each step considers the whole queue (its order, the head, backfilling, holds), so its cost is
what grows with the queue and the cluster.

The state is a saturated cluster in steady state, driven by the simulator (the shell the
replays use, so GPU snapshots, monitoring windows, the post-launch grace and learned run times
are the real ones): ``queued`` jobs wait from the start and every job launched is replaced by a
new arrival, so the queue stays at ``queued`` while the GPUs stay partly occupied. Jobs come
from the synthetic Philly-shaped trace (``traces.synthetic``): Philly run times and GPU counts
(68.7 % 1 GPU, the rest 2-8 GPUs and multi-node gangs), peak memory and utilization of the carma
workloads, with oracle estimates. Steps during the first ``warmup_s`` simulated seconds (the
initial fill, windows filling) are not counted.

What is timed: the step's CPU time on its thread (``time.thread_time``); on a machine shared with
other work, wall time mostly measures the other processes, on an idle machine the two agree (both
are reported). The step reads node snapshots from the cluster index as the live queue does: there
they are the nodes' last reports, kept as they arrive. The simulator would build them on demand
from its device model and monitoring windows (the nodes' own work, live); here it builds every
node's snapshot just before each step, untimed, and the step reads them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import Event, Launch
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueQuota, QueueSetup
from hier_sched.core.scheduler import StepResult
from replay.cluster import ClusterShape
from replay.engine import Simulator
from replay.estimates import estimator_for
from traces.gang import gpus_per_node_for
from traces.schema import Trace
from traces.synthetic import NODE_GPUS, load_synthetic

__all__ = ["DECISION", "bench_decide"]

DECISION = ("one Scheduler.step that plans: event(s) in (a run ended or allocated, a job arrived, a GPU's grace "
            "or monitoring window settled), the nodes' latest snapshots given, launch commands out; {queued} jobs "
            "queued on {gpus} GPUs, steady state after {warmup:.0f} simulated s; the step's CPU time")


def _jobs(gpus: int, nodes_of: int, count: int, seed: int) -> Trace:
    """Philly-shaped jobs with carma workloads; gangs reshaped for ``nodes_of``-GPU nodes."""
    trace = load_synthetic(f"philly?jobs={count}&gpus={gpus}&seed={seed}")
    if nodes_of != NODE_GPUS:
        trace.jobs = [replace(j, gpus_per_node=gpus_per_node_for(j.gpus, nodes_of)) for j in trace.jobs]
    return trace


def bench_decide(*, gpus: int = 1000, queued: int = 10_000, nodes_of: int = 8, policy: str = "auto",
                 repeat: int = 2000, warmup_s: float = 1800.0, seed: int = 0,
                 gpu_types: tuple[str, ...] = (), team_queues: int = 0) -> dict:
    """Time ``repeat`` decisions; returns the figures ``hier-sched bench decide --json`` prints.
    ``gpu_types``: the nodes' types in turn (a mixed cluster); none: all A100-40GB.
    ``team_queues``: the jobs go in turn to that many team queues, each nominal an equal part of
    the GPUs, free to borrow (fair share and reclaim at work); 0: no queues."""
    if gpus < nodes_of or gpus % nodes_of:
        raise ValueError(f"--gpus must be a multiple of --nodes-of (got {gpus} and {nodes_of})")
    if queued < 1 or repeat < 1:
        raise ValueError(f"--queued and --repeat must be >= 1 (got {queued} and {repeat})")
    shape = ClusterShape.uniform(gpus // nodes_of, nodes_of)
    if gpu_types:
        shape = replace(shape, nodes=tuple((name, count, gpu_types[i % len(gpu_types)])
                                           for i, (name, count, _) in enumerate(shape.nodes)))
    # Enough jobs for the queue, a full cluster (several per GPU when collocated) and the
    # replacements of every launch while measuring.
    supply = _jobs(gpus, nodes_of, queued + 8 * gpus + 4 * repeat, seed)
    queues = None
    if team_queues:
        supply.jobs = [replace(j, user=f"team-{i % team_queues}") for i, j in enumerate(supply.jobs)]
        queues = QueueSetup(tuple(QueueQuota(f"team-{i}", gpus // team_queues) for i in range(team_queues)))
    refill = iter(supply.jobs[queued:])
    start = replace(supply, jobs=[replace(j, submit_s=0.0) for j in supply.jobs[:queued]])
    sim = Simulator(start, shape, preset(policy), estimator_for("oracle"), queues=queues)

    # The probe around the scheduler's step: the nodes' snapshots built first (untimed), the step
    # timed, and every job it launched replaced by a new arrival.
    index = sim.cluster.index
    build_snapshot = index.gpus
    cpu_ms: list[float] = []
    wall_ms: list[float] = []
    snapshot_ms: list[float] = []
    launches: list[int] = []
    exhausted = False
    scheduler_step = sim.scheduler.step

    def timed_step(events: Iterable[Event], cluster: ClusterIndex | None, now_s: float) -> StepResult:
        nonlocal exhausted
        timed = cluster is not None and now_s >= warmup_s and len(cpu_ms) < repeat
        w0 = time.perf_counter()
        if timed:
            index.gpus = {n: build_snapshot(n) for n in index.names}.__getitem__  # type: ignore[method-assign]
        else:  # the warm-up: snapshots built on demand
            index.gpus = build_snapshot  # type: ignore[method-assign]
        snapshots = time.perf_counter() - w0
        c0, w0 = time.thread_time(), time.perf_counter()
        result = scheduler_step(events, cluster, now_s)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        launched = sum(1 for c in result.commands if type(c) is Launch)
        for _ in range(launched):  # each launched job is replaced: the queue stays full
            tj = next(refill, None)
            if tj is None:
                exhausted = True
                sim.stop()
                break
            sim.add_job(replace(tj, submit_s=now_s))
        if timed and result.planned:
            cpu_ms.append(cpu * 1e3)
            wall_ms.append(wall * 1e3)
            snapshot_ms.append(snapshots * 1e3)
            launches.append(launched)
            if len(cpu_ms) == repeat:
                sim.stop()
        return result

    sim.scheduler.step = timed_step  # type: ignore[method-assign]
    wall0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - wall0
    if not cpu_ms:
        raise RuntimeError("no decision was measured: the job supply ran out during the warm-up")

    def pct(values: list[float], q: float) -> float:
        return round(float(np.percentile(values, q)), 4)

    return {
        "p50_ms": pct(cpu_ms, 50),
        "p99_ms": pct(cpu_ms, 99),
        "max_ms": round(max(cpu_ms), 4),
        "wall_p50_ms": pct(wall_ms, 50),
        "wall_p99_ms": pct(wall_ms, 99),
        "snapshots_built_p50_ms": pct(snapshot_ms, 50),
        "decisions": len(cpu_ms),
        "launches": sum(launches),
        "decisions_with_launch": sum(1 for n in launches if n),
        "gpus": gpus,
        "nodes": len(shape.nodes),
        "queued": queued,
        "jobs_running": sum(1 for j in sim.jobs.values() if j.state in ("running", "checkpointing")),
        "gpus_busy": sum(1 for g in sim.cluster.all_gpus() if g.device.residents),
        "policy": policy,
        "seed": seed,
        "simulated_s": round(sim.now, 1),
        "wall_s": round(wall, 1),
        "supply_exhausted": exhausted,
        "what": DECISION.format(queued=queued, gpus=gpus, warmup=warmup_s),
    }
