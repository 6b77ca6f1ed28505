"""Cluster commands: ``up``, ``down``, ``submit``, ``status``, ``wait``, ``cancel``, ``logs``, ``top``.

They talk to the supervisor that ``up`` starts (``hier_sched.local_cluster``) over its local
HTTP API, so none of them imports Ray: a ``submit`` or ``status`` returns in a fraction of a
second. Exit codes: 0 success, 1 failure (a job failed, the cluster is unreachable), 2 bad
input (an invalid spec, a job the cluster can never run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hier_sched.console import console, progress

from hier_sched.local_cluster import ApiError, ClusterConfig, api_call, read_state, state_dir

__all__ = ["cluster_commands", "start_cluster", "stop_cluster", "wait_for_jobs"]

_SUPERVISOR_PID = "supervisor.pid"
_SUPERVISOR_LOG = "supervisor.log"
_TERMINAL = ("succeeded", "failed", "cancelled")


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _supervisor_pid(directory: Path) -> int | None:
    try:
        pid = int((directory / _SUPERVISOR_PID).read_text())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


# ---------------------------------------------------------------------- up / down
def start_cluster(config: ClusterConfig, *, timeout_s: float = 180.0, directory: Path | None = None) -> dict[str, Any]:
    """Spawn the supervisor detached and wait until it is ready; returns its state."""
    directory = directory or state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    running = _supervisor_pid(directory)
    if running is not None:
        raise ApiError(f"a hier_sched cluster started by `up` is already running (supervisor pid {running}); "
                       "`hier-sched down` first")
    (directory / "cluster.json").unlink(missing_ok=True)
    argv = [sys.executable, "-m", "hier_sched.local_cluster", "serve", "--state-dir", str(directory)]
    for key, value in _fields(config):
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with open(directory / _SUPERVISOR_LOG, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    (directory / _SUPERVISOR_PID).write_text(str(proc.pid))
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = read_state(directory)
        if state is not None and state.get("pid") == proc.pid:
            return state
        if proc.poll() is not None:
            tail = (directory / _SUPERVISOR_LOG).read_text()[-1500:]
            (directory / _SUPERVISOR_PID).unlink(missing_ok=True)
            raise ApiError(f"the cluster supervisor exited with {proc.returncode}:\n{tail}")
        time.sleep(0.2)
    stop_cluster(directory)
    raise ApiError(f"the cluster was not ready after {timeout_s:.0f} s (log: {directory / _SUPERVISOR_LOG})")


def _fields(config: ClusterConfig) -> list[tuple[str, Any]]:
    return [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)]


def stop_cluster(directory: Path | None = None, *, timeout_s: float = 60.0) -> bool:
    """Stop what ``up`` started: SIGTERM the supervisor, wait, then SIGKILL what is left of
    *its* process tree (its Ray processes included). Never ``ray stop``. False: nothing ran."""
    import psutil

    directory = directory or state_dir()
    pid = _supervisor_pid(directory)
    if pid is None:
        (directory / "cluster.json").unlink(missing_ok=True)
        (directory / _SUPERVISOR_PID).unlink(missing_ok=True)
        return False
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    os.kill(pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree[:1], timeout=timeout_s)
    leftovers = [p for p in tree if p.is_running()]
    for p in leftovers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=10)
    (directory / "cluster.json").unlink(missing_ok=True)
    (directory / _SUPERVISOR_PID).unlink(missing_ok=True)
    return True


@click.command()
@click.option("--emulated", is_flag=True, help="emulated GPUs (the calibrated GPU model); default on a machine without GPUs")
@click.option("--backend", type=click.Choice(["auto", "emulated", "nvml", "dcgm"]), default="auto", show_default=True)
@click.option("--nodes", type=click.IntRange(1), default=2, show_default=True, help="Ray nodes on this machine")
@click.option("--gpus-per-node", type=click.IntRange(1), default=4, show_default=True)
@click.option("--gpu-type", default="A100-40GB", show_default=True, help="emulated GPU type")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="wall seconds per emulated second (0.01: a 3000 s job takes 30 s)")
@click.option("--policy", default="magm", show_default=True, help="auto, exclusive, round-robin, first-fit, best-fit, magm, lug")
@click.option("--estimator", default="auto", show_default=True, help="default estimator for specs that name none")
@click.option("--sharing", type=click.Choice(["mps", "streams", "none"]), default="mps", show_default=True)
@click.option("--address", default=None, help="attach to this existing Ray cluster instead of starting one (--nodes is then ignored)")
@click.option("--mps-daemon", is_flag=True, help="real GPUs: start and stop an MPS control daemon per node")
def up(emulated: bool, backend: str, nodes: int, gpus_per_node: int, gpu_type: str, time_scale: float, policy: str,
       estimator: str, sharing: str, address: str | None, mps_daemon: bool) -> None:
    """Start a local cluster with the scheduler (or attach to ADDRESS); returns when ready."""
    from hier_sched.core.gpu_types import gpu_type as check_gpu_type
    from hier_sched.core.presets import preset

    try:
        preset(policy)
        check_gpu_type(gpu_type)
    except ValueError as exc:
        _fail(str(exc), 2)
    chosen = "emulated" if emulated else backend
    if chosen == "auto":
        chosen = _auto_backend()
    config = ClusterConfig(nodes=nodes, gpus_per_node=gpus_per_node, gpu_type=gpu_type, time_scale=time_scale,
                           policy=policy, estimator=estimator, backend=chosen, sharing=sharing, address=address,
                           mps_daemon=mps_daemon)
    t0 = time.time()
    try:
        state = start_cluster(config)
    except ApiError as exc:
        _fail(str(exc))
    where = f"attached to {address}" if address else f"{nodes} node(s) x {gpus_per_node} {gpu_type} ({chosen})"
    click.echo(f"hier_sched cluster up in {time.time() - t0:.1f} s: {where}, policy {policy}, time scale {time_scale}")
    if state.get("dashboard"):
        click.echo(f"Ray dashboard: {state['dashboard']}")
    click.echo("next: hier-sched submit job.yaml; hier-sched status; hier-sched down")


def _auto_backend() -> str:
    from node_actor.backends.nvml import NvmlBackend

    return "nvml" if NvmlBackend.available() else "emulated"


@click.command()
def down() -> None:
    """Stop the cluster `up` started (only its own processes; never `ray stop`)."""
    t0 = time.time()
    if stop_cluster():
        click.echo(f"hier_sched cluster stopped in {time.time() - t0:.1f} s")
    else:
        click.echo("no hier_sched cluster was running")


# ---------------------------------------------------------------------- jobs
def _call(method: str, payload: dict[str, Any] | None = None) -> Any:
    try:
        answer = api_call(method, payload)
    except ApiError as exc:
        _fail(str(exc))
    if isinstance(answer, dict) and "error" in answer and method != "submit":
        _fail(answer["error"])
    return answer


def spec_payload(path: str) -> dict[str, Any]:
    """The fields the user wrote (unset ones stay unset: the cluster's defaults apply), with a
    relative workdir made absolute against the submitting shell's directory."""
    from hier_sched.core.spec import SpecError, load_spec

    try:
        spec = load_spec(path)
    except SpecError as exc:
        _fail(str(exc), 2)
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["workdir"] = str(Path(os.getcwd(), data.get("workdir") or ".").resolve())
    return data


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help='print {"job_id": ...}')
def submit(spec: str, as_json: bool) -> None:
    """Queue the job described by SPEC (.yaml, .toml or .json)."""
    answer = _call("submit", {"spec": spec_payload(spec)})
    if "error" in answer:
        _fail(answer["error"], 2)
    click.echo(json.dumps({"job_id": answer["job_id"]}) if as_json else f"submitted {answer['job_id']}")


@click.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: a list of job objects, or one object with JOB_ID")
def status(job_id: str | None, as_json: bool) -> None:
    """Show jobs (all, or JOB_ID)."""
    answer = _call("status", {"job_id": job_id})
    if job_id is not None and answer is None:
        _fail(f"no job {job_id!r}")
    if as_json:
        click.echo(json.dumps(answer, indent=1))
        return
    print_jobs([answer] if job_id else answer)


def print_jobs(jobs: list[dict[str, Any]], title: str | None = None, *, ids: bool = True) -> None:
    """A table of job objects; ``ids=False`` (the demo) leaves out ids and reasons."""
    from rich.table import Table

    table = Table(title=title)
    columns = ("job",) * ids + ("name", "state", "node", "gpus", "att.", "OOM", "est. MiB", "peak MiB") + ("reason",) * ids
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column == "state")
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for j in jobs:
        state = j["state"]
        gpus = ",".join(map(str, j["gpus"])) if isinstance(j["gpus"], list) else str(j["gpus"])
        reason = "" if state == "succeeded" else (j["reason"] or "")
        table.add_row(*(j["job_id"],) * ids, j["name"], f"[{colour.get(state, 'white')}]{state}[/]", j["node"] or "-",
                      gpus, str(j["attempts"]), str(j["oom_crashes"]),
                      f"{j['estimate_mib']:.0f}" if j["estimate_mib"] else "-",
                      f"{j['observed_peak_mib']:.0f}" if j["observed_peak_mib"] else "-", *(reason,) * ids)
    console().print(table)


def wait_for_jobs(job_ids: list[str] | None, timeout_s: float | None, poll_s: float = 0.5,
                  directory: Path | None = None,
                  on_poll: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Poll until every job (all when ``job_ids`` is empty) has ended; returns their objects.
    ``on_poll`` sees the jobs after every poll (a progress bar)."""
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        jobs = api_call("status", {}, directory=directory)
        if job_ids:
            by_id = {j["job_id"]: j for j in jobs}
            missing = [i for i in job_ids if i not in by_id]
            if missing:
                raise ApiError(f"no such job(s): {', '.join(missing)}")
            jobs = [by_id[i] for i in job_ids]
        if on_poll is not None:
            on_poll(jobs)
        if all(j["state"] in _TERMINAL for j in jobs):
            return jobs
        if deadline is not None and time.time() >= deadline:
            raise TimeoutError([j for j in jobs if j["state"] not in _TERMINAL])
        time.sleep(poll_s)


@click.command(name="wait")
@click.argument("job_ids", nargs=-1)
@click.option("--timeout", type=float, default=None, help="seconds; exit 1 when jobs are still running then")
def wait_cmd(job_ids: tuple[str, ...], timeout: float | None) -> None:
    """Wait until the jobs (default: all) have ended; exit 0 only if all succeeded."""
    try:
        with progress("jobs ended", unit="jobs") as update:
            jobs = wait_for_jobs(list(job_ids), timeout,
                                 on_poll=lambda jobs: update(sum(j["state"] in _TERMINAL for j in jobs), len(jobs)))
    except ApiError as exc:
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
    answer = _call("cancel", {"job_id": job_id})
    click.echo(f"{job_id}: {answer['state']}")


@click.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="keep printing until the job ends")
def logs(job_id: str, follow: bool) -> None:
    """Print a job's output (stdout and stderr of every attempt)."""
    offset = 0
    while True:
        answer = _call("logs", {"job_id": job_id, "offset": offset})
        if answer["text"]:
            click.echo(answer["text"], nl=False)
        offset = answer["offset"]
        if not follow or (answer["done"] and not answer["text"]):
            return
        time.sleep(0.5)


@click.command()
@click.option("--once", is_flag=True, help="draw one frame and exit")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="seconds between refreshes")
@click.option("--demo-data", type=click.Path(dir_okay=False, exists=True), hidden=True,
              help="draw this saved view (JSON: now, cluster, jobs, events) instead of asking the cluster")
def top(once: bool, interval: float, demo_data: str | None) -> None:
    """Live view: nodes, GPUs, the queues and why jobs wait, running jobs, recent events (q quits).

    Piped or redirected, it prints one plain table instead."""
    from hier_sched.top_live import run_top
    from hier_sched.top_view import ApiFetcher, file_fetcher

    try:
        fetch = file_fetcher(demo_data) if demo_data else ApiFetcher(lambda method, body: api_call(method, body,
                                                                                                   timeout=5.0))
    except ValueError as exc:
        _fail(str(exc), 2)
    sys.exit(run_top(fetch, interval=interval, once=once))


cluster_commands = (up, down, submit, status, wait_cmd, cancel, logs, top)
