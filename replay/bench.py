"""Simulator speed at growing scale: ``python -m replay.bench [--jobs 10000 100000 1000000]``.

Each point replays ``synthetic:philly`` with the GPU count grown with the job count (one GPU per
40 jobs, the ratio of the 100k-job / 2,500-GPU target) so the load stays comparable, under the
default ``auto`` policy with oracle estimates, and prints trace-loading and simulation seconds.
"""

from __future__ import annotations

import argparse
import time

from replay.run import ReplayOptions, run_replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--jobs-per-gpu", type=int, default=40)
    parser.add_argument("--policy", default="auto")
    args = parser.parse_args()
    import traces

    print(f"{'jobs':>9} {'gpus':>7} {'load s':>7} {'sim s':>8} {'events':>10} {'events/s':>9} {'us/job':>7}")
    for jobs in args.jobs:
        gpus = max(8, jobs // args.jobs_per_gpu)
        t0 = time.perf_counter()
        trace = traces.load_trace(f"synthetic:philly?jobs={jobs}&gpus={gpus}&seed=0")
        load_s = time.perf_counter() - t0
        result, _ = run_replay(trace, ReplayOptions(policy=args.policy, estimator="oracle"))
        print(f"{jobs:>9,} {gpus:>7,} {load_s:>7.1f} {result.sim_wall_s:>8.1f} {result.events:>10,} "
              f"{result.events_per_s:>9,.0f} {result.sim_wall_s / jobs * 1e6:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
