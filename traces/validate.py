"""Range checks every trace job must pass, whatever its source."""

from __future__ import annotations

import math

from traces.schema import TraceJob

__all__ = ["job_problems"]

_ESTIMATES = ("horus_mib", "faketensor_mib", "gpumemnet_mib")


def job_problems(job: TraceJob) -> list[str]:
    """What is wrong with one job, as ``field: problem`` texts; empty when it is fine."""
    problems = []
    if not (math.isfinite(job.submit_s) and job.submit_s >= 0):
        problems.append(f"submit_s: must be a finite number >= 0 (got {job.submit_s})")
    if job.gpus < 1:
        problems.append(f"gpus: must be >= 1 (got {job.gpus})")
    if not (math.isfinite(job.duration_s) and job.duration_s > 0):
        problems.append(f"duration_s: must be a finite number > 0 (got {job.duration_s})")
    if not (math.isfinite(job.peak_mib) and job.peak_mib > 0):
        problems.append(f"peak_mib: must be a finite number > 0 (got {job.peak_mib})")
    for name in ("smact", "smocc", "drama"):
        value = getattr(job, name)
        if not 0 <= value <= 1:
            problems.append(f"{name}: must be within [0, 1] (got {value})")
    per_node = job.gpus_per_node
    if per_node is not None and not (1 <= per_node <= job.gpus and job.gpus % per_node == 0):
        problems.append(f"gpus_per_node: must divide gpus ({job.gpus}) (got {per_node})")
    if job.batch_size is not None and job.batch_size < 1:
        problems.append(f"batch_size: must be >= 1 (got {job.batch_size})")
    for name in _ESTIMATES:
        value = getattr(job, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            problems.append(f"{name}: must be > 0 or empty (got {value})")
    if job.gpu_milli is not None:
        if not 1 <= job.gpu_milli <= 1000:
            problems.append(f"gpu_milli: must be within 1..1000 (got {job.gpu_milli})")
        elif job.gpu_milli < 1000 and job.gpus != 1:
            problems.append(f"gpu_milli: a fractional share needs gpus == 1 (got gpus {job.gpus})")
    return problems
