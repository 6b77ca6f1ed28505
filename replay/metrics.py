"""The thesis' metrics (Ch. 6.3.4) computed from a finished simulation, and a shared cluster's.

Total trace time (makespan) runs from the first submission to the last completion; waiting is
JCT minus the time spent running (so a recovered job's second wait counts too); energy
integrates every GPU's power over the makespan, idle GPUs included — as DCGM's energy counter
would on the real server.

For a cluster shared by tenants (``replay.tenant_metrics`` has the per-tenant figures):

* ``utilization``: the GPUs' busy time over their time available, GPUs x makespan. A GPU is busy
  while at least one job is on it, however many share it: collocation makes a GPU busy, never
  more than busy, so the figure stays within [0, 1] and compares runs that share GPUs with runs
  that do not.
* ``preemption_lost_gpu_hours``: work thrown away by preemption, the GPU-time of each run that
  got the checkpoint signal (a quota reclaim, a slot's end) and was stopped before its checkpoint
  was written, since that run began (a simulated job checkpoints only when signalled, so its run
  began at its last checkpoint). A run that saves in time loses nothing: the simulator lets it
  train until it exits (``CHECKPOINT_S`` after the signal) and resumes it from there at full speed,
  with no restart cost.
* ``preemption_saving_gpu_hours``: the GPU-time of signalled runs from the signal to their exit.
  The simulator counts it as training; a real job spends part of it writing its checkpoint, so
  lost plus saving bounds what preemption costs were saving pure overhead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from replay.tenant_metrics import max_rho, tenant_figures

__all__ = ["ReplayResult", "summarize"]


@dataclass(slots=True)
class ReplayResult:
    trace: str
    policy: str
    estimator: str
    sharing: str
    nodes: int
    gpus: int
    jobs: int
    completed: int
    failed: int
    unschedulable: int
    makespan_s: float
    avg_wait_s: float
    avg_exec_s: float
    avg_jct_s: float
    p95_jct_s: float
    p95_wait_s: float
    oom_crashes: int
    recovered: int
    checkpoints: int
    energy_mj: float
    avg_smact: float
    avg_power_w: float
    sim_wall_s: float
    events: int
    events_per_s: float
    cycles: int
    seed: int = 0
    utilization: float = 0.0
    preemptions: int = 0
    preemption_lost_gpu_hours: float = 0.0
    preemption_saving_gpu_hours: float = 0.0
    tenants: dict[str, dict] = field(default_factory=dict)  # tenant -> ``TenantFigures`` as JSON
    max_rho: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def summarize(sim, *, trace_name: str, policy: str, estimator: str, sharing: str, wall_s: float, seed: int,
              alone_jct: Mapping[str, float] | None = None) -> ReplayResult:
    """``alone_jct``: job id -> its JCT alone on its tenant's quota, for the tenants' ``rho``."""
    jobs = list(sim.jobs.values())
    done = [j for j in jobs if j.state == "done"]
    submits = [j.trace.submit_s for j in jobs if j.state != "unschedulable"]
    start = min(submits, default=0.0)
    end = sim.makespan_end
    makespan = max(0.0, end - start)
    jct = np.array([j.end_s - j.trace.submit_s for j in done]) if done else np.zeros(0)
    execs = np.array([j.exec_s for j in done]) if done else np.zeros(0)
    waits = jct - execs
    gpus = list(sim.cluster.all_gpus())
    energy_j = sum(g.energy_j for g in gpus)
    smact_area = sum(g.smact_integral for g in gpus)
    span_gpu_s = makespan * len(gpus)
    tenants = tenant_figures(jobs, alone_jct)

    def mean(a: np.ndarray) -> float:
        return float(a.mean()) if a.size else 0.0

    def p95(a: np.ndarray) -> float:
        return float(np.percentile(a, 95)) if a.size else 0.0

    return ReplayResult(
        trace=trace_name,
        policy=policy,
        estimator=estimator,
        sharing=sharing,
        nodes=len(sim.cluster.gpus),
        gpus=len(gpus),
        jobs=len(jobs),
        completed=len(done),
        failed=sum(1 for j in jobs if j.state == "failed"),
        unschedulable=sum(1 for j in jobs if j.state == "unschedulable"),
        makespan_s=makespan,
        avg_wait_s=mean(waits),
        avg_exec_s=mean(execs),
        avg_jct_s=mean(jct),
        p95_jct_s=p95(jct),
        p95_wait_s=p95(waits),
        oom_crashes=sum(j.oom_crashes for j in jobs),
        recovered=sum(1 for j in done if j.oom_crashes),
        checkpoints=sum(j.checkpoints for j in jobs),
        energy_mj=energy_j / 1e6,
        avg_smact=smact_area / span_gpu_s if span_gpu_s else 0.0,
        avg_power_w=energy_j / span_gpu_s if span_gpu_s else 0.0,
        sim_wall_s=wall_s,
        events=sim.events,
        events_per_s=sim.events / wall_s if wall_s > 0 else 0.0,
        cycles=sim.cycles,
        seed=seed,
        utilization=sum(g.busy_s for g in gpus) / span_gpu_s if span_gpu_s else 0.0,
        preemptions=sum(j.managed.preemptions for j in jobs if j.managed is not None),
        preemption_lost_gpu_hours=sum(j.preemption_lost_gpu_s for j in jobs) / 3600,
        preemption_saving_gpu_hours=sum(j.preemption_saving_gpu_s for j in jobs) / 3600,
        tenants={name: figures.to_json() for name, figures in tenants.items()},
        max_rho=max_rho(tenants),
    )
