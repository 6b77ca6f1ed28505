"""``hier-sched demo``: a local emulated cluster replays the start of a real thesis trace, live.

Two Ray nodes x 4 emulated A100-40GB (this machine, no GPU), the first jobs of
``carma:philly_mix-90-tasks`` submitted at their trace arrival times (scaled like everything
else by ``time_scale``), each job an emulated training process with the trace's measured
peak, solo duration and utilization, and the memory estimate the thesis recorded for it (so
mis-estimates and their OOM recoveries are real). Shows progress while it runs, then a result
table, and stops the cluster it started, whatever happens.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from hier_sched.console import console as make_console
from hier_sched.cluster_cli import print_jobs
from hier_sched.connection import Scheduler, connect
from hier_sched.deploy import start_cluster, stop_cluster
from hier_sched.local_cluster import ClusterConfig
from hier_sched.paths import state_dir

__all__ = ["run_demo", "trace_job_spec", "DEMO_TRACE"]

DEMO_TRACE = "carma:philly_mix-90-tasks"
_TERMINAL = ("succeeded", "failed", "cancelled")


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


def run_demo(*, job_count: int = 16, time_scale: float = 0.005, estimator: str = "horus", policy: str = "magm",
             nodes: int = 2, gpus_per_node: int = 4) -> int:
    from traces import load_trace

    console = make_console()
    trace = load_trace(DEMO_TRACE)
    jobs = sorted(trace.jobs, key=lambda j: j.submit_s)[:job_count]
    directory = state_dir() / "demo"  # its own cluster: never touches one the user started
    console.print(f"[bold]hier_sched demo[/]: {len(jobs)} jobs of {DEMO_TRACE} on {nodes} x {gpus_per_node} "
                  f"emulated A100-40GB, policy {policy}, estimates: {estimator}, 1 s wall = {1 / time_scale:.0f} s")
    t0 = time.time()
    config = ClusterConfig(nodes=nodes, gpus_per_node=gpus_per_node, time_scale=time_scale, policy=policy,
                           estimator="none", backend="emulated")
    stop_cluster(directory)  # a demo interrupted earlier may have left its private cluster running
    try:
        record = start_cluster(config, directory=directory)
        console.print(f"cluster up in {time.time() - t0:.1f} s (Ray dashboard {record.dashboard_url})")
        final = _replay(console, jobs, estimator, time_scale, connect(directory))
    finally:
        t1 = time.time()
        stop_cluster(directory)
        console.print(f"cluster stopped in {time.time() - t1:.1f} s")
    print_jobs(final, title="result", ids=False)
    for j in final:
        if j["state"] != "succeeded":
            console.print(f"{j['name']}: {j['state']}: {j['reason']}")
    _print_metrics(console, final, time_scale)
    return 0 if all(j["state"] == "succeeded" for j in final) else 1


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
                answer = scheduler.call("submit", trace_job_spec(pending.pop(0), estimator), None)
                if "error" in answer:
                    raise RuntimeError(answer["error"])
                ids.append(answer["job_id"])
            by_id = {j["job_id"]: j for j in scheduler.call("status", None)}
            current = [by_id[i] for i in ids]
            live.update(_progress(current, len(jobs), (now - start) / time_scale))
            if not pending and all(j["state"] in _TERMINAL for j in current):
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


def _print_metrics(console: Any, jobs: list[dict[str, Any]], time_scale: float) -> None:
    done = [j for j in jobs if j["end_time"] is not None]
    if not done:
        return
    first_submit = min(j["submit_time"] for j in jobs)
    makespan = (max(j["end_time"] for j in done) - first_submit) / time_scale
    jct = sum(j["end_time"] - j["submit_time"] for j in done) / len(done) / time_scale
    console.print(f"makespan {makespan / 3600:.2f} h, average JCT {jct / 3600:.2f} h (emulated), "
                  f"{sum(j['state'] == 'succeeded' for j in jobs)}/{len(jobs)} succeeded, "
                  f"{sum(j['oom_crashes'] for j in jobs)} OOM crash(es) recovered")


@click.command()
@click.option("--jobs", "job_count", type=click.IntRange(1, 90), default=16, show_default=True,
              help="first N jobs of the trace")
@click.option("--time-scale", type=float, default=0.005, show_default=True)
@click.option("--estimator", type=click.Choice(["gpumemnet", "horus", "oracle", "none"]), default="horus",
              show_default=True, help="the trace's recorded estimate each job declares (horus under-estimates some: OOM + recovery)")
@click.option("--policy", default="magm", show_default=True)
def demo(job_count: int, time_scale: float, estimator: str, policy: str) -> None:
    """A local emulated cluster (2 nodes x 4 A100-40GB) runs a slice of a real thesis trace."""
    sys.exit(run_demo(job_count=job_count, time_scale=time_scale, estimator=estimator, policy=policy))
