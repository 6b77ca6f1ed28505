"""What the tenant traces share (``philly-vc:``, ``helios-vc:``): one cluster shared by teams,
each with its own arrival stream and its own quota.

A tenant trace merges per-tenant job streams into one ``Trace`` whose jobs carry their tenant as
``user`` (a replayed job's queue is its user's) and whose ``tenant_gpus`` are the tenants' quotas,
scaled down to a cluster this machine replays in seconds:

* **Query.** ``<source>:<tenant>,<tenant>,...?start=DAY&days=D&scale=S&jobs=N&seed=K`` (``all``:
  every tenant the source knows). ``start`` and ``days`` choose the window of arrivals, in days
  from the source's time 0 (arrivals are shifted so the window starts at 0); ``scale`` is the
  share of each quota kept; ``jobs`` keeps at most that many jobs per tenant, the first ones. A
  source may know more keys (``helios-vc``'s ``load``).
* **Quotas.** A tenant of G GPUs gets G x ``scale``, rounded to whole 8-GPU nodes from 8 GPUs on
  (every gang of the tenant then fits its quota in whole-node shares) and to at least one GPU below.
* **Jobs wider than their tenant's quota** are narrowed to it with their GPU-time kept (the
  duration grows as the width shrinks: perfect data-parallel scaling, as ``traces.gavel`` assumes
  for widths Gavel did not measure), so strict quotas can run every job and a tenant alone on its
  quota can too.
* **Cluster.** The sum of the quotas, in 8-GPU nodes (the rest on one smaller node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl

from hier_sched.core.quotas import QueueQuota
from traces.gang import gpus_per_node_for
from traces.schema import ClusterHint, Trace, TraceError, TraceJob

__all__ = ["NODE_GPUS", "TenantQuery", "parse_tenant_query", "scaled_quota", "in_window", "narrowed_to_quota",
           "tenant_trace", "tenant_queues", "queues_document"]

NODE_GPUS = 8
_DAY_S = 86400.0
_COMMON_KEYS = ("jobs", "seed")


@dataclass(frozen=True, slots=True)
class TenantQuery:
    source: str
    tenants: tuple[str, ...]
    every_tenant: bool  # the query said ``all``: the name says so too, shorter
    start_day: float
    days: float
    scale: float
    jobs_per_tenant: int | None
    seed: int
    load: float | None  # the source's ``load`` (None: it has none)

    @property
    def window_s(self) -> tuple[float, float]:
        """The arrivals kept, [start, end) in the source's seconds."""
        start = self.start_day * _DAY_S
        return start, start + self.days * _DAY_S

    def name(self, *, seeded: bool) -> str:
        """The trace's name: the query spelt out, defaults included (``seed`` where it matters)."""
        tenants = "all" if self.every_tenant else ",".join(self.tenants)
        query = f"start={self.start_day:g}&days={self.days:g}&scale={self.scale:g}"
        if self.load is not None:
            query += f"&load={self.load:g}"
        if self.jobs_per_tenant is not None:
            query += f"&jobs={self.jobs_per_tenant}"
        if seeded:
            query += f"&seed={self.seed}"
        return f"{self.source}:{tenants}?{query}"


def parse_tenant_query(source: str, rest: str, known: Sequence[str], *, seed: int,
                       defaults: Mapping[str, float]) -> TenantQuery:
    """``rest`` is what follows ``<source>:``; ``defaults`` gives ``start``, ``days``, ``scale`` and
    the source's ``load`` if it has one. A ``seed`` in the query wins over the keyword."""
    names, _, query = rest.partition("?")
    keys = (*defaults, *_COMMON_KEYS)
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in keys:
            raise TraceError(f"{source} trace: unknown parameter {key!r}; known: {', '.join(keys)}")
        params[key] = value
    every = names == "all"
    tenants = tuple(known) if every else tuple(n for n in names.split(",") if n)
    unknown = [t for t in tenants if t not in known]
    if not tenants or unknown:
        raise TraceError(f"{source} trace: unknown tenant(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: all, {', '.join(known)}")
    if len(set(tenants)) != len(tenants):
        raise TraceError(f"{source} trace: a tenant is named twice in {names!r}")
    try:
        start = float(params.get("start", defaults["start"]))
        days = float(params.get("days", defaults["days"]))
        scale = float(params.get("scale", defaults["scale"]))
        jobs = int(params["jobs"]) if "jobs" in params else None
        seed = int(params.get("seed", seed))
        load = float(params.get("load", defaults["load"])) if "load" in defaults else None
    except ValueError as exc:
        raise TraceError(f"{source} trace: bad parameter value ({exc})") from None
    if not (start >= 0 and days > 0 and scale > 0 and (load is None or load > 0)) or (jobs is not None and jobs < 1):
        raise TraceError(f"{source} trace: need start >= 0, days > 0, scale > 0, load > 0 and jobs >= 1 "
                         f"(got {start:g}, {days:g}, {scale:g}, {load}, {jobs})")
    return TenantQuery(source, tenants, every, start, days, scale, jobs, seed, load)


def scaled_quota(gpus: int, scale: float) -> int:
    """A tenant's quota of ``gpus`` GPUs on a cluster ``scale`` times as large: whole 8-GPU nodes
    from 8 GPUs on, at least one GPU below (halves round up)."""
    share = gpus * scale
    if share >= NODE_GPUS - 0.5:
        return NODE_GPUS * max(1, int(share / NODE_GPUS + 0.5))
    return max(1, int(share + 0.5))


def in_window(jobs: Iterable[TraceJob], query: TenantQuery) -> list[TraceJob]:
    """The jobs arriving in the query's window, shifted so that it starts at 0, at most
    ``jobs_per_tenant`` of them (the first)."""
    start, end = query.window_s
    kept = [replace(j, submit_s=j.submit_s - start) for j in jobs if start <= j.submit_s < end]
    kept.sort(key=lambda j: j.submit_s)
    return kept[:query.jobs_per_tenant]


def narrowed_to_quota(job: TraceJob, quota: int) -> TraceJob:
    """The job on at most ``quota`` GPUs, with its GPU-time kept."""
    if job.gpus <= quota:
        return job
    return replace(job, gpus=quota, duration_s=job.duration_s * job.gpus / quota,
                   gpus_per_node=gpus_per_node_for(quota, NODE_GPUS))


def tenant_trace(query: TenantQuery, per_tenant: Mapping[str, Sequence[TraceJob]], quotas: Mapping[str, int], *,
                 gpu_type: str, source: str, notes: Sequence[str], seeded: bool,
                 duration_gpu: str | None = "A100-40GB") -> Trace:
    """One trace of the tenants' jobs (each job's ``user`` its tenant, narrowed to its quota), on
    the cluster of their quotas."""
    jobs: list[TraceJob] = []
    narrowed = 0
    for tenant, tenant_jobs in per_tenant.items():
        for job in tenant_jobs:
            fitted = narrowed_to_quota(job, quotas[tenant])
            narrowed += fitted is not job
            jobs.append(replace(fitted, user=tenant))
    jobs.sort(key=lambda j: j.submit_s)
    total = sum(quotas.values())
    summary = [
        f"{len(quotas)} tenants on {total} GPUs (quotas x{query.scale:g}, whole 8-GPU nodes from 8 GPUs on): "
        + ", ".join(f"{t} {quotas[t]}" for t in per_tenant),
        *notes,
    ]
    if narrowed:
        summary.append(f"{narrowed} jobs wider than their tenant's quota were narrowed to it (GPU-time kept)")
    return Trace(name=query.name(seeded=seeded), jobs=jobs, cluster=ClusterHint.packed(total, NODE_GPUS, gpu_type),
                 source=source, notes=summary, duration_gpu=duration_gpu, tenant_gpus=dict(quotas))


def tenant_queues(quotas: Mapping[str, int], *, borrowing: bool) -> tuple[QueueQuota, ...]:
    """A queue per tenant with its quota as nominal GPUs; ``borrowing``: it may borrow any idle GPU
    (reclaimed when their owner needs them), else none (strict quotas)."""
    return tuple(QueueQuota(name, gpus, None if borrowing else 0) for name, gpus in quotas.items())


def queues_document(queues: Iterable[QueueQuota]) -> dict:
    """The queue configuration file's content (``hier-sched queues apply``, ``replay --queues``)."""
    entries = []
    for q in queues:
        entry: dict = {"name": q.name, "nominal": {"gpus": q.nominal_gpus}}
        if q.borrowing_limit_gpus is not None:
            entry["borrowing_limit"] = {"gpus": q.borrowing_limit_gpus}
        entries.append(entry)
    return {"queues": entries}
