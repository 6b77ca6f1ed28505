"""``describe(trace)``: a short human summary for the replay CLI to print."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np

from hier_sched.core.gpu_types import gpu_type
from traces.schema import ClusterHint, Trace

__all__ = ["describe"]

_MEMORY_BUCKETS_GIB = (2, 8, 16, 24, 40)
_FAILED_ESTIMATE = 40000.0  # the thesis' "estimator failed" value


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _cluster_text(cluster: ClusterHint | None) -> tuple[str, int, float]:
    """Description, total GPUs and the largest GPU memory of the hinted cluster."""
    if cluster is None:
        return "no cluster hint", 0, 0.0
    nodes = cluster.node_list or ((cluster.gpus_per_node, cluster.gpu_type),) * cluster.nodes
    gpus = sum(g for g, _ in nodes)
    largest = max(gpu_type(t).memory_mib for _, t in nodes)
    if cluster.node_list:
        types = Counter()
        for g, t in nodes:
            types[t] += g
        mix = ", ".join(f"{n} {t}" for t, n in types.most_common())
        return f"{len(nodes)} nodes, {gpus} GPUs ({mix})", gpus, largest
    return f"{cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu_type}", gpus, largest


def describe(trace: Trace) -> str:
    """Jobs, submit span, GPU-hours, #GPU, duration and memory distributions, estimates, notes."""
    jobs = trace.jobs
    cluster, cluster_gpus, largest_mib = _cluster_text(trace.cluster)
    lines = [f"{trace.name}: {len(jobs):,} jobs; cluster {cluster}"]
    if not jobs:
        return "\n".join(lines + [f"  note: {n}" for n in trace.notes])
    submit = np.fromiter((j.submit_s for j in jobs), float, len(jobs))
    duration = np.fromiter((j.duration_s for j in jobs), float, len(jobs))
    gpus = np.fromiter((j.gpus for j in jobs), float, len(jobs))
    peak = np.fromiter((j.peak_mib for j in jobs), float, len(jobs))
    smact = np.fromiter((j.smact for j in jobs), float, len(jobs))
    widths = Counter(gpus.astype(int).tolist())
    p50, p90 = np.percentile(duration, [50, 90])
    lines += [
        f"  submits       {_duration(float(submit.max() - submit.min()))} span "
        f"({submit.min():,.0f} .. {submit.max():,.0f} s)",
        f"  GPU-hours     {float(np.dot(gpus, duration)) / 3600:,.1f} solo; "
        f"#GPUs: " + ", ".join(f"{w}: {n:,}" for w, n in sorted(widths.items())),
        f"  duration      p50 {_duration(p50)}, p90 {_duration(p90)}, max {_duration(float(duration.max()))}",
    ]
    edges = [0, *(b * 1024 for b in _MEMORY_BUCKETS_GIB), np.inf]
    counts, _ = np.histogram(peak, bins=edges)
    labels = [f"<{_MEMORY_BUCKETS_GIB[0]}"] + [
        f"{a}-{b}" for a, b in pairwise(_MEMORY_BUCKETS_GIB)] + [f">{_MEMORY_BUCKETS_GIB[-1]}"]
    m50, m90 = np.percentile(peak, [50, 90])
    lines.append(f"  peak memory   p50 {m50:,.0f} MiB, p90 {m90:,.0f}, max {peak.max():,.0f}; GiB "
                 + ", ".join(f"{label}: {n:,}" for label, n in zip(labels, counts.tolist(), strict=True)))
    lines.append(f"  SMACT         mean {smact.mean():.2f} (solo profile means)")
    recorded = []
    for name in ("horus_mib", "faketensor_mib", "gpumemnet_mib"):
        values = [getattr(j, name) for j in jobs if getattr(j, name) is not None]
        if values:
            failed = sum(v == _FAILED_ESTIMATE for v in values)
            recorded.append(f"{name.removesuffix('_mib')} {len(values):,} ({failed:,} failed)")
    if recorded:
        lines.append("  estimates     " + ", ".join(recorded))
    if trace.cluster is not None:
        too_big = int(np.count_nonzero((peak > largest_mib) | (gpus > cluster_gpus)))
        if too_big:
            lines.append(f"  unschedulable {too_big:,} jobs need more memory or GPUs than the cluster has")
    lines += [f"  note: {n}" for n in trace.notes]
    return "\n".join(lines)
