"""Per-tenant figures of a finished replay, with Themis' finish-time fairness.

A tenant is a job's ``user`` (in a tenant trace, its team; with ``--queues``, its queue).

* ``gpu_hours``: the GPU-time its runs held, every run counted (one preempted or crashed too), in
  whole GPUs as quotas count them: a job that shares a GPU with another still holds that GPU.
* ``mean_wait_s`` / ``p95_wait_s``: over its completed jobs, each job's JCT less its run time (a
  requeued job's later waits count too), as the replay's ``avg_wait_s``.
* ``rho`` (Themis' finish-time fairness): the tenant's JCT in the shared cluster over its JCT alone
  on its quota, as the ratio of its mean JCTs: the sum of its jobs' JCTs here over the sum of the
  same jobs' JCTs alone (jobs completed in both). Not the mean of per-job ratios: a 2-minute job
  that waits an hour would weigh 30 there, as much as thirty week-long jobs that waited nothing; the
  ratio of means is the tenant's total time in the system, which is what its team waits through,
  and it stays defined when a few jobs are tiny. ``rho`` > 1: the tenant would have done better
  alone on its quota; < 1: sharing (borrowing idle GPUs) helped it. None where its alone JCTs are
  not known (no quota).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from replay.world import SimJob

__all__ = ["TenantFigures", "tenant_figures", "max_rho", "jcts"]


@dataclass(frozen=True, slots=True)
class TenantFigures:
    jobs: int  # completed
    gpu_hours: float
    mean_wait_s: float
    p95_wait_s: float
    rho: float | None

    def to_json(self) -> dict:
        return asdict(self)


def jcts(jobs: Iterable[SimJob]) -> dict[str, float]:
    """Job id -> JCT of every completed job."""
    return {j.trace.job_id: j.end_s - j.trace.submit_s for j in jobs if j.state == "done"}


def tenant_figures(jobs: Iterable[SimJob], alone_jct: Mapping[str, float] | None = None) -> dict[str, TenantFigures]:
    """Tenant -> its figures, tenants in name order; ``alone_jct``: job id -> its JCT alone on its
    tenant's quota (None: no ``rho``)."""
    by_tenant: dict[str, list[SimJob]] = defaultdict(list)
    for job in jobs:
        by_tenant[job.trace.user].append(job)
    figures = {}
    for tenant in sorted(by_tenant):
        tenant_jobs = by_tenant[tenant]
        done = [j for j in tenant_jobs if j.state == "done"]
        waits = np.array([j.end_s - j.trace.submit_s - j.exec_s for j in done])
        figures[tenant] = TenantFigures(
            jobs=len(done),
            gpu_hours=sum(j.trace.gpus * j.exec_s for j in tenant_jobs) / 3600,
            mean_wait_s=float(waits.mean()) if waits.size else 0.0,
            p95_wait_s=float(np.percentile(waits, 95)) if waits.size else 0.0,
            rho=_rho(done, alone_jct) if alone_jct is not None else None,
        )
    return figures


def _rho(done: list[SimJob], alone_jct: Mapping[str, float]) -> float | None:
    both = [j for j in done if j.trace.job_id in alone_jct]
    alone = sum(alone_jct[j.trace.job_id] for j in both)
    if not both or alone <= 0:
        return None
    return sum(j.end_s - j.trace.submit_s for j in both) / alone


def max_rho(figures: Mapping[str, TenantFigures]) -> float | None:
    """The worst-treated tenant's ``rho`` (None when no tenant has one)."""
    return max((f.rho for f in figures.values() if f.rho is not None), default=None)
