"""Replays of a cluster shared by tenants: each tenant alone on its quota (what its finish-time
fairness compares with), and the three ways of sharing the cluster compared.

* **Quotas** are the ``--queues`` file's nominal GPUs when one is given, else the tenant trace's
  own (``Trace.tenant_gpus``: ``philly-vc:``, ``helios-vc:``).
* **Alone.** Each tenant's jobs are replayed by themselves, with the same policy, estimator and
  sharing, on a cluster of its quota's GPUs, or of its widest job's where that is wider (else the
  job could never run): whole nodes of the shared cluster's node size and first GPU type, the rest
  on one smaller node. No queues there: the tenant has the cluster to itself.
* **The three ways** (``compare_tenants``): FIFO (no queues: the scheduler's one queue, as today);
  strict quotas (each tenant's queue its quota, borrowing limit 0); quotas with borrowing (no
  borrowing limit), fair share and reclaim up to it, checkpoint first (the core's team queues,
  with the ``--queues`` file's fair-sharing settings when one is given).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

from hier_sched.core.quotas import QueueSetup
from replay.metrics import ReplayResult
from replay.run import ReplayOptions, run_replay, shape_for
from replay.tenant_metrics import jcts
from traces.schema import Trace
from traces.tenants import tenant_queues

__all__ = ["tenant_quotas", "alone_jcts", "SharingWay", "SHARING_WAYS", "compare_tenants"]

# (label, jobs) -> a progress bar for one replay: a context yielding ``replay.run``'s progress callback
Bar = Callable[[str, int], AbstractContextManager[Callable[[int, int], None] | None]]


def _no_bar(label: str, jobs: int) -> AbstractContextManager[None]:
    return nullcontext()


def tenant_quotas(trace: Trace, opts: ReplayOptions) -> dict[str, int]:
    """Tenant -> its quota in GPUs: the queue file's nominal quotas, else the trace's ({}: none)."""
    if opts.queues is not None:
        return {q.name: int(q.nominal_gpus or 0) for q in opts.queues.queues}
    return dict(trace.tenant_gpus)


def _alone_groups(gpus: int, node_gpus: int, gpu_type: str) -> tuple[tuple[str, int, int], ...]:
    """``gpus`` GPUs as node groups (type, count, GPUs each): whole nodes, then the rest."""
    full, rest = divmod(gpus, node_gpus)
    return tuple(group for group in ((gpu_type, full, node_gpus), (gpu_type, 1, rest)) if group[1] and group[2])


def alone_jcts(trace: Trace, opts: ReplayOptions, quotas: Mapping[str, int], bar: Bar = _no_bar) -> dict[str, float]:
    """Job id -> its JCT when its tenant runs alone on its quota; tenants without a quota (and
    jobs that do not complete alone) are left out."""
    if opts.jitter_s:  # the very arrivals of the shared replay (the same seed jitters them alike)
        trace = trace.with_jittered_arrivals(opts.jitter_s, opts.seed)
    _, node_gpus, gpu_type = shape_for(trace, opts).nodes[0]
    by_tenant = defaultdict(list)
    for job in trace.jobs:
        if job.user in quotas:
            by_tenant[job.user].append(job)
    result: dict[str, float] = {}
    for tenant, jobs in by_tenant.items():
        gpus = max(quotas[tenant], max(j.gpus for j in jobs))
        alone = replace(opts, nodes=None, gpus_per_node=None, gpu_type=None, queues=None, jitter_s=0.0,
                        node_groups=_alone_groups(gpus, node_gpus, gpu_type))
        label = f"{tenant} alone on {gpus} GPUs"
        tenant_trace = replace(trace, name=f"{trace.name} [{label}]", jobs=jobs, cluster=None)
        with bar(label, len(jobs)) as update:
            _, sim = run_replay(tenant_trace, alone, progress=update)
        result.update(jcts(sim.jobs.values()))
    return result


@dataclass(frozen=True, slots=True)
class SharingWay:
    label: str
    quotas: bool  # queues with the tenants' quotas
    borrowing: bool  # and they may borrow idle GPUs (reclaimed, checkpoint first)


SHARING_WAYS = (
    SharingWay("FIFO", quotas=False, borrowing=False),
    SharingWay("strict quotas", quotas=True, borrowing=False),
    SharingWay("fair share + reclaim", quotas=True, borrowing=True),
)


def compare_tenants(trace: Trace, opts: ReplayOptions, bar: Bar = _no_bar) -> list[tuple[str, ReplayResult]]:
    """The trace replayed each of the ``SHARING_WAYS`` (label, result), every result with the
    tenants' ``rho`` against one set of alone replays. Raises ``ValueError`` when no quota is known."""
    quotas = tenant_quotas(trace, opts)
    if not quotas:
        raise ValueError(f"{trace.name} names no tenant quotas: give a tenant trace (philly-vc:, helios-vc:) "
                         "or --queues")
    alone = alone_jcts(trace, opts, quotas, bar)
    rows = []
    settings = opts.queues or QueueSetup()
    for way in SHARING_WAYS:
        queues = replace(settings, queues=tenant_queues(quotas, borrowing=way.borrowing)) if way.quotas else None
        with bar(way.label, len(trace.jobs)) as update:
            result, _ = run_replay(trace, replace(opts, queues=queues), alone_jct=alone, progress=update)
        rows.append((way.label, result))
    return rows
