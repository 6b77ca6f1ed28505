"""``hier-sched bench dispatch``: what scheduling costs, against plain Ray on the same cluster.

One local Ray cluster (``hier-sched up`` of emulated nodes) runs the same N jobs twice, side by
side in one run: through hier_sched, and as the baseline (``--baseline``):

* ``process`` (what a user who needs a process per job would run instead): a plain Ray task per
  job with ``num_gpus=1 / share`` that runs ``COMMAND`` as a child process and waits for it;
  through hier_sched, the same ``COMMAND`` as a command job, the N submitted in one
  ``hier_sched.submit_many`` call (one durable write) unless ``one_by_one``;
* ``ray-jobs``: the same N commands as Ray Jobs (``JobSubmissionClient.submit_job`` with
  ``entrypoint_num_gpus=1 / share``): Ray's own way to run a job with its own process and log;
* ``noop`` (information: no process at all on Ray's side), described here:

* **plain Ray**: ``noop.options(num_gpus=1 / share, num_cpus=0).remote()`` for each, then
  ``ray.get`` of all -- Ray's own fractional GPUs, no memory check, the function runs inside a
  pooled worker process;
* **hier_sched**: ``hier_sched.submit(noop, est=MiB)`` for each, then waiting until the queue
  reports every job ``succeeded`` -- each job journalled by the GlobalQueue (accepted = durable),
  admitted and placed by the core on a GPU with room for its estimate, launched by its node
  actor as a Ray task, run in its own OS process started by the node's fork server (so it can be
  signalled, logged, classified and re-adopted after a node actor restart), and its end journalled.

Both clocks start at the first submission and stop when the last job is known done. The ratio
is ``hier_sched_s / plain_ray_s``. Where the scheduler's time goes: the CPU seconds each kind of
process of the cluster (Ray's, the scheduler's actors, the fork servers and their jobs, this
driver) spent during the hier_sched run, and how many Ray worker processes each run started
(each running job holds one). ``plain_ray=False`` leaves plain Ray out: the scheduler on a
cluster where nothing ran before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DispatchConfig", "bench_dispatch"]


COMMAND = (sys.executable, "-c", "pass")  # a job with a process of its own that does nothing
BASELINES = ("noop", "process", "ray-jobs")


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    jobs: int = 1000
    baseline: str = "noop"  # one of BASELINES
    one_by_one: bool = False  # hier_sched's command jobs submitted one call each (else one submit_many)
    nodes: int = 2
    gpus_per_node: int = 4
    share: int = 4  # jobs per GPU for plain Ray (num_gpus = 1 / share)
    est_mib: float = 1000.0  # what each hier_sched job declares it needs per GPU
    time_scale: float = 0.001  # emulated GPU clock: monitoring windows and graces pass 1,000x faster
    timeout_s: float = 3600.0
    plain_ray: bool = True  # time plain Ray first (False: the scheduler alone, on a fresh cluster)


def noop() -> None:
    """The job: nothing, so that what is timed is the dispatch."""
    return None


def bench_dispatch(config: DispatchConfig) -> dict[str, Any]:
    """Start the cluster, time both paths, stop the cluster (whatever happens)."""
    from hier_sched.front.deploy import start_cluster, stop_cluster
    from hier_sched.front.local_cluster import ClusterConfig

    with tempfile.TemporaryDirectory(prefix="hs-dispatch-") as tmp:
        state = Path(tmp)
        record = start_cluster(ClusterConfig(nodes=config.nodes, gpus_per_node=config.gpus_per_node,
                                             time_scale=config.time_scale, policy="auto", backend="emulated"),
                               directory=state)
        try:
            local = record.local_ray
            workers = [_workers_started(local)]
            plain_s = _BASELINE_RUNS[config.baseline](config, record) if config.plain_ray else None
            workers.append(_workers_started(local))
            cpu_before = _cpu_seconds(local, tmp)
            hs_s, submit_s, states = (_hier_sched(config) if config.baseline == "noop" else _hier_sched_commands(config))
            cpu = _cpu_spent(cpu_before, _cpu_seconds(local, tmp))
            workers.append(_workers_started(local))
            memory = _actor_memory_mib(local)
        finally:
            stop_cluster(state)
    plain = {"plain_ray_s": round(plain_s, 3), "ratio": round(hs_s / plain_s, 3),
             "plain_ray_jobs_per_s": round(config.jobs / plain_s, 2)} if plain_s is not None else \
        dict.fromkeys(("plain_ray_s", "ratio", "plain_ray_jobs_per_s"))
    return {
        "jobs": config.jobs, "baseline": config.baseline,
        "command": list(COMMAND) if config.baseline != "noop" else None,
        "submission": "one call per job" if config.baseline == "noop" or config.one_by_one else "one submit_many call",
        "hier_sched_s": round(hs_s, 3), **plain, "jobs_per_s": round(config.jobs / hs_s, 2),
        "hier_sched_submit_s": round(submit_s, 3), "submit_jobs_per_s": round(config.jobs / submit_s, 1),
        "states": dict(states), "nodes": config.nodes, "gpus": config.nodes * config.gpus_per_node,
        "plain_ray_num_gpus": round(1 / config.share, 4), "est_mib": config.est_mib,
        "time_scale": config.time_scale, "cluster_ready_s": record.ready_s, "actor_rss_mib": memory,
        "ray_workers_started": {"plain_ray": workers[1] - workers[0], "hier_sched": workers[2] - workers[1]},
        "hier_sched_cpu_s": cpu,
    }


def _workers_started(local: Any) -> int:
    """Ray worker processes started on the cluster so far: Ray writes a log file for each."""
    return sum(1 for _ in Path(local.session_dir, "logs").glob("python-core-worker-*.log"))


def _cpu_seconds(local: Any, state_dir: str) -> dict[int, tuple[str, float]]:
    """pid -> (its kind, CPU seconds so far, with its ended children's) of every process of the
    cluster: Ray's, and the node fork servers (their own sessions; their jobs are their children),
    found by the state directory on their command line; this driver too."""
    import psutil

    from hier_sched.front.local_cluster import local_ray_processes

    found = {p.pid: p for p in local_ray_processes(local)}
    for p in psutil.process_iter(["cmdline"]):
        if any(state_dir in arg for arg in p.info["cmdline"] or ()):
            found[p.pid] = p
    found[os.getpid()] = psutil.Process()
    out = {}
    for pid, p in found.items():
        try:
            t = p.cpu_times()
            kind = "this driver" if pid == os.getpid() else _kind(p.cmdline())
            out[pid] = (kind, t.user + t.system + t.children_user + t.children_system)
        except psutil.Error:  # ended meanwhile
            continue
    return out


def _kind(cmdline: list[str]) -> str:
    """``ray::NodeActor``, ``raylet``, ``python -m node_actor.fork_server``, ...: what a process is."""
    if not cmdline:
        return "?"
    if cmdline[0].startswith("ray::"):  # a worker's title: its actor or task (and the method it runs), or IDLE
        return cmdline[0].split("(")[0].split()[0].split(".")[0]
    if not Path(cmdline[0]).name.startswith("python"):
        return Path(cmdline[0]).name
    for i, arg in enumerate(cmdline[1:-1], 1):
        if arg == "-m":
            return f"python -m {cmdline[i + 1]}"
    return "python " + next((Path(a).name for a in cmdline[1:] if a.endswith(".py")), "?")


def _cpu_spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per kind of process between two looks, most first (a process that ended in
    between is not counted: idle Ray workers are kept a minute, so few do)."""
    spent: Counter = Counter()
    for pid, (kind, seconds) in after.items():
        spent[kind] += seconds - before.get(pid, (kind, 0.0))[1]
    return {kind: round(s, 2) for kind, s in spent.most_common() if s >= 0.01}


def _actor_memory_mib(local: Any) -> dict[str, list[float]]:
    """Resident memory of the scheduler's actors after the run (each holds every job it saw)."""
    import psutil

    from hier_sched.front.local_cluster import local_ray_processes

    found: dict[str, list[float]] = {"GlobalQueue": [], "NodeActor": []}
    for process in local_ray_processes(local):
        try:
            title = (process.cmdline() or [""])[0]
            rss = process.memory_info().rss
        except psutil.Error:
            continue
        for actor, sizes in found.items():
            if title.startswith(f"ray::{actor}"):
                sizes.append(round(rss / 2**20, 1))
    return found


def _plain_ray(config: DispatchConfig, record: Any) -> float:
    import ray

    task = ray.remote(noop).options(num_gpus=1 / config.share, num_cpus=0)
    started = time.perf_counter()
    ray.get([task.remote() for _ in range(config.jobs)], timeout=config.timeout_s)
    return time.perf_counter() - started


def run_command(argv: tuple[str, ...]) -> int:
    """The baseline's job: the command as a child process, waited for."""
    return subprocess.run(argv, stdin=subprocess.DEVNULL, check=True).returncode


def _plain_ray_processes(config: DispatchConfig, record: Any) -> float:
    import ray

    task = ray.remote(run_command).options(num_gpus=1 / config.share, num_cpus=0)
    started = time.perf_counter()
    ray.get([task.remote(COMMAND) for _ in range(config.jobs)], timeout=config.timeout_s)
    return time.perf_counter() - started


def _ray_jobs(config: DispatchConfig, record: Any) -> float:
    """The N commands as Ray Jobs, submitted one by one (Ray has no batch), waited for together."""
    import shlex

    from ray.job_submission import JobStatus, JobSubmissionClient

    if not record.dashboard_url:
        raise RuntimeError("the cluster has no dashboard, which Ray Jobs need")
    client = JobSubmissionClient(record.dashboard_url)
    entrypoint = shlex.join(COMMAND)
    started = time.perf_counter()
    left = {client.submit_job(entrypoint=entrypoint, entrypoint_num_gpus=1 / config.share)
            for _ in range(config.jobs)}
    deadline = time.monotonic() + config.timeout_s
    while left:
        done = {job for job in left if client.get_job_status(job).is_terminal()}
        failed = [job for job in done if client.get_job_status(job) is not JobStatus.SUCCEEDED]
        if failed:
            raise RuntimeError(f"Ray Job {failed[0]} did not succeed: {client.get_job_status(failed[0])}")
        left -= done
        if left and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(left)} Ray Jobs still running after {config.timeout_s} s")
        if left:
            time.sleep(0.1)
    return time.perf_counter() - started


_BASELINE_RUNS = {"noop": _plain_ray, "process": _plain_ray_processes, "ray-jobs": _ray_jobs}


def _hier_sched(config: DispatchConfig) -> tuple[float, float, Counter]:
    import hier_sched as hs

    started = time.perf_counter()
    handles = [hs.submit(noop, est=config.est_mib, name="noop") for _ in range(config.jobs)]
    submitted = time.perf_counter() - started
    states = Counter(hs.wait(handles, timeout=config.timeout_s).values())  # one call per look for all jobs
    return time.perf_counter() - started, submitted, states


def _hier_sched_commands(config: DispatchConfig) -> tuple[float, float, Counter]:
    import hier_sched as hs

    started = time.perf_counter()
    if config.one_by_one:
        handles = [hs.submit(list(COMMAND), est=config.est_mib, name="proc") for _ in range(config.jobs)]
    else:
        handles = hs.submit_many([list(COMMAND)] * config.jobs, est=config.est_mib, name="proc")
    submitted = time.perf_counter() - started
    states = Counter(hs.wait(handles, timeout=config.timeout_s).values())
    return time.perf_counter() - started, submitted, states
