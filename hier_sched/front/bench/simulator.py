"""Simulator speed at growing scale: ``hier-sched bench simulator [--jobs 10000 --jobs 100000 ...]``.

Each point replays ``synthetic:philly`` with the GPU count grown with the job count (one GPU per
40 jobs, the ratio of the 100k-job / 2,500-GPU target) so the load stays comparable, under the
default ``auto`` policy with oracle estimates, and reports trace-loading and simulation seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from replay.run import ReplayOptions, run_replay


def bench_simulator(sizes: Iterable[int], jobs_per_gpu: int, policy: str) -> Iterator[dict]:
    """One point per job count, as soon as it is measured."""
    import traces

    for jobs in sizes:
        gpus = max(8, jobs // jobs_per_gpu)
        t0 = time.perf_counter()
        trace = traces.load_trace(f"synthetic:philly?jobs={jobs}&gpus={gpus}&seed=0")
        load_s = time.perf_counter() - t0
        result, _ = run_replay(trace, ReplayOptions(policy=policy, estimator="oracle"))
        yield {"jobs": jobs, "gpus": gpus, "load_s": load_s, "sim_s": result.sim_wall_s, "events": result.events,
               "events_per_s": result.events_per_s, "us_per_job": result.sim_wall_s / jobs * 1e6}
