"""``helios-vc:<vc>,<vc>,...?start=DAY&days=D&scale=S&load=L&jobs=N&seed=K``: SenseTime's Helios "Earth"
cluster, its teams' demand rebuilt into jobs.

The data (``tenants/helios-earth/``) has no job list: per virtual cluster (VC) it has one row per
minute of May 2020 with the jobs and GPUs running and pending, split into jobs of < 8 and >= 8
GPUs, and each VC's GPU quota per day. Jobs are rebuilt per VC and per size class (< 8, >= 8):

* **Arrivals.** Jobs in the system (running + pending) of the class at the window's first minute
  arrive at its start; after that, each rise of that count from one minute to the next is as many
  arrivals, spread evenly over that minute. A fall is departures. A job that arrives and leaves
  within one minute, or arrives in the minute another leaves, is not seen: the count is a lower
  bound on the arrivals.
* **Sizes.** The rise of the class's GPUs in the system in that minute, split evenly over its
  arrivals, each rounded to its class: 1-7 GPUs, or whole 8-GPU nodes (a job of >= 8 GPUs on
  Helios' 8-GPU nodes; a 29-GPU gang would need 29 nodes). Where that rise is too small for them
  (a departure in the same minute hid it), each arrival gets the class's mean job size at that
  minute.
* **Durations.** The series does not follow jobs, so the shape comes from Philly's 83,154 job
  runtimes and the scale from Helios: each job draws a Philly runtime (seeded), times one factor
  per VC and class, capped at the window's length; the factor is set so that the rebuilt jobs'
  GPU-time equals the GPU-minutes the series shows that class running in the window (so the mean
  run time is running GPU-time over arriving GPUs, Little's law). A job that runs past the
  window's end counts whole. Where even the cap is not enough (a class whose few arrivals ran all
  week), every job of the class runs for the whole window.
* **Memory and utilization:** a carma workload, drawn with the thesis traces' mix (as
  ``synthetic:philly`` does); Helios records neither.
* **Quota:** the VC's most common non-zero daily quota over the window (2020-05-09 is zeros for
  every VC: a missing day), times ``scale`` (``traces.tenants``).
* **Scale and load.** The series are a VC's whole demand: ``scale`` shrinks its quota, and a share
  ``scale`` x ``load`` of its jobs is kept (evenly in arrival order; all of them from 1 on). At
  ``load=1`` each VC's demand on its quota is Helios' own; ``load=L`` offers L times as much, in the
  same pattern (the same VCs busy at the same hours).
* **Cluster:** 8-GPU nodes of V100-32GB. The files do not name the GPU; Helios' clusters are
  8-GPU V100 machines (Hu et al., SC'21), and every carma workload fits 32 GB. Durations are
  taken as they are, on whatever GPU runs them (the series are wall-clock times).

Days count from 2020-05-01 00:00; the window must lie in May (31 days).
"""

from __future__ import annotations

import csv
import math
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from traces._paths import cached_per_data_dir, data_file
from traces.gang import gpus_per_node_for
from traces.schema import Trace, TraceError, TraceJob
from traces.synthetic import philly_runtimes, workload_mix
from traces.tenants import NODE_GPUS, TenantQuery, in_window, parse_tenant_query, scaled_quota, tenant_trace
from traces.workloads import carma_workloads

__all__ = ["HELIOS_VC_TEMPLATE", "helios_vcs", "load_helios_vc", "VcSeries", "rebuild_jobs"]

HELIOS_VC_TEMPLATE = "helios-vc:<vc>,<vc>,...?start=DAY&days=D&scale=S&load=L&jobs=N&seed=K"
_DEFAULTS = {"start": 0, "days": 7, "scale": 0.25, "load": 1}
_DIR = ("tenants", "helios-earth")
_MONTH_DAYS = 31
_MINUTES_PER_DAY = 1440
GPU_TYPE = "V100-32GB"


@dataclass(frozen=True, slots=True)
class SizeClass:
    """Jobs of ``smallest``..``largest`` GPUs, in steps of ``step``: the series' ``_less_8`` or
    ``_noless_8`` columns."""

    suffix: str
    smallest: int
    largest: int | None
    step: int

    def fit(self, gpus: float) -> int:
        """The nearest size of the class (halves round up)."""
        size = self.step * int(gpus / self.step + 0.5)
        return max(self.smallest, min(size, self.largest or size))


SIZE_CLASSES = (SizeClass("less_8", 1, NODE_GPUS - 1, 1), SizeClass("noless_8", NODE_GPUS, None, NODE_GPUS))


@dataclass(frozen=True, slots=True)
class VcSeries:
    """One VC's per-minute series of one size class: jobs and GPUs in the system (running +
    pending), GPUs running."""

    jobs: np.ndarray
    gpus: np.ndarray
    running_gpus: np.ndarray


def _vcs_dir():
    return data_file(*_DIR, "vcs")


def helios_vcs() -> list[str]:
    """The VCs with a per-minute series."""
    return sorted(p.stem for p in _vcs_dir().glob("*.csv"))


@cached_per_data_dir
def _series(vc: str) -> Mapping[str, VcSeries]:
    """Size class suffix -> the VC's series over May, read-only."""
    path = _vcs_dir() / f"{vc}.csv"
    with path.open() as fh:
        header = fh.readline().strip().split(",")
    columns = {name: i for i, name in enumerate(header)}
    wanted = [f"{kind}_{c.suffix}" for c in SIZE_CLASSES for kind in ("total_job_num", "total_gpu_num",
                                                                       "running_gpu_num")]
    missing = [w for w in wanted if w not in columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
    table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=[columns[w] for w in wanted], dtype=np.int64, ndmin=2)
    if len(table) != _MONTH_DAYS * _MINUTES_PER_DAY:
        raise TraceError(f"{path}: expected one row per minute of May 2020 ({_MONTH_DAYS * _MINUTES_PER_DAY}), "
                         f"got {len(table)}")
    table.flags.writeable = False
    return MappingProxyType({c.suffix: VcSeries(*(table[:, 3 * i + k] for k in range(3)))
                             for i, c in enumerate(SIZE_CLASSES)})


@cached_per_data_dir
def _daily_quotas() -> Mapping[str, tuple[int, ...]]:
    """Each VC's quota on each day of May 2020."""
    path = data_file(*_DIR, "vc_gpu_quota_daily.csv")
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["date"].startswith("2020-05")]
    if len(rows) != _MONTH_DAYS:
        raise TraceError(f"{path}: expected {_MONTH_DAYS} days of May 2020, got {len(rows)}")
    vcs = [name for name in rows[0] if name not in ("date", "total")]
    return MappingProxyType({vc: tuple(int(r[vc]) for r in rows) for vc in vcs})


def _quota(vc: str, query: TenantQuery) -> int:
    first = int(query.start_day)
    days = [q for q in _daily_quotas().get(vc, ())[first:first + max(1, int(np.ceil(query.days)))] if q > 0]
    if not days:
        raise TraceError(f"helios-vc: VC {vc} has no quota in days {query.start_day:g}-"
                         f"{query.start_day + query.days:g} of May 2020")
    return Counter(days).most_common(1)[0][0]


def _arrivals(series: VcSeries, size: SizeClass, first_minute: int) -> tuple[list[float], list[int]]:
    """(submit second since May 1, GPUs) of the class's rebuilt arrivals, from ``first_minute`` on."""
    jobs, gpus = series.jobs.tolist(), series.gpus.tolist()
    submits: list[float] = []
    widths: list[int] = []
    before_jobs = before_gpus = 0  # the system is empty before the window: its jobs arrive at its start
    for m, (n, g) in enumerate(zip(jobs, gpus)):
        arrived = n - before_jobs
        if arrived > 0:
            added = g - before_gpus
            if added >= size.smallest * arrived:
                each, extra = divmod(added, arrived)
                sizes = [each + 1] * extra + [each] * (arrived - extra)
            else:  # a departure in this minute hid their GPUs
                sizes = [g / n] * arrived
            widths += [size.fit(s) for s in sizes]
            minute = first_minute + m
            submits += ([minute * 60.0] * arrived if m == 0 else
                        [(minute - 1 + (i + 0.5) / arrived) * 60.0 for i in range(arrived)])
        before_jobs, before_gpus = n, g
    return submits, widths


def _duration_factor(runtimes: np.ndarray, widths: np.ndarray, gpu_s: float, cap_s: float) -> float:
    """k with sum(widths x min(k x runtimes, cap_s)) = gpu_s (it grows with k: bisection)."""
    if gpu_s >= float(widths.sum()) * cap_s:
        return math.inf
    low, high = 0.0, cap_s / float(runtimes.min())  # at ``high`` every runtime is capped
    for _ in range(60):
        mid = (low + high) / 2
        if float(np.dot(widths, np.minimum(mid * runtimes, cap_s))) < gpu_s:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def rebuild_jobs(vc: str, classes: Mapping[str, VcSeries], first_minute: int, window_minutes: int,
                 rng: np.random.Generator) -> list[TraceJob]:
    """The VC's jobs rebuilt from its series over ``window_minutes`` from ``first_minute`` (the
    module's docstring says how), in arrival order."""
    runtimes = philly_runtimes()
    names, mix = workload_mix()
    catalogue = carma_workloads()
    cap_s = window_minutes * 60.0
    rows: list[tuple[float, int, float]] = []
    for size in SIZE_CLASSES:
        series = classes[size.suffix]
        window = slice(first_minute, first_minute + window_minutes)
        in_window = VcSeries(series.jobs[window], series.gpus[window], series.running_gpus[window])
        submits, widths = _arrivals(in_window, size, first_minute)
        if not widths:
            continue
        drawn, gpus = rng.choice(runtimes, size=len(widths)), np.array(widths, dtype=float)
        factor = _duration_factor(drawn, gpus, float(in_window.running_gpus.sum()) * 60.0, cap_s)
        durations = np.minimum(factor * drawn, cap_s)
        rows += zip(submits, widths, durations.tolist())
    rows.sort(key=lambda row: row[0])
    workloads = [catalogue[names[i]] for i in rng.choice(len(names), size=len(rows), p=mix).tolist()]
    return [
        TraceJob(f"{vc}-{i}", submit, w.name, gpus, duration, w.peak_mib, w.util.smact, w.util.smocc, w.util.drama,
                 gpus_per_node_for(gpus, NODE_GPUS), w.batch_size, w.model_kind, w.horus_mib, w.faketensor_mib,
                 w.gpumemnet_mib)
        for i, ((submit, gpus, duration), w) in enumerate(zip(rows, workloads, strict=True))
    ]


def _every_nth(jobs: list[TraceJob], share: float) -> list[TraceJob]:
    """``share`` of the jobs, spread evenly in arrival order (all of them from 1 on)."""
    if share >= 1:
        return jobs
    return [j for i, j in enumerate(jobs) if int((i + 1) * share) > int(i * share)]


def load_helios_vc(rest: str, *, seed: int = 0) -> Trace:
    """``rest`` is what follows ``helios-vc:``, e.g. ``vc6YE,vcpDC?days=7&scale=0.25``."""
    query = parse_tenant_query("helios-vc", rest, helios_vcs(), seed=seed, defaults=_DEFAULTS)
    if query.start_day + query.days > _MONTH_DAYS:
        raise TraceError(f"helios-vc: the series cover May 2020 (31 days): start + days must be <= 31 "
                         f"(got {query.start_day:g} + {query.days:g})")
    first_minute = math.ceil(query.start_day * _MINUTES_PER_DAY)
    window_minutes = int(query.days * _MINUTES_PER_DAY)
    per_vc = {}
    for vc in query.tenants:
        rng = np.random.default_rng([query.seed, zlib.crc32(vc.encode())])  # a VC's draws whatever the others
        jobs = rebuild_jobs(vc, _series(vc), first_minute, window_minutes, rng)
        per_vc[vc] = in_window(_every_nth(jobs, query.scale * query.load), query)
    quotas = {vc: scaled_quota(_quota(vc, query), query.scale) for vc in query.tenants}
    return tenant_trace(
        query, per_vc, quotas, gpu_type=GPU_TYPE, seeded=True, duration_gpu=None,
        source=f"{data_file(*_DIR)}/vcs/<vc>.csv, vc_gpu_quota_daily.csv",
        notes=["jobs rebuilt from per-minute running/pending series (traces/helios_vc.py): arrivals from rises of "
               "jobs in the system, sizes from rises of GPUs, durations Philly-shaped and scaled to the GPU-time "
               "the series show running; memory/utilization: carma workloads",
               f"keeps a share {min(query.scale * query.load, 1):g} of each VC's jobs (evenly in arrival order): "
               f"load {query.load:g} x Helios' own on quotas x{query.scale:g}"],
    )
