"""``hier-sched bench ...``: the measurements behind BENCHMARKS.md, one command each.

Each prints a table, or with ``--json`` only JSON on standard output (what the acceptance checks
read). These are measurements, not tests: run them on an otherwise idle machine for figures to
quote. Each command imports its bench module when it runs, so that ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from hier_sched.common.console import console as make_console
from hier_sched.core.presets import PRESET_NAMES

__all__ = ["bench"]


@click.group("bench")
def bench() -> None:
    """Measure the scheduler: the figures of BENCHMARKS.md, each with the command that made it."""


@bench.command("estimates")
@click.option("--submits", type=click.IntRange(min=1), default=20, show_default=True,
              help="estimating submits timed (one model, so one estimate)")
@click.option("--timed", type=click.IntRange(min=1), default=3, show_default=True,
              help="estimates timed from submit to queued (the first one cold)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def estimates(submits: int, timed: int, as_json: bool) -> None:
    """On a running cluster: how fast a job whose estimate needs its model is accepted, and how long
    until its estimate, made in a Ray task in the job's environment, puts it in the queue."""
    from hier_sched.front.bench.estimates import bench_estimates

    result = bench_estimates(submits=submits, timed=timed)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"submit answered estimating: {result['answered_estimating']}/{result['submits']}, "
               f"p50 {result['submit_p50_ms']:.1f} ms, p99 {result['submit_p99_ms']:.1f} ms (declared memory: "
               f"p50 {result['declared_submit_p50_ms']:.1f} ms, p99 {result['declared_submit_p99_ms']:.1f} ms)")
    click.echo(f"submit -> queued: first {result['first_to_queued_s']:.1f} s, then "
               + ", ".join(f"{s:.1f} s" for s in result["warm_to_queued_s"]))
    click.echo(f"estimate: {result['estimates']} ({result['estimate_source']})")


@bench.command("decide")
@click.option("--gpus", type=click.IntRange(min=1), default=1000, show_default=True, help="GPUs in the cluster")
@click.option("--queued", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="jobs kept waiting in the queue")
@click.option("--nodes-of", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs per node")
@click.option("--policy", type=click.Choice(PRESET_NAMES), default="auto", show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=2000, show_default=True,
              help="decisions timed after the warm-up")
@click.option("--warmup", "warmup_s", type=click.FloatRange(min=0), default=1800.0, show_default=True,
              help="simulated seconds not timed (the initial fill of the cluster)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the synthetic jobs")
@click.option("--gpu-types", default="", metavar="TYPE,TYPE,...",
              help="a mixed cluster: the nodes take these GPU types in turn (e.g. A100-40GB,H100-80GB)")
@click.option("--team-queues", type=click.IntRange(min=0), default=0, show_default=True,
              help="jobs in turn in this many team queues, each nominal an equal part of the GPUs (0: none)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def decide(gpus: int, queued: int, nodes_of: int, policy: str, repeat: int, warmup_s: float, seed: int,
           gpu_types: str, team_queues: int, as_json: bool) -> None:
    """How long one scheduling decision takes on a busy cluster with a long queue.

    One decision is one step of the core that plans: an event in (a run ended, a job arrived, a
    GPU's grace or monitoring window settled), the cluster's snapshots given, the launch commands
    out. The cluster is kept saturated, with --queued jobs always waiting (see BENCHMARKS.md).
    """
    if gpus % nodes_of:
        raise click.BadParameter(f"{gpus} GPUs do not split into nodes of {nodes_of}; use a multiple of --nodes-of",
                                 param_hint="--gpus")
    from hier_sched.core.gpu_types import gpu_type
    from hier_sched.front.bench.decide import bench_decide

    types = tuple(t.strip() for t in gpu_types.split(",") if t.strip())
    try:
        for name in types:
            gpu_type(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-types") from None
    result = bench_decide(gpus=gpus, queued=queued, nodes_of=nodes_of, policy=policy, repeat=repeat,
                          warmup_s=warmup_s, seed=seed, gpu_types=types, team_queues=team_queues)
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    teams = f", {team_queues} team queues" if team_queues else ""
    table = Table(title=f"one decision at {gpus:,} GPUs x {queued:,} queued ({policy}{teams})", show_header=False)
    for label, value in (
        ("p50 / p99 / max (CPU)", f"{result['p50_ms']:.3f} / {result['p99_ms']:.3f} / {result['max_ms']:.3f} ms"),
        ("p50 / p99 (wall)", f"{result['wall_p50_ms']:.3f} / {result['wall_p99_ms']:.3f} ms"),
        ("decisions timed", f"{result['decisions']:,} ({result['decisions_with_launch']:,} launched "
                            f"{result['launches']:,} jobs)"),
        ("cluster while timed", f"{result['gpus_busy']:,}/{gpus:,} GPUs busy, {result['jobs_running']:,} jobs running"),
        ("simulated / wall", f"{result['simulated_s']:,.0f} s / {result['wall_s']:.1f} s"),
    ):
        table.add_row(label, value)
    console = make_console()
    console.print(table)
    console.print(f"one decision: {result['what']}", soft_wrap=True)


@bench.command("dispatch")
@click.option("--jobs", type=click.IntRange(min=1), default=1000, show_default=True, help="jobs on each path")
@click.option("--baseline", type=click.Choice(["noop", "process", "ray-jobs"]), default="noop", show_default=True,
              help="what hier_sched is timed against: no-op plain Ray tasks (no process), plain Ray tasks that each "
                   "run the command as a child process, or the commands as Ray Jobs")
@click.option("--one-by-one", is_flag=True, help="submit hier_sched's command jobs one call each (else one submit_many)")
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True, help="local emulated Ray nodes")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--share", type=click.IntRange(min=1), default=4, show_default=True,
              help="plain Ray's jobs per GPU (num_gpus = 1/share)")
@click.option("--no-plain-ray", "plain_ray", is_flag=True, flag_value=False, default=True,
              help="time the scheduler alone, on a fresh cluster (plain Ray runs first otherwise)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def dispatch(jobs: int, baseline: str, one_by_one: bool, nodes: int, gpus_per_node: int, share: int,
             plain_ray: bool, as_json: bool) -> None:
    """N jobs through hier_sched and through plain Ray, on one local cluster.

    --baseline noop: no-op functions through hier_sched.submit and as plain Ray tasks; process:
    a command (a Python that does nothing) as hier_sched command jobs and as plain Ray tasks that
    each run it as a child process; ray-jobs: the same command as Ray Jobs.

    Starts its own local cluster of emulated nodes (and stops it), runs plain Ray's tasks with
    fractional num_gpus first, then the same functions through the scheduler; prints both times,
    their ratio, and where the scheduler's time went: CPU seconds per kind of process, Ray
    workers started (see BENCHMARKS.md, "Dispatch against plain Ray").
    """
    from hier_sched.front.bench.dispatch import DispatchConfig, bench_dispatch

    with _stdout_to_stderr(as_json):  # Ray prints its raylets' warnings to stdout; with --json that holds the JSON only
        result = bench_dispatch(DispatchConfig(jobs=jobs, baseline=baseline, one_by_one=one_by_one, nodes=nodes,
                                               gpus_per_node=gpus_per_node, share=share, plain_ray=plain_ray))
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    what = "no-op" if baseline == "noop" else "command"
    table = Table(title=f"{jobs:,} {what} jobs on {nodes} nodes x {gpus_per_node} emulated GPUs", show_header=False)
    if plain_ray:
        table.add_row(f"baseline ({baseline})",
                      f"{result['plain_ray_s']:.2f} s ({result['plain_ray_jobs_per_s']:.0f} jobs/s)")
    table.add_row("hier_sched", f"{result['hier_sched_s']:.2f} s ({result['jobs_per_s']:.0f} jobs/s; "
                                f"submitting took {result['hier_sched_submit_s']:.2f} s, {result['submission']})")
    if plain_ray:
        table.add_row("ratio", f"{result['ratio']:.2f}")
    cpu = result["hier_sched_cpu_s"]
    table.add_row("hier_sched's CPU", f"{sum(cpu.values()):.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
    table.add_row("Ray workers started", ", ".join(f"{k} {v}" for k, v in result["ray_workers_started"].items()))
    table.add_row("job states", ", ".join(f"{k} {v}" for k, v in sorted(result["states"].items())))
    make_console().print(table)


@bench.command("control-plane")
@click.option("--nodes", type=click.IntRange(min=1), default=100, show_default=True, help="simulated nodes")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--queued", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="jobs submitted (each holds a quarter of a GPU for --duration emulated seconds)")
@click.option("--batch", type=click.IntRange(min=1), default=100, show_default=True, help="jobs per submit_many call")
@click.option("--nodes-per-host", type=click.IntRange(min=1), default=100, show_default=True,
              help="simulated nodes per actor process")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), default=2000.0,
              show_default=True, help="each job's run in emulated seconds (1,000 emulated s = 1 wall s)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def control_plane(nodes: int, gpus_per_node: int, queued: int, batch: int, nodes_per_host: int, duration_s: float,
                  as_json: bool) -> None:
    """The real GlobalQueue actor against N simulated nodes on a local Ray cluster it starts.

    The nodes speak the node protocol with the real messages (many per process); the jobs are
    submitted in batches, start, run a short emulated time and end. Prints the submit, tick and
    launch latencies, the queue's CPU and memory, the jobs per second and any job lost or run
    twice (see BENCHMARKS.md, "Control plane at scale").
    """
    from hier_sched.front.bench.control_plane import ControlPlaneConfig, bench_control_plane

    config = ControlPlaneConfig(nodes=nodes, gpus_per_node=gpus_per_node, queued=queued, batch=batch,
                                nodes_per_host=nodes_per_host, duration_s=duration_s)
    with _stdout_to_stderr(as_json):
        result = bench_control_plane(config)
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    table = Table(title=f"{queued:,} jobs on {nodes:,} simulated nodes x {gpus_per_node} GPUs", show_header=False)
    for label, value in (
        (f"submit (a batch of {batch:,}) p50 / p99",
         f"{result['submit_p50_ms']:.1f} / {result['submit_p99_ms']:.1f} ms ({result['submit_jobs_per_s']:,.0f} jobs/s)"),
        ("tick p50 / p99 / max", (f"{result['tick_p50_ms']:.1f} / {result['tick_p99_ms']:.1f} / "
                                  f"{result['tick_max_ms']:.1f} ms ({result['ticks']:,} ticks)")),
        ("decision to node start p50 / p99", f"{result['launch_p50_ms']} / {result['launch_p99_ms']} ms"),
        ("queue CPU / RSS", f"{result['queue_cpu_share']:.0%} of a core / {result['queue_rss_mib']:,.0f} MiB"),
        ("jobs ended", f"{result['jobs_per_s']:,.1f} jobs/s over {result['wall_s']:,.1f} s"),
        ("lost / run twice / refused", f"{result['lost']} / {result['duplicated']} / {result['refused']}"),
    ):
        table.add_row(label, value)
    make_console().print(table)


@bench.command("chaos")
@click.option("--small", is_flag=True, help="the CI size (tests/ray_clusters/test_chaos.py): 14 jobs, one kill of each kind")
@click.option("--jobs", type=click.IntRange(1, 90), default=None, help="first N jobs of the trace [full: 90]")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
              help="wall seconds per trace second [full: 0.01]")
@click.option("--queue-kills", type=click.IntRange(min=0), default=None, help="GlobalQueue actor kills [full: 3]")
@click.option("--node-actor-kills", type=click.IntRange(min=0), default=None, help="node actor kills [full: 3]")
@click.option("--node-kills", type=click.IntRange(min=0), default=None,
              help="worker nodes killed (and brought back) [full: 2]")
@click.option("--drains", type=click.IntRange(min=0), default=None,
              help="nodes drained with a deadline (and opened again) [full: 1]")
@click.option("--head-restarts", type=click.IntRange(min=0), default=None,
              help="head killed and started again under GCS fault tolerance; needs redis-server [full: 0]")
@click.option("--kill-every", "kill_every_s", type=click.FloatRange(min=0), default=None,
              help="wall seconds between kills [full: 14]")
@click.option("--oom-storm", is_flag=True, help="every job claims half its true peak (estimator none)")
@click.option("--seed", type=int, default=None, help="seed of the kill schedule and its targets [14]")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def chaos(small: bool, as_json: bool, **overrides: object) -> None:
    """Kill the GlobalQueue, node actors and worker nodes, drain nodes and (with --head-restarts)
    restart the head while an emulated trace runs on a local 3-node cluster; then check that
    every accepted job ended exactly once and that no job ever ran twice at the same time
    (sampled from the live OS processes). Exits 1 when a check fails.
    On this machine only: it starts and stops a cluster of its own."""
    import dataclasses

    from hier_sched.front.bench.chaos import SMALL, ChaosPlan, run_chaos

    base = SMALL if small else ChaosPlan()
    plan = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    console = make_console(stderr=True) if as_json else make_console()
    with _stdout_to_stderr(as_json):  # Ray prints its nodes' deaths to stdout; with --json that holds the JSON only
        result = run_chaos(plan, log=lambda line: console.print(line, highlight=False, soft_wrap=True))
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_chaos(result)
    sys.exit(0 if result["ok"] else 1)


@bench.command("wal")
@click.option("--records", "sizes", type=click.IntRange(1), multiple=True, default=(1000, 10000), show_default=True,
              help="log sizes to measure (repeat the option)")
@click.option("--dir", "parent", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where to write the logs (a temporary directory inside it; default: the system's)")
@click.option("--fsync-sample", type=click.IntRange(1), default=1000, show_default=True,
              help="records appended one fsync each")
@click.option("--batch", type=click.IntRange(1), default=100, show_default=True, help="records per group commit")
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True, help="replays timed (median)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def wal(sizes: tuple[int, ...], parent: Path | None, fsync_sample: int, batch: int, repeats: int,
        as_json: bool) -> None:
    """Append throughput and replay time of the write-ahead log (see BENCHMARKS.md, "Write-ahead log")."""
    from hier_sched.front.bench.wal import bench_wal

    results = bench_wal(sizes, parent, fsync_sample, batch, repeats)
    if as_json:
        click.echo(json.dumps(results))
        return
    click.echo(f"file system: {results['file_system']}")
    for r in results["runs"]:
        each, grouped = r["fsync_each"], r["grouped"]
        click.echo(
            f"{r['records']:>6} records of {r['event_bytes']} B ({r['log_bytes'] / 1e6:.2f} MB log): "
            f"append fsync each {each['per_s']:,.0f}/s (p50 {each['p50_ms']:.2f} ms, p99 {each['p99_ms']:.2f} ms, "
            f"{each['records']} records), grouped by {grouped['batch']} {grouped['per_s']:,.0f}/s; "
            f"replay {r['replay_log_ms']:.1f} ms; compact {r['compact_ms']:.1f} ms; "
            f"replay from snapshot {r['replay_snapshot_ms']:.1f} ms")


@bench.command("queue")
@click.argument("what", type=click.Choice(["restart", "latency", "memory"]))
@click.option("--jobs", type=click.IntRange(min=1), multiple=True,
              help="restart: jobs in the log (repeat the option) [1000 and 10000]; latency: jobs to submit [20]; "
                   "memory: jobs kept queued [10000]")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="restart: restarts timed per log size")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def queue(what: str, jobs: tuple[int, ...], repeat: int, as_json: bool) -> None:
    """The global queue's own figures: restart to ready by the size of its log (restart), submit to
    launch on a running cluster (latency: start one with `hier-sched up`), and the memory of a queue
    holding N queued jobs (memory)."""
    from hier_sched.front.bench.queue import queued_memory, restart_to_ready, submit_to_launch

    if what == "latency":
        with _stdout_to_stderr(as_json):  # Ray's connection may print; with --json stdout holds the JSON only
            result = submit_to_launch((jobs or (20,))[0])
        click.echo(json.dumps(result) if as_json else
                   f"submit to launch over {result['jobs']} jobs: p50 {result['p50_s']:.3f} s, "
                   f"p90 {result['p90_s']:.3f} s, max {result['max_s']:.3f} s")
        return
    if what == "memory":
        result = queued_memory((jobs or (10000,))[0])
        click.echo(json.dumps(result) if as_json else
                   f"{result['jobs']:,} jobs queued: queue state {result['queue_state_mib']:.1f} MiB "
                   f"({result['per_job_kib']:.2f} KiB per job, process {result['process_before_mib']:.0f} MiB before); "
                   f"submit {result['submit_per_job_ms']:.2f} ms per job; restart to ready "
                   f"{result['restart_to_ready_s']:.2f} s, {result['queued_after_restart']:,} queued again, "
                   f"{result['restarted_state_mib']:.1f} MiB")
        return
    rows = restart_to_ready(jobs or (1000, 10000), repeat)
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        click.echo(f"{r['jobs']:>6} jobs ({r['records']} records): restart to ready "
                   f"{r['restart_to_ready_s_median']:.3f} s median (min {r['min_s']:.3f}, max {r['max_s']:.3f}, "
                   f"{r['repeat']} runs)")


@bench.command("simulator")
@click.option("--jobs", "sizes", type=click.IntRange(min=1), multiple=True, default=(10_000, 100_000),
              show_default=True, help="jobs in the synthetic trace (repeat the option)")
@click.option("--jobs-per-gpu", type=click.IntRange(min=1), default=40, show_default=True,
              help="the cluster grows with the trace: one GPU per this many jobs (at least 8 GPUs)")
@click.option("--policy", type=click.Choice(PRESET_NAMES), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON list")
def simulator(sizes: tuple[int, ...], jobs_per_gpu: int, policy: str, as_json: bool) -> None:
    """Simulator speed at growing scale: a synthetic Philly trace of each size replayed with oracle
    estimates, trace loading and simulation timed (see BENCHMARKS.md, "Replay speed")."""
    from hier_sched.front.bench.simulator import bench_simulator

    points = bench_simulator(sizes, jobs_per_gpu, policy)
    if as_json:
        click.echo(json.dumps(list(points)))
        return
    click.echo(f"{'jobs':>9} {'gpus':>7} {'load s':>7} {'sim s':>8} {'events':>10} {'events/s':>9} {'us/job':>7}")
    for p in points:
        click.echo(f"{p['jobs']:>9,} {p['gpus']:>7,} {p['load_s']:>7.1f} {p['sim_s']:>8.1f} {p['events']:>10,} "
                   f"{p['events_per_s']:>9,.0f} {p['us_per_job']:>7.0f}")


@bench.command("robustness")
@click.option("--trace", "trace_names", multiple=True,
              help="a trace to replay (repeat the option) [the four thesis traces, carma:philly_*]")
@click.option("--seeds", type=click.IntRange(min=1), default=10, show_default=True,
              help="arrival jitters replayed per trace")
@click.option("--jitter", "jitter_s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="seconds an arrival moves at most")
@click.option("--json", "as_json", is_flag=True, help="print the ratios as one JSON list")
def robustness(trace_names: tuple[str, ...], seeds: int, jitter_s: float, as_json: bool) -> None:
    """Is a policy's advantage robust or luck of timing? Each trace replayed with its arrivals
    jittered, under our default and the thesis' references; the spread of the ratios."""
    from hier_sched.front.bench.robustness import THESIS_TRACES, bench_robustness

    rows = bench_robustness(trace_names or [f"carma:{t}" for t in THESIS_TRACES], seeds, jitter_s)
    if as_json:
        click.echo(json.dumps(list(rows)))
        return
    click.echo(f"arrivals jittered by up to +-{jitter_s:g} s, {seeds} seeds; ratios of total trace time")
    click.echo(f"{'trace':<32} {'ours / oracle MAGM':>28} {'ours / MAGM+GPUMemNet':>28} {'ours wins on both':>18}")
    for r in rows:
        click.echo(f"{r['trace']:<32} {_spread(r['ours_to_oracle_magm']):>28} "
                   f"{_spread(r['ours_to_magm_gpumemnet']):>28} {r['ours_wins_on_both']:>12}/{seeds}")


@bench.command("traces")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def traces(names: tuple[str, ...], as_json: bool) -> None:
    """Load time of each trace source (NAMES, or a default set of every source): cold in a fresh
    interpreter, then warm in the same one (see BENCHMARKS.md, "Traces")."""
    from hier_sched.front.bench.traces import DEFAULT_NAMES, import_seconds, load_times

    import_s = import_seconds()
    rows = load_times(names or DEFAULT_NAMES)
    if as_json:
        click.echo(json.dumps({"import_traces_s": import_s, "traces": list(rows)}))
        return
    click.echo(f"import traces: {import_s:.3f} s (not in the figures below)")
    click.echo(f"{'trace':45} {'jobs':>9} {'cold s':>8} {'warm s':>8}")
    for row in rows:
        click.echo(f"{row['name']:45} {row['jobs']:>9,} {row['cold_s']:>8.3f} {row['warm_s']:>8.3f}")


@bench.command("gpu-model")
@click.option("--residents", type=click.IntRange(min=1), default=8, show_default=True, help="jobs on the GPU")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="rounds timed (the best is kept)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def gpu_model(residents: int, repeat: int, as_json: bool) -> None:
    """Microseconds per call of the emulated GPU's per-event calls: warm (cached) and cold (after
    a change of its residents, what the simulator pays once per launch or exit)."""
    from hier_sched.front.bench.gpu_model import bench_gpu_model

    results = bench_gpu_model(residents, repeat)
    if as_json:
        click.echo(json.dumps({"residents": residents, "repeat": repeat, "us_per_call": dict(results)}))
        return
    click.echo(f"EmulatedGpu A100-40GB, MPS, {residents} residents (best of {repeat})")
    for label, micros in results:
        click.echo(f"  {label:<52} {micros:8.2f} us/call")


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """File descriptor 1 onto 2 for the block (what Ray's threads print goes there too)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _print_chaos(r: dict) -> None:
    from rich.table import Table

    table = Table(title=f"{r['mode']}: seed {r['seed']}, {r['jobs']} jobs, {r['wall_s']:.0f} s", show_header=False)
    for label, value in (
        ("accepted / rejected", f"{r['accepted']} / {r['rejected']}"),
        ("succeeded / failed / cancelled", f"{r['succeeded']} / {r['failed']} / {r['cancelled']}"),
        ("lost / unfinished / ended twice", f"{r['lost']} / {r['unfinished']} / {r['ended_more_than_once']}"),
        ("ran twice (jobs / samples of {0})".format(r["process_samples"]), f"{r['ran_twice']} / {r['duplicate_samples']}"),
        ("left running after the end", str(r["left_running"])),
        ("GPUs booked beyond capacity (samples)", str(r["overbooked_samples"])),
        ("kills: queue / node actor / node / drain / head",
         " / ".join(str(r["kills"].get(k, 0)) for k in ("queue", "node_actor", "node", "drain", "head"))),
        ("attempts per job", f"mean {r['attempts_mean']}, max {r['attempts_max']}, histogram {r['attempts_histogram']}"),
        ("OOM crashes / runs lost with a node", f"{r['oom_crashes']} / {r['runs_lost_with_a_node']}"),
        ("up / trace / down", f"{r['up_s']:.0f} s / {r['trace_s']:.0f} s / {r['down_s']:.0f} s"),
    ):
        table.add_row(label, value)
    console = make_console()
    console.print(table)
    for job, history in r["not_succeeded"].items():
        console.print(f"{job}: " + "; ".join(history), highlight=False, soft_wrap=True)
    why = r["problem_jobs"] or "a job failed, a job was rejected or a kill did not happen"
    console.print("[green]ok[/]" if r["ok"] else f"[red]FAILED[/]: {why}")


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
