"""``synthetic:philly?jobs=N&gpus=G&seed=S[&load=L][&tenants=K]``: a Philly-shaped trace of any size.

Every quantity is resampled (with replacement, numpy, vectorised) from real data:

* arrival gaps from the Philly inter-arrival samples the thesis traces were cut from
  (``philly_trace_100_tasks_with_failures.csv`` and ``assets_philly_trace_200_tasks.csv``; the
  60- and 90-task files are prefixes of these, and ``examples_source_...60_tasks.csv`` is left out
  because its gaps are clipped at ~600 s);
* durations from the 83,154 Philly job runtimes (``philly_job_runtimes_s.csv``), raised to >= 1 s;
* #GPUs from the 15,264 jobs of Gavel's Philly-derived traces (68.7 % 1 GPU, 13.4 % 4, 12.6 % 8,
  3.0 % 2, 2.4 % more than 8 — multi-node gangs);
* workload (peak memory, utilization profile, recorded estimates, batch, kind) from the carma
  workloads, weighted by how often the four thesis traces use each one.

Load rule: gaps are scaled so that the offered load — expected GPU-seconds of work arriving per
second, E[#GPUs x duration] / E[gap], both over the whole source distributions — is ``load`` x G
(default 0.85): the cluster is busy under exclusive placement but its queue does not grow without
bound. Collocation raises the effective capacity, so a replay with sharing is less loaded still.
Raise ``load`` for a stress test.

Gang shape: 8 GPUs per node. Jobs wider than a node spread evenly (``traces.gang``); a job wider
than the cluster can hold is narrowed to the widest gang that fits (counted in the notes).

Tenants (``tenants=K``, 1-11): the jobs belong to K teams, Philly's K largest virtual clusters
(``tenants/philly_vc_nodes.csv``). Each gets a quota of the cluster's whole 8-GPU nodes in
proportion to its VC's nodes (at least one node each), and each job's team is drawn in proportion
to the quotas, so every team offers about the same load per GPU of quota (Gavel's per-VC files
were cut at 2,000 jobs each, so their job counts are not the VCs' real shares). A job wider than
its team's quota is narrowed to it with its GPU-time kept (``traces.tenants``). The trace carries
the quotas (``Trace.tenant_gpus``): ``hier-sched traces queues`` writes their queue file.
Without ``tenants`` the trace is the same as before the key existed (its draws come last).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from urllib.parse import parse_qsl

import numpy as np

from traces._paths import cached_per_data_dir, data_file
from traces.bulk import trace_jobs
from traces.carma import CARMA_TRACES, load_carma
from traces.gang import gpus_per_node_for
from traces.gavel import gavel_traces, load_gavel
from traces.philly_vc import philly_vc_nodes
from traces.schema import ClusterHint, Trace, TraceError
from traces.tenants import narrowed_to_quota
from traces.workloads import carma_workloads

__all__ = ["SYNTHETIC_TEMPLATE", "load_synthetic", "DEFAULT_LOAD", "NODE_GPUS", "philly_runtimes", "workload_mix"]

SYNTHETIC_TEMPLATE = "synthetic:philly?jobs=N&gpus=G&seed=S[&tenants=K]"
NODE_GPUS = 8
DEFAULT_LOAD = 0.85
_DEFAULTS = {"jobs": 1000, "gpus": 64}
_GAP_FILES = ("philly_trace_100_tasks_with_failures.csv", "assets_philly_trace_200_tasks.csv")
MIN_DURATION_S = 1.0


def _read_only(array: np.ndarray) -> np.ndarray:
    """Cached arrays are shared between calls: nobody may change them."""
    array.flags.writeable = False
    return array


@cached_per_data_dir
def _gaps() -> np.ndarray:
    return _read_only(np.concatenate([
        np.loadtxt(data_file("traces", "philly", name), delimiter=",", ndmin=2)[:, 0] for name in _GAP_FILES
    ]))


@cached_per_data_dir
def philly_runtimes() -> np.ndarray:
    """The 83,154 Philly job runtimes (s), raised to >= 1 s: a real cluster's duration distribution."""
    runtimes = np.loadtxt(data_file("traces", "philly", "philly_job_runtimes_s.csv"), skiprows=1)
    return _read_only(np.maximum(runtimes, MIN_DURATION_S))


@cached_per_data_dir
def _gpu_counts() -> tuple[np.ndarray, np.ndarray]:
    """Empirical (#GPUs, probability) over every job of Gavel's Philly-derived traces."""
    counts = Counter(job.gpus for name in gavel_traces() for job in load_gavel(name).jobs)
    values = np.array(sorted(counts))
    probabilities = np.array([counts[v] for v in values], dtype=float) / sum(counts.values())
    return _read_only(values), _read_only(probabilities)


@cached_per_data_dir
def workload_mix() -> tuple[tuple[str, ...], np.ndarray]:
    """Carma workloads and how often the four thesis traces (not ``test``) use each."""
    uses = Counter(job.workload for trace in CARMA_TRACES if trace != "test" for job in load_carma(trace).jobs)
    names = tuple(sorted(uses))
    return names, _read_only(np.array([uses[n] for n in names], dtype=float) / sum(uses.values()))


def _node_shape(cluster_gpus: int) -> tuple[int, int]:
    """GPUs per node and the number of such whole nodes (a cluster under 8 GPUs is one node)."""
    if cluster_gpus <= NODE_GPUS:
        return cluster_gpus, 1
    return NODE_GPUS, cluster_gpus // NODE_GPUS


def _fit_width(gpus: int, cluster_gpus: int) -> int:
    """``gpus`` if the cluster's whole nodes can hold a gang that wide, else the widest they can."""
    node_gpus, whole_nodes = _node_shape(cluster_gpus)
    per_node = gpus_per_node_for(gpus, node_gpus) or gpus
    return gpus if gpus // per_node <= whole_nodes else node_gpus * whole_nodes


def _parse(query: str, seed: int) -> tuple[int, int, int, float, int]:
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in ("jobs", "gpus", "seed", "load", "tenants"):
            raise TraceError(f"synthetic trace: unknown parameter {key!r}; known: jobs, gpus, seed, load, tenants")
        params[key] = value
    try:
        jobs = int(params.get("jobs", _DEFAULTS["jobs"]))
        gpus = int(params.get("gpus", _DEFAULTS["gpus"]))
        seed = int(params.get("seed", seed))
        load = float(params.get("load", DEFAULT_LOAD))
        tenants = int(params.get("tenants", 0))
    except ValueError as exc:
        raise TraceError(f"synthetic trace: bad parameter value ({exc})") from None
    if jobs < 1 or gpus < 1 or not load > 0:
        raise TraceError(f"synthetic trace: need jobs >= 1, gpus >= 1, load > 0 (got {jobs}, {gpus}, {load})")
    if tenants and not 1 <= tenants <= len(philly_vc_nodes()):
        raise TraceError(f"synthetic trace: tenants must be 1-{len(philly_vc_nodes())} (Philly's VCs with a "
                         f"known size), got {tenants}")
    if tenants and gpus < NODE_GPUS * tenants:
        raise TraceError(f"synthetic trace: {tenants} tenants need at least {NODE_GPUS * tenants} GPUs "
                         f"(a whole 8-GPU node each), got {gpus}")
    return jobs, gpus, seed, load, tenants


def _tenant_quotas(tenants: int, cluster_gpus: int) -> dict[str, int]:
    """Philly's ``tenants`` largest VCs, each with whole 8-GPU nodes of the cluster in proportion to
    its VC's nodes (largest remainders first; at least one node each)."""
    sizes = sorted(philly_vc_nodes().items(), key=lambda kv: -kv[1])[:tenants]
    nodes = cluster_gpus // NODE_GPUS
    total = sum(size for _, size in sizes)
    exact = [(nodes - tenants) * size / total for _, size in sizes]  # one node each first, the rest shared
    given = [1 + int(e) for e in exact]
    by_remainder = sorted(range(tenants), key=lambda i: int(exact[i]) - exact[i])
    for i in by_remainder[:nodes - sum(given)]:
        given[i] += 1
    return {vc: NODE_GPUS * n for (vc, _), n in zip(sizes, given)}


def load_synthetic(kind_and_query: str, *, seed: int = 0) -> Trace:
    """``kind_and_query`` is what follows ``synthetic:``, e.g. ``philly?jobs=1000&gpus=64``.
    A ``seed`` in the query wins over the keyword."""
    kind, _, query = kind_and_query.partition("?")
    if kind != "philly":
        raise TraceError(f"unknown synthetic trace {kind!r}; known: {SYNTHETIC_TEMPLATE}")
    n, cluster_gpus, seed, load, tenants = _parse(query, seed)
    rng = np.random.default_rng(seed)
    gaps, runtimes = _gaps(), philly_runtimes()
    width_values, width_probs = _gpu_counts()
    names, mix = workload_mix()

    widths = rng.choice(width_values, size=n, p=width_probs)
    durations = rng.choice(runtimes, size=n)
    workload_index = rng.choice(len(names), size=n, p=mix)
    raw_gaps = rng.choice(gaps, size=n)
    raw_gaps[0] = 0.0  # the first job arrives at t = 0

    offered = float(np.dot(width_values, width_probs)) * float(runtimes.mean())  # GPU-s per job
    gap_scale = offered / (load * cluster_gpus * float(gaps.mean()))
    submits = np.cumsum(raw_gaps) * gap_scale

    fitted = {int(w): _fit_width(int(w), cluster_gpus) for w in width_values}
    narrowed = int(sum(np.count_nonzero(widths == w) for w, f in fitted.items() if f != w))
    node_gpus, _ = _node_shape(cluster_gpus)
    shapes = {w: (f, gpus_per_node_for(f, node_gpus)) for w, f in fitted.items()}

    catalogue = carma_workloads()
    templates = [catalogue[name] for name in names]
    # Fields in TraceJob's declaration order (job_id, submit_s, workload, gpus, duration_s,
    # peak_mib, smact, smocc, drama, gpus_per_node, batch_size, model_kind, horus/faketensor/gpumemnet).
    jobs = trace_jobs(
        (f"s{i}", submit, w.name, gpus, duration, w.peak_mib, w.util.smact, w.util.smocc, w.util.drama,
         per_node, w.batch_size, w.model_kind, w.horus_mib, w.faketensor_mib, w.gpumemnet_mib)
        for i, (submit, duration, (gpus, per_node), w) in enumerate(zip(
            submits.tolist(), durations.tolist(), map(shapes.__getitem__, widths.tolist()),
            map(templates.__getitem__, workload_index.tolist()), strict=True,
        ))
    )
    notes = [
        f"offered load {load:g} x {cluster_gpus} GPUs: mean gap {float(gaps.mean()) * gap_scale:.1f} s "
        f"(Philly gaps x {gap_scale:.4g})",
        "durations: Philly runtimes (independent of the workload); memory/utilization: carma workloads",
    ]
    if narrowed:
        notes.append(f"{narrowed} jobs wider than the cluster's whole nodes were narrowed to fit")
    quotas: dict[str, int] = {}
    if tenants:
        quotas = _tenant_quotas(tenants, cluster_gpus)
        teams = list(quotas)
        shares = np.array([quotas[t] for t in teams], dtype=float) / sum(quotas.values())
        drawn = rng.choice(tenants, size=n, p=shares)
        jobs = [narrowed_to_quota(replace(job, user=teams[i]), quotas[teams[i]])
                for job, i in zip(jobs, drawn.tolist(), strict=True)]
        notes.append(f"{tenants} tenants (Philly's largest VCs), quotas "
                     + ", ".join(f"{t} {g}" for t, g in quotas.items()))
    return Trace(
        name=f"synthetic:philly?jobs={n}&gpus={cluster_gpus}&seed={seed}&load={load:g}"
             + (f"&tenants={tenants}" if tenants else ""),
        jobs=jobs,
        cluster=ClusterHint.packed(cluster_gpus, NODE_GPUS),
        source="synthetic from traces/philly/*.csv, traces/gavel/msr, workloads/*.csv"
               + (", tenants/philly_vc_nodes.csv" if tenants else ""),
        notes=notes,
        tenant_gpus=quotas,
    )
