"""``hier-sched bench estimates``: what an estimate made where the job's code lives costs a user,
on a running cluster (``hier-sched up``).

A project directory with a small CNN's factory is written to a temporary directory (importable
nowhere else, so every estimate is a Ray task in the job's environment). Measured: how long a
``submit`` of such a job takes to answer (``estimating``; beside the same call for jobs that
declare their memory), and the time from submit until the job
has its estimate (``queued`` or later): the first job (a new worker, the tracing worker's start,
the trace) and jobs of other batch sizes after it (a warm worker: the trace alone).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_estimates"]

MODEL = """
from torch import nn


def build():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
"""


def bench_estimates(submits: int = 20, timed: int = 3, timeout_s: float = 600.0) -> dict[str, Any]:
    from hier_sched.front.connection import connect

    queue = connect()
    project = Path(tempfile.mkdtemp(prefix="hs-bench-estimates-"))
    module = f"hs_bench_cnn_{project.name.rsplit('-', 1)[-1].replace('_', '')}"
    (project / f"{module}.py").write_text(MODEL)

    def spec(name: str, batch: int) -> dict[str, Any]:
        return {"name": name, "command": ["true"], "estimator": "auto", "workdir": str(project),
                "model": {"factory": f"{module}:build", "batch_size": batch, "input_shape": [3, 64, 64]},
                "emulation": {"peak_mib": 3000, "duration_s": 1}}

    declared = []  # the same call for jobs that declare their memory: what the answer costs without an estimate
    for i in range(submits):
        start = time.perf_counter()
        queue.submit({**spec(f"bench-declared-{i}", 32), "memory_mib": 3000})
        declared.append(time.perf_counter() - start)
    answers, latencies = [], []
    first = time.perf_counter()
    for i in range(submits):  # one estimate key: the latency of the answer, not of the estimate
        start = time.perf_counter()
        answers.append(queue.submit(spec(f"bench-est-{i}", 32)))
        latencies.append(time.perf_counter() - start)
    to_queued = [_until_estimated(queue, answers[0]["job_id"], first, timeout_s)]
    for k in range(1, timed):  # other keys, one after another: a warm worker
        start = time.perf_counter()
        job = queue.submit(spec(f"bench-est-warm-{k}", 32 + 8 * k))["job_id"]
        to_queued.append(_until_estimated(queue, job, start, timeout_s))
    final = queue.call("status", answers[0]["job_id"])
    return {"submits": submits, "answered_estimating": sum(a.get("state") == "estimating" for a in answers),
            "submit_p50_ms": statistics.median(latencies) * 1e3, "submit_p99_ms": _p99(latencies) * 1e3,
            "declared_submit_p50_ms": statistics.median(declared) * 1e3,
            "declared_submit_p99_ms": _p99(declared) * 1e3,
            "first_to_queued_s": to_queued[0], "warm_to_queued_s": to_queued[1:],
            "estimate_source": final["estimate_source"], "estimates": final["estimates"]}


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _until_estimated(queue: Any, job_id: str, since: float, timeout_s: float) -> float:
    while time.perf_counter() - since < timeout_s:
        state = queue.call("states", [job_id])[job_id]
        if state != "estimating":
            if state == "failed":
                raise RuntimeError(f"{job_id}: {queue.call('status', job_id)['reason']}")
            return time.perf_counter() - since
        time.sleep(0.05)
    raise TimeoutError(f"{job_id} still estimating after {timeout_s:.0f} s")
