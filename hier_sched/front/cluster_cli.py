"""Cluster commands: ``up``, ``down``, ``info``, ``submit``, ``run``, ``status``, ``wait``,
``cancel``, ``logs``, ``top``, ``queues`` (team queues and their quotas).

They reach the scheduler through Ray (``hier_sched.front.connection``): from any node of the cluster,
with ``RAY_ADDRESS`` or on a node of it, with no state of ours on that machine; one Ray
connection per command. Exit codes: 0 success, 1 failure (a job failed, the scheduler is
unreachable), 2 bad input (an invalid spec, a job the cluster can never run); ``run`` has its
own (``hier_sched.front.run_job``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from estimators.types import parts_sum
from hier_sched.common.console import console, progress
from hier_sched.core.gpu_types import gpu_type as check_type
from hier_sched.core.job import TERMINAL  # str states compare equal to these members
from hier_sched.front.connection import NODE_PATIENCE_S, Scheduler, SchedulerUnavailable, connect
from hier_sched.front.durations import clocks_note, span

__all__ = ["cluster_commands", "wait_for_jobs", "print_jobs", "time_in_state"]



def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _scheduler() -> Scheduler:
    try:
        return connect(command=click.get_current_context().command_path)
    except SchedulerUnavailable as exc:
        _fail(str(exc))


# ---------------------------------------------------------------------- up / down / info
@click.command()
@click.option("--emulated", is_flag=True, help="emulated GPUs (the calibrated GPU model); default on a machine without GPUs")
@click.option("--backend", type=click.Choice(["auto", "emulated", "nvml", "dcgm"]), default="auto", show_default=True)
@click.option("--nodes", type=click.IntRange(1), default=2, show_default=True,
              help="Ray nodes to start on this machine (not with --address)")
@click.option("--gpus-per-node", type=click.IntRange(1), default=4, show_default=True)
@click.option("--gpu-type", default="A100-40GB", show_default=True, help="emulated GPU type")
@click.option("--node", "node_specs", multiple=True, metavar="TYPE:N",
              help="one emulated node of N GPUs of TYPE (repeatable: --node A100-40GB:2 --node H100-80GB:2 makes "
                   "a mixed cluster); instead of --nodes/--gpus-per-node/--gpu-type")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="wall seconds per emulated second (0.01: a 3000 s job takes 30 s)")
@click.option("--policy", default="auto", show_default=True, help="auto (ours), or a thesis policy: exclusive, round-robin, first-fit, best-fit, magm, lug")
@click.option("--estimator", default="auto", show_default=True, help="default estimator for specs that name none")
@click.option("--sharing", type=click.Choice(["mps", "streams", "none"]), default="mps", show_default=True)
@click.option("--address", default=None,
              help="put the scheduler on this running Ray cluster (HOST:PORT of its head) instead of starting one")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="the scheduler's state directory on the cluster's nodes (the same path on each; the global "
                   "queue's on the head)  [default: this machine's HIER_SCHED_STATE_DIR, made absolute]")
@click.option("--mps-daemon", is_flag=True, help="real GPUs: start and stop an MPS control daemon per node")
@click.option("--allowed-root", "allowed_roots", multiple=True, metavar="DIR",
              help="accept only jobs whose workdir and checkpoint_dir lie under DIR (repeatable; absolute; "
                   "symbolic links and '..' resolved)  [default: anywhere the cluster's user may write]")
@click.option("--autoscale", metavar="MIN:MAX", default=None,
              help="a local cluster whose GPU workers (--gpus-per-node emulated GPUs of --gpu-type each) Ray's own "
                   "autoscaler adds when jobs wait and removes when idle, between MIN and MAX workers; the head "
                   "has no GPU (docs/cluster.md, 'Elastic clusters')")
@click.option("--idle-timeout-s", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="with --autoscale: an idle worker is removed after this long")
def up(emulated: bool, backend: str, nodes: int, gpus_per_node: int, gpu_type: str, node_specs: tuple[str, ...],
       time_scale: float, policy: str, estimator: str, sharing: str, address: str | None, state_dir: str | None,
       mps_daemon: bool, allowed_roots: tuple[str, ...], autoscale: str | None, idle_timeout_s: float) -> None:
    """Start the scheduler on a Ray cluster (a local one, or --address); returns when ready.

    \b
    The scheduler's actors live in the Ray cluster: nothing of hier_sched keeps running here,
    and clients on any node find it with RAY_ADDRESS (or on a node of the cluster).
    """
    from hier_sched.core.presets import preset
    from hier_sched.front.deploy import DeployError, start_cluster
    from hier_sched.front.local_cluster import ClusterConfig, LocalRayError

    try:
        preset(policy)
        check_type(gpu_type)
        shape = _node_shape(node_specs, 1 if autoscale else nodes, gpus_per_node, gpu_type)
        bounds = _autoscale_bounds(autoscale) if autoscale else None
    except ValueError as exc:
        _fail(str(exc), 2)
    chosen = "emulated" if emulated else backend
    if chosen == "auto":
        chosen = _auto_backend()
    try:
        config = ClusterConfig(node_specs=shape, time_scale=time_scale,
                               policy=policy, estimator=estimator, backend=chosen, sharing=sharing, address=address,
                               mps_daemon=mps_daemon, allowed_roots=allowed_roots, autoscale=bounds,
                               idle_timeout_s=idle_timeout_s)
    except ValueError as exc:
        _fail(str(exc), 2)
    t0 = time.time()
    try:
        record = start_cluster(config, scheduler_state_dir=Path(state_dir) if state_dir else None)
    except (DeployError, LocalRayError, SchedulerUnavailable) as exc:
        _fail(str(exc))
    where = ("attached to" if address else
             f"a head and {bounds[0]}-{bounds[1]} autoscaled worker(s) of {gpus_per_node}x {gpu_type} ({chosen}), local"
             if bounds else f"{config.describe_nodes()} ({chosen}), local")
    click.echo(f"hier_sched up in {time.time() - t0:.1f} s: {where} Ray cluster {record.address}; policy {policy}, "
               f"time scale {time_scale}; state {record.state_dir}")
    if record.dashboard_url:
        click.echo(f"Ray dashboard: {record.dashboard_url}")
    click.echo(f"from any node: RAY_ADDRESS={record.address} hier-sched submit job.yaml | run job.yaml | status; "
               "hier-sched down")


def _autoscale_bounds(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"--autoscale {text!r}: give MIN:MAX worker counts, e.g. 0:3")
    return int(low), int(high)


def _node_shape(node_specs: tuple[str, ...], nodes: int, gpus_per_node: int, gpu_type: str) -> tuple[tuple[str, int], ...]:
    """(GPU type, GPUs) of each node: one per ``--node TYPE:N``, else the uniform flags'. The two
    ways cannot be mixed (which would win is a guess)."""
    if not node_specs:
        return ((gpu_type, gpus_per_node),) * nodes
    ctx = click.get_current_context()
    given = [f"--{p.replace('_', '-')}" for p in ("nodes", "gpus_per_node", "gpu_type")
             if ctx.get_parameter_source(p) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise ValueError(f"--node describes each node; leave out {', '.join(given)}")
    shape = []
    for text in node_specs:
        kind, sep, count = text.rpartition(":")
        if not sep or not kind or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--node {text!r}: expected TYPE:N, e.g. A100-40GB:2 (N GPUs, at least 1)")
        check_type(kind)
        shape.append((kind, int(count)))
    return tuple(shape)


def _auto_backend() -> str:
    from node_actor.backends.nvml import NvmlBackend

    return "nvml" if NvmlBackend.available() else "emulated"


@click.command()
def down() -> None:
    """Stop what `up` started: the scheduler's actors (their jobs cancelled), and the Ray
    processes only if `up` started them (never `ray stop`). Without a record of `up` in the
    state directory: the scheduler on the cluster RAY_ADDRESS names."""
    from hier_sched.front.deploy import stop_cluster

    t0 = time.time()
    done = stop_cluster(fallback_address=os.environ.get("RAY_ADDRESS", "").strip() or None)
    if done is None:
        click.echo("no hier_sched cluster recorded here (and no RAY_ADDRESS): nothing to stop")
    else:
        click.echo(f"hier_sched down in {time.time() - t0:.1f} s: {done}")


@click.command()
@click.option("--json", "as_json", is_flag=True,
              help='{"dashboard_url", "metrics_urls", "nodes", "gpus", "policy", "state_dir", ...}')
def info(as_json: bool) -> None:
    """Where the running cluster's endpoints are: Ray dashboard, metrics, nodes, GPUs."""
    from hier_sched.front.cluster_info import cluster_info

    try:
        facts = cluster_info(_scheduler())
    except SchedulerUnavailable as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(facts, indent=1))
        return
    click.echo(f"Ray cluster {facts['ray_address']}: {len(facts['nodes'])} node(s), {facts['gpus']} GPU(s), "
               f"policy {facts['policy']}, time scale {facts['time_scale']}")
    notes = {"released": " (released: idle, left to the autoscaler)", "draining": " (draining: takes no new job)",
             "drained": " (drained: takes no new job)"}
    click.echo("nodes: " + ", ".join(f"{n['name']} {n['gpus']}x {n['gpu_type']}{notes.get(n['state'], '')}"
                                     for n in facts["nodes"]))
    click.echo(f"Ray dashboard: {facts['dashboard_url'] or 'not running'}")
    for url in facts["metrics_urls"]:
        click.echo(f"metrics: {url}")
    click.echo(f"scheduler state: {facts['state_dir']} (on the head node)")


# ---------------------------------------------------------------------- jobs
def _call(method: str, *args: Any, whole: bool = False) -> Any:
    """``GlobalQueue.<method>(*args)``; an unreachable scheduler or an error answer ends the command.
    ``whole``: asked again while a node's part is missing (``Scheduler.call_whole``)."""
    try:
        scheduler = _scheduler()
        answer = scheduler.call_whole(method, *args) if whole else scheduler.call(method, *args)
    except SchedulerUnavailable as exc:
        _fail(str(exc))
    if isinstance(answer, dict) and "error" in answer:
        _fail(answer["error"])
    return answer


def spec_payload(path: str, *, bad_input_code: int = 2) -> dict[str, Any]:
    """The fields the user wrote (unset ones stay unset: the cluster's defaults apply), with a
    relative workdir made absolute against the submitting shell's directory."""
    from hier_sched.common.spec_files import load_spec
    from hier_sched.core.spec import SpecError

    try:
        spec = load_spec(path)
    except SpecError as exc:
        _fail(str(exc), bad_input_code)
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["workdir"] = str(Path(os.getcwd(), data.get("workdir") or ".").resolve())
    return data


SPEC_SUFFIXES = (".yaml", ".yml", ".toml", ".json")


@click.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help='print {"job_id": ...} (several specs: a list, one per spec)')
@click.option("--quiet", "-q", is_flag=True, help='print only the job id (for job=$(hier-sched submit -q ...))')
def submit(specs: tuple[str, ...], as_json: bool, quiet: bool) -> None:
    """Queue the job described by each SPEC (.yaml, .toml or .json; a directory: every such file in it).

    Several specs go in one call and one durable write; each is judged alone: a refused one is
    named (exit code 2) and the others are queued all the same.
    """
    files = _spec_files(specs)
    if len(files) > 1 or Path(specs[0]).is_dir():
        _submit_many(files, as_json, quiet)
        return
    from hier_sched.front.ray_job_env import inherit_ray_job_env

    spec = files[0]
    data = spec_payload(spec)
    scheduler = _scheduler()  # connected: inside a Ray job, its runtime_env goes with the spec
    try:
        answer = scheduler.submit(inherit_ray_job_env(data))
    except SchedulerUnavailable as exc:
        _fail(str(exc))
    if "error" in answer:
        _fail(answer["error"], 2)
    if answer.get("warning"):
        click.echo(f"warning: {answer['job_id']}: {answer['warning']}", err=True)
    job_id = answer["job_id"]
    estimating = answer.get("state") == "estimating"  # accepted; queued when its estimate arrives
    click.echo(json.dumps({"job_id": job_id, **({"state": "estimating"} if estimating else {})}) if as_json else
               job_id if quiet else f"submitted {job_id}" + (" (estimating its memory where its code lives)"
                                                             if estimating else ""))


def _spec_files(specs: tuple[str, ...]) -> list[str]:
    """The spec files named, a directory's in name order."""
    files: list[str] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            found = sorted(str(p) for p in path.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
            if not found:
                _fail(f"{spec}: no job spec files ({', '.join(SPEC_SUFFIXES)}) in this directory", 2)
            files += found
        else:
            files.append(spec)
    return files


def _submit_many(files: list[str], as_json: bool, quiet: bool) -> None:
    """Several spec files in one ``submit_many`` call; a file that cannot be read or parsed is
    refused alone, by name, as is each spec the queue refuses."""
    from hier_sched.common.spec_files import load_spec
    from hier_sched.core.spec import SpecError
    from hier_sched.front.ray_job_env import inherit_ray_job_env

    outcomes: dict[str, dict[str, Any]] = {}
    payloads: dict[str, dict[str, Any]] = {}
    for path in files:
        try:
            data = load_spec(path).model_dump(mode="json", exclude_unset=True)
        except SpecError as exc:
            outcomes[path] = {"error": str(exc)}
            continue
        data["workdir"] = str(Path(os.getcwd(), data.get("workdir") or ".").resolve())
        payloads[path] = data
    if payloads:
        try:
            scheduler = _scheduler()  # connected first: inside a Ray job, its runtime_env goes with the specs
            answers = scheduler.submit_many([inherit_ray_job_env(d) for d in payloads.values()])
        except SchedulerUnavailable as exc:
            _fail(str(exc))
        outcomes.update(zip(payloads, answers))
    for path in files:
        answer = outcomes[path]
        if answer.get("warning"):
            click.echo(f"warning: {answer['job_id']}: {answer['warning']}", err=True)
        if "error" in answer and not as_json:
            click.echo(f"refused {path}: {answer['error']}", err=True)
        elif not as_json:
            click.echo(answer["job_id"] if quiet else f"submitted {answer['job_id']} ({path})")
    if as_json:
        click.echo(json.dumps([{"spec": path, **({"job_id": outcomes[path]["job_id"]} if "job_id" in outcomes[path]
                                                 else {"error": outcomes[path]["error"]})} for path in files]))
    if any("error" in outcomes[path] for path in files):
        sys.exit(2)


@click.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: a list of job objects, or one object with JOB_ID")
def status(job_id: str | None, as_json: bool) -> None:
    """Show jobs (all, or JOB_ID)."""
    answer = _call("status", job_id)
    if job_id is not None and answer is None:
        _fail(f"no job {job_id!r}")
    if as_json:
        click.echo(json.dumps(answer, indent=1))
        return
    print_jobs([answer] if job_id else answer, time_scale=_call("settings")["time_scale"])
    if job_id is not None:
        for line in estimate_lines(answer):
            click.echo(line)


def estimate_lines(job: dict[str, Any]) -> list[str]:
    """How the job's estimate was made and, per GPU type, what it holds (``status JOB``)."""
    lines = [f"estimate: {job['estimate_source']}"] if job.get("estimate_source") else []
    for gpu, parts in sorted((job.get("estimate_parts") or {}).items()):
        lines.append(f"  {gpu}: {job.get('estimates', {}).get(gpu, 0):.0f} MiB = {parts_sum(parts)}")
    return lines


def time_in_state(job: dict[str, Any], now: float, time_scale: float) -> str:
    """How long, in wall-clock time (and emulated beside it, ``durations.span``): a waiting job
    since it was submitted, a running one since its current run started, an ended one from its
    submission to its end."""
    state = job["state"]
    if state in TERMINAL:
        wall = (job["end_time"] or now) - job["submit_time"]
    elif state in ("running", "checkpointing"):
        since = job.get("run_start_time") or job["start_time"]
        wall = now - since if since else None
    else:
        wall = now - job["submit_time"]
    return span(wall, time_scale)


def print_jobs(jobs: list[dict[str, Any]], title: str | None = None, *, ids: bool = True,
               time_scale: float | None = None) -> None:
    """A table of job objects; ``ids=False`` (the demo) leaves out ids and reasons; with the
    cluster's ``time_scale``, how long each job has waited, run or taken (``time_in_state``)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    timed = time_scale is not None
    note = clocks_note(time_scale) if timed else ""
    # no vertical rules, and no name column where every id starts with its job's name (ids are
    # "<name>-<8 hex>"): the reason gets the room
    table = Table(title=title, caption=note or None, box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    named = not ids or not all(j["job_id"].startswith(f"{j['name']}-") for j in jobs)
    teams = any((j.get("queue") or "default") != "default" for j in jobs)  # team queues in use
    columns = (("job",) * ids + ("name",) * named + ("queue",) * teams + ("state",) + ("time",) * timed
               + ("node", "gpus", "att.", "OOM", "est. MiB", "peak MiB") + ("reason",) * ids)
    # ids, names, states and nodes are copied whole (also from a pipe, 120 columns wide), times
    # too: only the reason folds
    now = time.time()
    times = {j["job_id"]: time_in_state(j, now, time_scale) for j in jobs} if timed else {}
    whole = {"job": "job_id", "name": "name", "queue": "queue", "state": "state", "node": "node"}
    for column in columns:
        field = whole.get(column)
        width = (max([len(column), *(len(str(j[field] or "-")) for j in jobs)]) if field else
                 max(map(len, times.values()), default=0) if column == "time" else None)
        table.add_column(column, overflow="fold", no_wrap=field is not None, min_width=width)
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for j in jobs:
        state = j["state"]
        gpus = ",".join(map(str, j["gpus"])) if isinstance(j["gpus"], list) else str(j["gpus"])
        # (what users and the scheduler wrote is escaped: "pip: [transformers]" is no markup tag)
        reason = "" if state == "succeeded" else escape(j["reason"] or "")
        table.add_row(*(escape(j["job_id"]),) * ids, *(escape(j["name"]),) * named,
                      *(escape(j.get("queue") or "default"),) * teams,
                      f"[{colour.get(state, 'white')}]{state}[/]",
                      *(times.get(j["job_id"], ""),) * timed, j["node"] or "-",
                      gpus, str(j["attempts"]), str(j["oom_crashes"]),
                      f"{j['estimate_mib']:.0f}" if j["estimate_mib"] else "-",
                      f"{j['observed_peak_mib']:.0f}" if j["observed_peak_mib"] else "-", *(reason,) * ids)
    console().print(table)


def wait_for_jobs(scheduler: Scheduler, job_ids: list[str] | None, timeout_s: float | None, poll_s: float = 0.5,
                  on_poll: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Poll until every job (all when ``job_ids`` is empty) has ended; returns their objects.
    ``on_poll`` sees the jobs after every poll (a progress bar)."""
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        jobs = scheduler.call("status", None)
        if job_ids:
            by_id = {j["job_id"]: j for j in jobs}
            missing = [i for i in job_ids if i not in by_id]
            if missing:
                raise LookupError(f"no such job(s): {', '.join(missing)}")
            jobs = [by_id[i] for i in job_ids]
        if on_poll is not None:
            on_poll(jobs)
        if all(j["state"] in TERMINAL for j in jobs):
            return jobs
        if deadline is not None and time.time() >= deadline:
            raise TimeoutError([j for j in jobs if j["state"] not in TERMINAL])
        time.sleep(poll_s)


@click.command(name="wait")
@click.argument("job_ids", nargs=-1)
@click.option("--timeout", type=float, default=None, help="seconds; exit 1 when jobs are still running then")
def wait_cmd(job_ids: tuple[str, ...], timeout: float | None) -> None:
    """Wait until the jobs (default: all) have ended; exit 0 only if all succeeded."""
    try:
        with progress("jobs ended", unit="jobs") as update:
            jobs = wait_for_jobs(_scheduler(), list(job_ids), timeout,
                                 on_poll=lambda jobs: update(sum(j["state"] in TERMINAL for j in jobs), len(jobs)))
    except (SchedulerUnavailable, LookupError) as exc:
        _fail(str(exc))
    except TimeoutError as exc:
        pending = exc.args[0]
        _fail(f"timeout: {len(pending)} job(s) not done: " + ", ".join(f"{j['job_id']} ({j['state']})" for j in pending))
    bad = [j for j in jobs if j["state"] != "succeeded"]
    for j in bad:
        click.echo(f"{j['job_id']}: {j['state']}: {j['reason']}", err=True)
    click.echo(f"{len(jobs) - len(bad)}/{len(jobs)} succeeded")
    sys.exit(1 if bad else 0)


@click.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a queued or running job."""
    answer = _call("cancel", job_id)
    click.echo(f"{job_id}: {answer['state']}")


@click.command()
@click.argument("node")
@click.option("--deadline", "deadline_s", type=click.FloatRange(0), default=None,
              help="seconds from now after which jobs still on the node are stopped and requeued "
                   "(default: jobs that cannot checkpoint finish there)")
@click.option("--reason", default="asked by an operator", show_default=True, help="shown in the jobs' status")
def drain(node: str, deadline_s: float | None, reason: str) -> None:
    """Take no new job on NODE and move its jobs elsewhere: each job that saves checkpoints
    gets the checkpoint signal now and resumes on another node; the others finish where
    they are, or are stopped and requeued at --deadline. `undrain` reverses it."""
    answer = _call("drain_node", node, deadline_s, reason)
    jobs = answer["jobs"]
    until = "" if deadline_s is None else f"; what still runs there in {deadline_s:g} s is stopped and requeued"
    click.echo(f"{node}: {answer['state']}: takes no new job; "
               + (f"{len(jobs)} job(s) still there ({', '.join(jobs)}): those that checkpoint were signalled{until}"
                  if jobs else "no job runs there"))


@click.command()
@click.argument("node")
def undrain(node: str) -> None:
    """Let NODE take new jobs again (after `drain`)."""
    _call("undrain_node", node)
    click.echo(f"{node}: takes new jobs again")


@click.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="keep printing until the job ends")
def logs(job_id: str, follow: bool) -> None:
    """Print a job's output (stdout and stderr of every attempt)."""
    offset = 0
    while True:
        answer = _call("read_log", job_id, offset, whole=True)
        if answer.get("waiting_on"):  # still busy after the patience: following waits on, a read says so
            if follow:
                continue
            click.echo(f"hier-sched logs: node(s) {', '.join(answer['waiting_on'])} did not answer in "
                       f"{NODE_PATIENCE_S:.0f} s; ask again", err=True)
            sys.exit(1)
        if answer["text"]:
            click.echo(answer["text"], nl=False)
        offset = answer["offset"]
        if not follow or (answer["done"] and not answer["text"]):
            return
        time.sleep(0.5)


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
def run(spec: str) -> None:
    """Submit SPEC, stream the job's output, and exit with the job's exit code.

    \b
    0 succeeded; N the job's own exit code (128+S when killed by signal S); 1 failed without
    a code of its own; 65 rejected at submit; 69 scheduler unreachable; 75 cancelled (also
    by SIGINT/SIGTERM to this command, which cancels the job). The entrypoint for
    `ray job submit -- hier-sched run SPEC`.
    """
    from hier_sched.front.ray_job_env import inherit_ray_job_env
    from hier_sched.front.run_job import RunExit, run_job

    data = spec_payload(spec, bad_input_code=RunExit.REJECTED)
    try:
        scheduler = connect()
    except SchedulerUnavailable as exc:
        click.echo(f"hier-sched run: {exc}", err=True)
        sys.exit(RunExit.UNREACHABLE)
    code = run_job(scheduler, inherit_ray_job_env(data))
    if code == RunExit.CANCELLED:
        # `ray job stop` SIGKILLs 3 s after its SIGTERM, and Ray's teardown of this driver at exit
        # takes 1-1.2 s on an idle machine, more on a busy one (BENCHMARKS.md, "ray job stop");
        # the queue has taken the cancel already, so nothing is left to do: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.command()
@click.option("--once", is_flag=True, help="draw one frame and exit")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="seconds between refreshes")
@click.option("--demo-data", type=click.Path(dir_okay=False, exists=True), hidden=True,
              help="draw this saved view (JSON: now, cluster, jobs, events) instead of asking the cluster")
def top(once: bool, interval: float, demo_data: str | None) -> None:
    """Live view: nodes, GPUs, the queues and why jobs wait, running jobs, recent events (q quits).

    Piped or redirected, it prints one plain table instead."""
    from hier_sched.front.top_live import run_top
    from hier_sched.front.top_view import file_fetcher

    try:
        fetch = file_fetcher(demo_data) if demo_data else _top_fetcher()
    except ValueError as exc:
        _fail(str(exc), 2)
    sys.exit(run_top(fetch, interval=interval, once=once))


def _top_fetcher():
    from hier_sched.front.top_view import ApiFetcher

    scheduler = _scheduler()
    return ApiFetcher(lambda method, body: scheduler.call(method, *body.values(), timeout=5.0))


# ---------------------------------------------------------------------- team queues
@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="JSON: a list of queue objects")
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """Show the team queues: quota, GPUs used and borrowed, waiting jobs (set them with `queues apply FILE`)."""
    if ctx.invoked_subcommand is None:
        _print_queues(_call("queues"), as_json)


@queues.command(name="apply")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="JSON: the queues as they are now")
def queues_apply(file: str, as_json: bool) -> None:
    """Set the team queues, their quotas and the priority classes from FILE (YAML, TOML or JSON), e.g.

    \b
    queues:
      - {name: team-a, nominal: {gpus: 2}, borrowing_limit: {gpus: 2}}
      - {name: team-b, nominal: {gpus: 2, memory_mib: 81920}, weight: 2}
    priority_classes:
      - {name: production, value: 100, preemptible: false}

    Every field: docs/queues.md.
    """
    from hier_sched.common.spec_files import load_queues
    from hier_sched.core.spec import SpecError

    try:
        config = load_queues(file)
    except SpecError as exc:
        _fail(str(exc), 2)
    _print_queues(_call("apply_queues", config), as_json)


def _print_queues(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo("no team queues: every job shares the cluster in one queue")
        return
    from rich.table import Table

    def amount(row: dict[str, Any], field: str, none: str = "-") -> str:
        """``2 GPUs``, ``80.0 GiB`` or both, from a row's ``<field>_gpus`` / ``<field>_mib``."""
        gpus, mib = row[f"{field}_gpus"], row[f"{field}_mib"]
        parts = ([] if gpus is None else [f"{gpus:g} GPUs"]) + ([] if mib is None else [f"{mib / 1024:.1f} GiB"])
        return " + ".join(parts) or none

    grouped = any(r["cohort"] for r in rows) or any(r["weight"] != 1 for r in rows)
    table = Table()
    for column in ("queue", *(("cohort", "weight") if grouped else ()), "nominal", "borrowing limit", "used",
                   "borrowed", "fair share", "waiting"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], *((r["cohort"] or "-", f"{r['weight']:g}") if grouped else ()), amount(r, "nominal"),
                      amount(r, "borrowing_limit", "any idle"), amount(r, "used"), amount(r, "borrowed"),
                      amount(r, "fair_share"), str(r["waiting"]))
    console().print(table)


cluster_commands = (up, down, info, submit, run, status, wait_cmd, cancel, logs, top, queues, drain, undrain)
