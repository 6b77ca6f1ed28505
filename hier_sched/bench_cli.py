"""``hier-sched bench ...``: the measurements behind BENCHMARKS.md, one command each.

Each prints a table, or with ``--json`` one JSON object (what the acceptance checks read). These
are measurements, not tests: run them on an otherwise idle machine for figures to quote.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

import click

from hier_sched.common.console import console as make_console
from hier_sched.core.presets import PRESET_NAMES

__all__ = ["bench"]


@click.group("bench")
def bench() -> None:
    """Measure the scheduler: the figures of BENCHMARKS.md, each with the command that made it."""


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
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def decide(gpus: int, queued: int, nodes_of: int, policy: str, repeat: int, warmup_s: float, seed: int,
           as_json: bool) -> None:
    """How long one scheduling decision takes on a busy cluster with a long queue.

    One decision is one step of the core that plans: an event in (a run ended, a job arrived, a
    GPU's grace or monitoring window settled), the cluster's snapshots given, the launch commands
    out. The cluster is kept saturated, with --queued jobs always waiting (see BENCHMARKS.md).
    """
    if gpus % nodes_of:
        raise click.BadParameter(f"{gpus} GPUs do not split into nodes of {nodes_of}; use a multiple of --nodes-of",
                                 param_hint="--gpus")
    from replay.decide_bench import bench_decide

    result = bench_decide(gpus=gpus, queued=queued, nodes_of=nodes_of, policy=policy, repeat=repeat,
                          warmup_s=warmup_s, seed=seed)
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    table = Table(title=f"one decision at {gpus:,} GPUs x {queued:,} queued ({policy})", show_header=False)
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
@click.option("--jobs", type=click.IntRange(min=1), default=1000, show_default=True, help="no-op jobs on each path")
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True, help="local emulated Ray nodes")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--share", type=click.IntRange(min=1), default=4, show_default=True,
              help="plain Ray's jobs per GPU (num_gpus = 1/share)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def dispatch(jobs: int, nodes: int, gpus_per_node: int, share: int, as_json: bool) -> None:
    """N no-op jobs through hier_sched.submit and as plain Ray tasks, on one local cluster.

    Starts its own local cluster of emulated nodes (and stops it), runs plain Ray's tasks with
    fractional num_gpus first, then the same functions through the scheduler; prints both times
    and their ratio (see BENCHMARKS.md, "Dispatch against plain Ray").
    """
    from hier_sched.dispatch_bench import DispatchConfig, bench_dispatch

    with _stdout_to_stderr(as_json):  # Ray prints its raylets' warnings to stdout; with --json that holds the JSON only
        result = bench_dispatch(DispatchConfig(jobs=jobs, nodes=nodes, gpus_per_node=gpus_per_node, share=share))
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    table = Table(title=f"{jobs:,} no-op jobs on {nodes} nodes x {gpus_per_node} emulated GPUs", show_header=False)
    table.add_row("plain Ray", f"{result['plain_ray_s']:.2f} s ({result['plain_ray_jobs_per_s']:.0f} jobs/s)")
    table.add_row("hier_sched", f"{result['hier_sched_s']:.2f} s ({result['jobs_per_s']:.0f} jobs/s; "
                                f"submitting took {result['hier_sched_submit_s']:.2f} s)")
    table.add_row("ratio", f"{result['ratio']:.2f}")
    table.add_row("job states", ", ".join(f"{k} {v}" for k, v in sorted(result["states"].items())))
    make_console().print(table)


@bench.command("chaos")
@click.option("--small", is_flag=True, help="the CI size (tests/test_chaos.py): 14 jobs, one kill of each kind")
@click.option("--jobs", type=click.IntRange(1, 90), default=None, help="first N jobs of the trace [full: 90]")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
              help="wall seconds per trace second [full: 0.01]")
@click.option("--queue-kills", type=click.IntRange(min=0), default=None, help="GlobalQueue actor kills [full: 3]")
@click.option("--node-actor-kills", type=click.IntRange(min=0), default=None, help="node actor kills [full: 3]")
@click.option("--node-kills", type=click.IntRange(min=0), default=None,
              help="worker nodes killed (and brought back) [full: 2]")
@click.option("--kill-every", "kill_every_s", type=click.FloatRange(min=0), default=None,
              help="wall seconds between kills [full: 14]")
@click.option("--oom-storm", is_flag=True, help="every job claims half its true peak (estimator none)")
@click.option("--seed", type=int, default=None, help="seed of the kill schedule and its targets [14]")
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
def chaos(small: bool, as_json: bool, **overrides: object) -> None:
    """Kill the GlobalQueue, node actors and worker nodes while an emulated trace runs on a local
    3-node cluster; then check that every accepted job ended exactly once and that no job ever
    ran twice at the same time (sampled from the live OS processes). Exits 1 when a check fails.
    On this machine only: it starts and stops a cluster of its own."""
    import dataclasses

    from hier_sched.chaos_bench import SMALL, ChaosPlan, run_chaos

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
        ("kills: queue / node actor / node", " / ".join(str(r["kills"][k]) for k in ("queue", "node_actor", "node"))),
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
