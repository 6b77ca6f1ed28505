"""Is a policy's advantage robust or luck of timing? ``hier-sched bench robustness``.

Total trace time on a small cluster hinges on when the last long jobs start, so one replay can
flatter or wrong a policy by several per cent. This replays each trace with its arrivals shifted
by up to ``--jitter`` seconds under ``--seeds`` seeds, runs our default and the thesis' reference
runs on every variant, and reports the spread of the ratios.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from replay.run import ReplayOptions, run_replay

THESIS_TRACES = ("philly_mix-90-tasks", "philly_heavy-60-tasks", "philly_trace-t1", "philly_trace-t2")
RUNS = {"ours": ("auto", "ours"), "oracle MAGM": ("magm", "oracle"), "MAGM + GPUMemNet": ("magm", "gpumemnet")}


def bench_robustness(trace_names: Iterable[str], seeds: int, jitter_s: float) -> Iterator[dict]:
    """Per trace, as soon as its replays are done: our total time over each reference's, one
    ratio per seed, and on how many seeds ours is no slower and uses no more energy than MAGM +
    GPUMemNet."""
    for name in trace_names:
        to_oracle, to_gm, wins = [], [], 0
        for seed in range(seeds):
            res = {label: run_replay(name, ReplayOptions(policy=p, estimator=e, seed=seed, jitter_s=jitter_s))[0]
                   for label, (p, e) in RUNS.items()}
            ours, gm = res["ours"], res["MAGM + GPUMemNet"]
            to_oracle.append(ours.makespan_s / res["oracle MAGM"].makespan_s)
            to_gm.append(ours.makespan_s / gm.makespan_s)
            wins += ours.makespan_s <= gm.makespan_s and ours.energy_mj <= gm.energy_mj
        yield {"trace": name, "seeds": seeds, "ours_to_oracle_magm": to_oracle, "ours_to_magm_gpumemnet": to_gm,
               "ours_wins_on_both": wins}
