"""Is a policy's advantage robust or luck of timing? ``python -m replay.robustness``.

Total trace time on a small cluster hinges on when the last long jobs start, so one replay can
flatter or wrong a policy by several per cent. This replays each trace with its arrivals shifted
by up to ``--jitter`` seconds under ``--seeds`` seeds, runs our default and the thesis' reference
runs on every variant, and prints the spread of the ratios.
"""

from __future__ import annotations

import argparse
import statistics

from replay.run import ReplayOptions, run_replay

THESIS_TRACES = ("philly_mix-90-tasks", "philly_heavy-60-tasks", "philly_trace-t1", "philly_trace-t2")
RUNS = {"ours": ("auto", "ours"), "oracle MAGM": ("magm", "oracle"), "MAGM + GPUMemNet": ("magm", "gpumemnet")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", nargs="+", default=[f"carma:{t}" for t in THESIS_TRACES])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jitter", type=float, default=60.0, help="seconds (default 60)")
    args = parser.parse_args()
    print(f"arrivals jittered by up to +-{args.jitter:g} s, {args.seeds} seeds; ratios of total trace time")
    print(f"{'trace':<32} {'ours / oracle MAGM':>28} {'ours / MAGM+GPUMemNet':>28} {'ours wins on both':>18}")
    for name in args.trace:
        to_oracle, to_gm, wins = [], [], 0
        for seed in range(args.seeds):
            res = {label: run_replay(name, ReplayOptions(policy=p, estimator=e, seed=seed, jitter_s=args.jitter))[0]
                   for label, (p, e) in RUNS.items()}
            ours, gm = res["ours"], res["MAGM + GPUMemNet"]
            to_oracle.append(ours.makespan_s / res["oracle MAGM"].makespan_s)
            to_gm.append(ours.makespan_s / gm.makespan_s)
            wins += ours.makespan_s <= gm.makespan_s and ours.energy_mj <= gm.energy_mj
        print(f"{name:<32} {_spread(to_oracle):>28} {_spread(to_gm):>28} {wins:>12}/{args.seeds}", flush=True)


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


if __name__ == "__main__":
    main()
