"""``hier-sched replay``: one policy on one trace, or the thesis' whole matrix with ``--compare``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hier_sched.common.console import console as make_console
from hier_sched.common.console import progress
from hier_sched.core.presets import PRESET_NAMES
from hier_sched.core.slots import SLOT_GRACE_S
from replay.cluster import REPORT_DELAY_S
from replay.estimates import ESTIMATOR_CHOICES

__all__ = ["replay"]


@click.command("replay")
@click.option("--trace", "trace_name", required=True, help="carma:NAME, gavel:NAME, openb:default, synthetic:philly?jobs=N&gpus=G&seed=S, "
                   "philly-vc:VC,...?..., helios-vc:VC,...?..., or a CSV/JSON file")
@click.option("--policy", type=click.Choice(PRESET_NAMES), default="auto", show_default=True)
@click.option("--estimator", type=click.Choice(ESTIMATOR_CHOICES), default="ours", show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="default: the trace's cluster (1 for the thesis traces)")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None)
@click.option("--gpu-type", default=None, help="e.g. A100-40GB (default: the trace's)")
@click.option("--nodes-spec", default=None, metavar="TYPE:COUNTxGPUS,...",
              help="a cluster of several node types, e.g. V100-16GB:4x1,A100-40GB:4x1 (instead of --nodes, "
                   "--gpus-per-node, --gpu-type)")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="the same as a YAML/JSON file: a list of {type, count, gpus}")
@click.option("--type-agnostic", is_flag=True,
              help="on a cluster of several GPU types, try the types in cluster order instead of the fastest "
                   "first with big GPUs kept for big jobs (to compare)")
@click.option("--sharing", type=click.Choice(["mps", "streams", "mig", "none"]), default="mps", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--jitter", "jitter_s", type=click.FloatRange(min=0), default=0.0,
              help="shift each arrival by up to this many seconds, drawn with --seed: try a few seeds to see "
                   "whether a result is robust or luck of timing")
@click.option("--slot", "slot_length_s", type=click.FloatRange(min=1), default=None, help="fixed time slot length in seconds (checkpoint-signal protocol)")
@click.option("--slot-grace", "slot_grace_s", type=click.FloatRange(min=0), default=SLOT_GRACE_S, show_default=True)
@click.option("--report-delay", "report_delay_s", type=click.FloatRange(min=0), default=REPORT_DELAY_S, show_default=True,
              help="seconds until what happens on a node reaches the planner (the live queue: its tick plus the "
                   "report's round trip); 0: at once")
@click.option("--queues", "queues_file", type=click.Path(dir_okay=False), default=None,
              help="team queues with GPU quotas (the file of `hier-sched queues apply`); a job's queue is its user's")
@click.option("--compare", is_flag=True, help="run the thesis' policy x estimator matrix on the trace")
@click.option("--tenants-compare", is_flag=True,
              help="a cluster shared by tenants three ways: FIFO, strict quotas, quotas with borrowing and reclaim "
                   "(quotas: the tenant trace's, e.g. philly-vc:/helios-vc:, or --queues' nominal GPUs)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True), default=None, help="write the result(s) as JSON")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None, help="write PNG figures here")
@click.option("--quiet", is_flag=True, help="no progress bar")
def replay(trace_name, policy, estimator, nodes, gpus_per_node, gpu_type, nodes_spec, cluster_file, type_agnostic,
           sharing, seed, jitter_s, slot_length_s, slot_grace_s, report_delay_s, queues_file, compare, tenants_compare,
           json_out, plots_dir, quiet) -> None:
    """Replay a trace in the discrete-event simulator, with the live scheduler's placement code."""

    from hier_sched.common.spec_files import load_queues
    from hier_sched.core.spec import SpecError
    from replay.cluster_spec import load_cluster_file, parse_nodes_spec
    from replay.run import ReplayOptions
    from traces import load_trace
    from traces.schema import TraceError

    console = make_console(stderr=True)
    try:
        trace = load_trace(trace_name, seed=seed)
    except (TraceError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        queues = load_queues(queues_file) if queues_file else None
    except SpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--queues") from None
    if nodes_spec and cluster_file:
        raise click.UsageError("give the cluster once: --nodes-spec or --cluster")
    try:
        groups = parse_nodes_spec(nodes_spec) if nodes_spec else load_cluster_file(cluster_file) if cluster_file else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes-spec" if nodes_spec else "--cluster") from None
    base = ReplayOptions(policy=policy, estimator=estimator, nodes=nodes, gpus_per_node=gpus_per_node,
                         gpu_type=gpu_type, sharing=sharing, seed=seed, slot_length_s=slot_length_s,
                         slot_grace_s=slot_grace_s, jitter_s=jitter_s, report_delay_s=report_delay_s,
                         queues=queues, node_groups=groups, type_aware=not type_agnostic)
    if compare and tenants_compare:
        raise click.UsageError("choose one comparison: --compare or --tenants-compare")
    if tenants_compare and plots_dir:
        raise click.UsageError("--plots draws one replay or the thesis matrix, not --tenants-compare")
    try:
        if compare:
            _compare(trace, base, console, json_out, plots_dir, quiet)
        elif tenants_compare:
            _tenants_compare(trace, base, json_out, quiet)
        else:
            _single(trace, base, console, json_out, plots_dir, quiet)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _single(trace, opts, console, json_out, plots_dir, quiet) -> None:
    from dataclasses import replace

    from replay.plots import plot_run
    from replay.run import run_replay
    from replay.tenant_runs import alone_jcts, tenant_quotas

    quotas = tenant_quotas(trace, opts)
    alone = alone_jcts(trace, opts, quotas, _bar(quiet)) if quotas else None  # for the tenants' rho
    with progress(f"replaying {trace.name}", len(trace.jobs), unit="jobs", enabled=not quiet) as update:
        result, sim = run_replay(trace, opts, progress=update, alone_jct=alone)
    _print_single(result, sim)
    if quotas:
        _print_tenants(trace.name, quotas, [("", result)])
    if json_out:
        Path(json_out).write_text(json.dumps(result.to_json(), indent=2))
    if plots_dir:
        baseline = None
        if opts.policy != "exclusive":  # the figures set the run beside exclusive GPUs, as the thesis does
            with progress(f"replaying {trace.name} on exclusive GPUs for the plots", len(trace.jobs), unit="jobs",
                          enabled=not quiet) as update:
                base_result, base_sim = run_replay(trace, replace(opts, policy="exclusive", estimator="none"),
                                                   progress=update)
            baseline = (base_sim, base_result)
        for p in plot_run(sim, result, plots_dir, baseline=baseline):
            click.echo(f"wrote {p}", err=True)


def _compare(trace, base, console, json_out, plots_dir, quiet) -> None:
    from dataclasses import replace

    from replay.matrix import THESIS_MATRIX, thesis_note
    from replay.plots import plot_compare
    from replay.run import run_replay

    rows = []
    for run in THESIS_MATRIX:
        with progress(run.label, len(trace.jobs), unit="jobs", enabled=not quiet) as update:
            result, _ = run_replay(trace, replace(base, policy=run.policy, estimator=run.estimator), progress=update)
        rows.append((run.label, result))
        console.print(f"  {run.label}: {result.makespan_s / 3600:.2f} h, {result.oom_crashes} OOM", highlight=False)
    _print_compare(trace.name, rows, thesis_note)
    if json_out:
        Path(json_out).write_text(json.dumps([{"label": label, **r.to_json()} for label, r in rows], indent=2))
    if plots_dir:
        click.echo(f"wrote {plot_compare(rows, plots_dir)}", err=True)


def _bar(quiet: bool):
    """A progress bar for each replay of a series (``replay.tenant_runs``)."""
    return lambda label, jobs: progress(label, jobs, unit="jobs", enabled=not quiet)


def _tenants_compare(trace, base, json_out, quiet) -> None:
    from replay.tenant_runs import compare_tenants, tenant_quotas

    rows = compare_tenants(trace, base, _bar(quiet))
    _print_tenants(trace.name, tenant_quotas(trace, base), rows)
    _print_sharing(trace.name, rows)
    if json_out:
        Path(json_out).write_text(json.dumps([{"label": label, **r.to_json()} for label, r in rows], indent=2))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _print_tenants(name, quotas, rows) -> None:
    """One row per tenant; each cell holds every run's figure, in the runs' order."""
    from rich.table import Table

    runs = " / ".join(label for label, _ in rows)
    t = Table(title=f"{name}: tenants" + (f" ({runs})" if runs else ""))
    for col in ("tenant", "quota", "jobs", "GPU-hours", "mean wait h", "p95 wait h", "rho"):
        t.add_column(col, justify="left" if col == "tenant" else "right")
    for tenant in rows[0][1].tenants:
        figures = [r.tenants[tenant] for _, r in rows]
        rho = [f"{f['rho']:.2f}" if f["rho"] is not None else "-" for f in figures]
        t.add_row(tenant, str(quotas.get(tenant, "-")), str(figures[0]["jobs"]),
                  " / ".join(f"{f['gpu_hours']:,.0f}" for f in figures),
                  " / ".join(_hours(f["mean_wait_s"]) for f in figures),
                  " / ".join(_hours(f["p95_wait_s"]) for f in figures), " / ".join(rho))
    make_console().print(t)


def _print_sharing(name, rows) -> None:
    from rich.table import Table

    t = Table(title=f"{name}: the cluster ({rows[0][1].gpus} GPUs, {rows[0][1].policy} + {rows[0][1].estimator})")
    for col in ("run", "max rho", "utilization", "total time", "mean wait", "preemptions", "lost GPU-h",
                "saving GPU-h", "OOM"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for label, r in rows:
        used = sum(f["gpu_hours"] for f in r.tenants.values()) or 1.0
        t.add_row(label, f"{r.max_rho:.2f}" if r.max_rho is not None else "-", f"{r.utilization:.1%}",
                  f"{r.makespan_s / 3600:,.0f} h", f"{r.avg_wait_s / 3600:.2f} h", f"{r.preemptions:,}",
                  f"{r.preemption_lost_gpu_hours:,.1f} ({r.preemption_lost_gpu_hours / used:.2%})",
                  f"{r.preemption_saving_gpu_hours:,.1f} ({r.preemption_saving_gpu_hours / used:.2%})",
                  str(r.oom_crashes))
    make_console().print(t)


def _print_single(r, sim) -> None:
    from rich.table import Table

    t = Table(title=f"{r.trace}: {r.policy} + {r.estimator} on {r.nodes} node(s) x {r.gpus // max(r.nodes, 1)} GPU(s), {r.sharing}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("jobs (completed / failed / unschedulable)", f"{r.jobs} ({r.completed} / {r.failed} / {r.unschedulable})"),
        ("total trace time", f"{r.makespan_s / 3600:.2f} h"),
        ("avg waiting / execution / JCT", f"{r.avg_wait_s / 60:.1f} / {r.avg_exec_s / 60:.1f} / {r.avg_jct_s / 60:.1f} min"),
        ("p95 JCT", f"{r.p95_jct_s / 60:.1f} min"),
        ("OOM crashes (jobs recovered)", f"{r.oom_crashes} ({r.recovered})"),
        ("checkpoints at slot ends", f"{r.checkpoints}"),
        ("GPU utilization (busy GPU-time / GPU-time)", f"{r.utilization:.1%}"),
        ("preemptions (GPU-h lost / saving)",
         f"{r.preemptions} ({r.preemption_lost_gpu_hours:,.1f} / {r.preemption_saving_gpu_hours:,.1f})"),
        ("GPU energy", f"{r.energy_mj:.2f} MJ"),
        ("avg SMACT / avg power per GPU", f"{r.avg_smact:.2f} / {r.avg_power_w:.0f} W"),
        ("simulator", f"{r.sim_wall_s:.2f} s wall, {r.events} events ({r.events_per_s:,.0f}/s)"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    make_console().print(t)
    unsched = [j for j in sim.jobs.values() if j.state in ("unschedulable", "failed")]
    for j in unsched[:5]:
        make_console().print(f"[yellow]{j.state}[/]: {j.trace.job_id} ({j.trace.workload}): {j.reason}", highlight=False)
    if len(unsched) > 5:
        make_console().print(f"... and {len(unsched) - 5} more", highlight=False)


def _print_compare(name, rows, thesis_note) -> None:
    from rich.table import Table

    base = rows[0][1]
    t = Table(title=f"{name}: thesis matrix ({base.sharing}, {base.gpus} GPUs); ratios to exclusive")
    for col, just in (("run", "left"), ("time", "right"), ("x excl", "right"), ("wait", "right"), ("JCT", "right"),
                      ("OOM", "right"), ("energy", "right"), ("x excl", "right"), ("thesis (real A100s)", "left")):
        t.add_column(col, justify=just)
    for label, r in rows:
        t.add_row(
            label, f"{r.makespan_s / 3600:.2f} h", f"{r.makespan_s / base.makespan_s:.3f}", f"{r.avg_wait_s / 60:.0f} m",
            f"{r.avg_jct_s / 60:.0f} m", str(r.oom_crashes), f"{r.energy_mj:.1f} MJ",
            f"{r.energy_mj / base.energy_mj:.3f}" if base.energy_mj else "-", thesis_note(name, label),
        )
    make_console().print(t)
