"""``hier-sched demo``: the whole story in a few minutes on one machine without a GPU.

1. A local Ray cluster (``hier-sched up`` of two nodes x 2 emulated A100-40GB: the thesis'
   4-GPU server, split over two Ray nodes) comes up; the
   Ray dashboard's address, the metrics endpoints and how to watch it (``hier-sched top``) are
   printed.
2. The first jobs of a real thesis trace (``carma:philly_mix-90-tasks``) go through the live
   scheduler at their trace arrival times, time-compressed (``time_scale``): each job an
   emulated training process with the trace's measured peak, solo duration and utilization, and
   the memory estimate the thesis recorded for it (so mis-estimates and their OOM recoveries are
   real). Progress is shown while it runs; then the cluster goes down, whatever happens.
3. The same slice is replayed in the simulator, which runs the very same scheduler core on a
   virtual clock: once with the same policy and estimates, once on exclusive GPUs (one job per
   GPU: what a scheduler handing out whole GPUs would have given). A table sets the live run
   beside both.
4. The replay's figures are written (GPU memory, SMACT and power per GPU over time, exclusive
   beside the policy; the JCT distribution of both).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from hier_sched.common.console import console as make_console
from hier_sched.common.paths import state_dir
from hier_sched.core.job import TERMINAL  # str states compare equal to these members
from hier_sched.core.presets import PRESET_NAMES
from hier_sched.front.cluster_cli import print_jobs
from hier_sched.front.connection import Scheduler, connect
from hier_sched.front.deploy import start_cluster, stop_cluster
from hier_sched.front.local_cluster import ClusterConfig

__all__ = ["run_demo", "trace_job_spec", "demo_slice", "DEMO_TRACE"]

DEMO_TRACE = "carma:philly_mix-90-tasks"


def trace_job_spec(tj: Any, estimator: str) -> dict[str, Any]:
    """A job spec for one trace job: the emulation profile is the truth, the estimate what the
    scheduler believes (the value the trace recorded for ``estimator``; ``none``: no estimate)."""
    spec: dict[str, Any] = {
        "name": f"{tj.job_id.rsplit('-', 1)[-1]}-{tj.workload}"[:24],
        "gpus": tj.gpus,
        "emulation": {"peak_mib": tj.peak_mib, "duration_s": tj.duration_s, "smact": tj.smact,
                      "smocc": tj.smocc, "drama": tj.drama},
    }
    recorded = tj.peak_mib if estimator == "oracle" else getattr(tj, f"{estimator}_mib", None)
    if recorded:
        spec["memory_mib"] = recorded
    else:
        spec["estimator"] = "none"
    return spec


def demo_slice(job_count: int):
    """The first ``job_count`` jobs of the demo trace, as a trace of their own. A trace that cannot
    be read (e.g. the shared data is not where it is looked for) is the user's to fix: said in one
    line, before any cluster starts."""
    from traces import load_trace
    from traces.schema import TraceError

    try:
        trace = load_trace(DEMO_TRACE)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from exc
    jobs = sorted(trace.jobs, key=lambda j: j.submit_s)[:job_count]
    return replace(trace, name=f"{trace.name} (first {len(jobs)} jobs)", jobs=jobs)


def run_demo(*, job_count: int = 24, time_scale: float = 0.005, estimator: str = "horus", policy: str = "auto",
             nodes: int = 2, gpus_per_node: int = 2, plots_dir: str | Path = "out/demo") -> int:
    console = make_console()
    trace = demo_slice(job_count)
    console.print(f"[bold]hier_sched demo[/]: {len(trace.jobs)} jobs of {DEMO_TRACE} on {nodes} x {gpus_per_node} "
                  f"emulated A100-40GB, policy {policy}, estimates: {estimator}, 1 s wall = {1 / time_scale:.0f} s")
    config = ClusterConfig(nodes=nodes, gpus_per_node=gpus_per_node, time_scale=time_scale, policy=policy,
                           estimator="none", backend="emulated")
    final = _live(console, config, trace.jobs, estimator)
    print_jobs(final, title="the live run, job by job", ids=False)
    for j in final:
        if j["state"] != "succeeded":
            console.print(f"{j['name']}: {j['state']}: {j['reason']}", markup=False)
    runs = _simulate(console, trace, policy, estimator, nodes, gpus_per_node)
    _print_comparison(console, final, time_scale, runs, policy, estimator)
    _plot(console, runs, plots_dir)
    return 0 if all(j["state"] == "succeeded" for j in final) else 1


def _live(console: Any, config: ClusterConfig, jobs: list[Any], estimator: str) -> list[dict[str, Any]]:
    """Up, the jobs through the live scheduler, down (whatever happens); the jobs' final status."""
    from hier_sched.front.cluster_info import metrics_urls

    directory = state_dir() / "demo"  # its own cluster: never touches one the user started
    stop_cluster(directory)  # a demo interrupted earlier may have left its private cluster running
    t0 = time.time()
    try:
        record = start_cluster(config, directory=directory)
        scheduler = connect(directory, command="hier-sched demo")
        console.print(f"cluster up in {time.time() - t0:.1f} s\n"
                      f"  Ray dashboard:   {record.dashboard_url or 'none'}\n"
                      f"  metrics:         {len(metrics_urls())} Prometheus endpoint(s), series ray_hier_sched_* "
                      "(docs/metrics.md)\n"
                      f"  watch it:        RAY_ADDRESS={record.address} hier-sched top", highlight=False)
        return _replay(console, jobs, estimator, config.time_scale, scheduler)
    finally:
        t1 = time.time()
        stop_cluster(directory)
        console.print(f"cluster stopped in {time.time() - t1:.1f} s")


def _simulate(console: Any, trace: Any, policy: str, estimator: str, nodes: int, gpus_per_node: int):
    """The slice in the simulator: the policy with the same estimates, and exclusive GPUs."""
    from replay.run import ReplayOptions, run_replay

    t0 = time.time()
    shape = dict(nodes=nodes, gpus_per_node=gpus_per_node, gpu_type="A100-40GB")
    runs = {"policy": run_replay(trace, ReplayOptions(policy=policy, estimator=estimator, **shape)),
            "exclusive": run_replay(trace, ReplayOptions(policy="exclusive", estimator="none", **shape))}
    console.print(f"the same slice replayed in the simulator ({policy}, and exclusive GPUs) in "
                  f"{time.time() - t0:.1f} s")
    return runs


def _print_comparison(console: Any, jobs: list[dict[str, Any]], time_scale: float, runs: dict[str, Any],
                      policy: str, estimator: str) -> None:
    from rich.table import Table

    exclusive = runs["exclusive"][0]
    table = Table(title=f"{len(jobs)} jobs on {exclusive.gpus} GPUs: collocation vs exclusive GPUs (emulated hours)",
                  caption="exclusive: the same slice in the simulator, which runs the same scheduler core on a "
                          "virtual clock, one job per GPU. Energy: the simulator's GPU model.")
    for column in ("run", "total time", "x exclusive", "mean wait", "mean JCT", "OOM crashes", "GPU energy"):
        table.add_column(column, justify="left" if column == "run" else "right")
    live = _live_figures(jobs, time_scale)
    if live is not None:
        makespan, wait, jct, ooms = live
        table.add_row(f"live cluster: {policy} + {estimator} estimates", f"{makespan / 3600:.2f} h",
                      f"{makespan / exclusive.makespan_s:.2f}", f"{wait / 3600:.2f} h", f"{jct / 3600:.2f} h", str(ooms),
                      "-")
    for label, (r, _) in ((f"simulator: {policy} + {estimator} estimates", runs["policy"]),
                          ("simulator: exclusive GPUs", runs["exclusive"])):
        table.add_row(label, f"{r.makespan_s / 3600:.2f} h", f"{r.makespan_s / exclusive.makespan_s:.2f}",
                      f"{r.avg_wait_s / 3600:.2f} h", f"{r.avg_jct_s / 3600:.2f} h", str(r.oom_crashes),
                      f"{r.energy_mj:.1f} MJ")
    console.print(table)


def _live_figures(jobs: list[dict[str, Any]], time_scale: float) -> tuple[float, float, float, int] | None:
    """(makespan, mean wait until the first start, mean JCT, OOM crashes) of the live run, in
    emulated seconds; None when no job ended."""
    done = [j for j in jobs if j["end_time"] is not None and j["start_time"] is not None]
    if not done:
        return None
    first_submit = min(j["submit_time"] for j in jobs)
    makespan = (max(j["end_time"] for j in done) - first_submit) / time_scale
    wait = sum(j["start_time"] - j["submit_time"] for j in done) / len(done) / time_scale
    jct = sum(j["end_time"] - j["submit_time"] for j in done) / len(done) / time_scale
    return makespan, wait, jct, sum(j["oom_crashes"] for j in jobs)


def _plot(console: Any, runs: dict[str, Any], plots_dir: str | Path) -> None:
    from replay.plots import plot_run

    sim, result = runs["policy"][1], runs["policy"][0]
    excl_result, excl_sim = runs["exclusive"]
    written = plot_run(sim, result, plots_dir, baseline=(excl_sim, excl_result))
    console.print(f"figures of the replay (exclusive GPUs beside {result.policy}): "
                  + ", ".join(str(p) for p in written), highlight=False)


def _replay(console: Any, jobs: list[Any], estimator: str, time_scale: float,
            scheduler: Scheduler) -> list[dict[str, Any]]:
    from rich.live import Live

    first = jobs[0].submit_s
    start = time.time()
    ids: list[str] = []
    pending = list(jobs)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            now = time.time()
            while pending and start + (pending[0].submit_s - first) * time_scale <= now:
                answer = scheduler.submit(trace_job_spec(pending.pop(0), estimator))
                if "error" in answer:
                    raise RuntimeError(answer["error"])
                ids.append(answer["job_id"])
            by_id = {j["job_id"]: j for j in scheduler.call("status", None)}
            current = [by_id[i] for i in ids]
            live.update(_progress(current, len(jobs), (now - start) / time_scale))
            if not pending and all(j["state"] in TERMINAL for j in current):
                break
            time.sleep(0.5)
    console.print()
    return current


def _progress(jobs: list[dict[str, Any]], total: int, emulated_s: float):
    from rich.table import Table

    counts = {s: sum(1 for j in jobs if j["state"] == s) for s in ("queued", "running", "succeeded", "failed")}
    ooms = sum(j["oom_crashes"] for j in jobs)
    table = Table(title=f"t = {emulated_s / 3600:.2f} h emulated | submitted {len(jobs)}/{total} | "
                        + " ".join(f"{k} {v}" for k, v in counts.items()) + f" | OOM crashes {ooms}")
    for column in ("job", "state", "node", "gpus", "attempts", "OOM"):
        table.add_column(column)
    for j in jobs:
        if j["state"] in ("queued", "running") or j["oom_crashes"]:
            table.add_row(j["name"], j["state"], j["node"] or "-", str(j["gpus"]), str(j["attempts"]), str(j["oom_crashes"]))
    return table


@click.command()
@click.option("--jobs", "job_count", type=click.IntRange(1, 90), default=24, show_default=True,
              help="first N jobs of the trace")
@click.option("--time-scale", type=float, default=0.005, show_default=True)
@click.option("--estimator", type=click.Choice(["gpumemnet", "horus", "oracle", "none"]), default="horus",
              show_default=True, help="the trace's recorded estimate each job declares (horus under-estimates some: OOM + recovery)")
@click.option("--policy", type=click.Choice(PRESET_NAMES), default="auto", show_default=True)
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default="out/demo", show_default=True,
              help="where the replay's figures go")
def demo(job_count: int, time_scale: float, estimator: str, policy: str, plots_dir: str) -> None:
    """A local emulated cluster (2 nodes x 2 A100-40GB) runs a slice of a real thesis trace,
    set beside exclusive GPUs; figures written, cluster stopped."""
    sys.exit(run_demo(job_count=job_count, time_scale=time_scale, estimator=estimator, policy=policy,
                      plots_dir=plots_dir))
