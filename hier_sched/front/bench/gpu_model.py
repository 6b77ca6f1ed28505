"""Micro-benchmark of the emulated GPU's per-event calls (not a test; timings are never asserted).

    hier-sched bench gpu-model [--residents 8] [--repeat 5]

Microseconds per call, best of ``--repeat`` rounds. "cold" rows include the recompute
that follows a change of the resident set (what the simulator pays once per launch or exit);
"warm" rows are cached reads (what it pays on every other event).
"""

from __future__ import annotations

import timeit

from hier_sched.device.gpu_model import EmulatedGpu, JobActivity

ACTIVITIES = [JobActivity(0.1 + 0.1 * (k % 8), 0.05 * (k % 8), 0.04 * (k % 8)) for k in range(16)]


def loaded_gpu(residents: int) -> EmulatedGpu:
    gpu = EmulatedGpu("A100-40GB")
    for k in range(residents):
        gpu.attach(f"job{k}", ACTIVITIES[k])
        gpu.allocate_peak(f"job{k}", 3_000)
    return gpu


def bench_gpu_model(residents: int, repeat: int) -> list[tuple[str, float]]:
    """(call, microseconds per call) of each case, best of ``repeat`` rounds."""
    gpu = loaded_gpu(residents)
    last = f"job{residents - 1}"
    spare = ACTIVITIES[residents % len(ACTIVITIES)]

    def churn() -> None:  # one job leaves, one arrives: invalidates every cache
        gpu.detach(last)
        gpu.attach(last, spare)

    def cold_slowdown() -> None:
        churn()
        gpu.slowdown(last)

    def cold_all() -> None:
        churn()
        for job in gpu.residents:
            gpu.slowdown(job)
        gpu.utilization()
        gpu.power_w()

    def lifecycle() -> None:
        gpu.detach(last)
        gpu.attach(last, spare)
        gpu.allocate_peak(last, 3_000)

    state = gpu.to_state()
    cases = [
        ("slowdown(job), warm", lambda: gpu.slowdown(last)),
        ("utilization(), warm", gpu.utilization),
        ("power_w(), warm", gpu.power_w),
        ("memory_free_mib + largest_free_block_mib", lambda: (gpu.memory_free_mib, gpu.largest_free_block_mib)),
        ("sample()", gpu.sample),
        ("detach + attach (churn only)", churn),
        ("churn + slowdown(job), cold", cold_slowdown),
        ("churn + every slowdown + utilization + power, cold", cold_all),
        ("detach + attach + allocate_peak (4 chunks)", lifecycle),
        ("to_state()", gpu.to_state),
        ("from_state()", lambda: EmulatedGpu.from_state(state)),
    ]
    results = []
    for label, call in cases:
        number = 2_000
        best = min(timeit.repeat(call, number=number, repeat=repeat)) / number
        results.append((label, best * 1e6))
    return results
