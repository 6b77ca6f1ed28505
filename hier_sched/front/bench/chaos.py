"""``hier-sched bench chaos``: kill the scheduler's parts while an emulated trace runs, then check
that nothing was lost and nothing ran twice.

On a local cluster of ``ray start`` processes (3 nodes x 2 emulated A100-40GB by default), the
first jobs of the thesis trace ``carma:philly_mix-90-tasks`` arrive at their trace times,
time-compressed, each an emulated training process with the trace's peak, duration and
utilization. While they run, a seeded schedule kills, in turn:

* the GlobalQueue actor (``ray.kill``; Ray restarts it and it rebuilds from its write-ahead log),
* a node actor (``ray.kill``; Ray restarts it and it re-adopts its runs from their run files),
* a whole worker node (``kill_local_node``: its Ray processes and its jobs, SIGKILL at once, as a
  machine that dies); after a few seconds it comes back under the same name
  (``rejoin_local_node``), so the trace can finish on the full cluster;
* a drain of the node with the most runs (``drain_node`` with a deadline of ``node_down_s``: its
  runs are stopped then, and requeued once they have exited), undone ``node_down_s`` later;
* the head (``restart_head``: its Ray processes, the GCS among them, and its jobs killed, then
  the head started again on the same ports), under Ray's GCS fault tolerance on a Redis this
  bench starts (``redis-server`` must be installed): the workers' jobs run on, and the queue
  comes back on the new head from its log.

Two witnesses judge the run:

* the **queue side**, afterwards: every job the queue accepted must be in its status once, in a
  terminal state, and must have entered a terminal state exactly once (its history);
* the **node side**, during the run: every ``sample_every_s`` the live OS processes of this
  machine are read (``/proc/<pid>/environ``: each job process carries ``HIER_SCHED_JOB_ID``,
  ``node_actor.launcher.run_process``; a job's forked first stages by their runs' PID files).
  Each run of a job is its own session (the fork server starts one), so two live sessions of one
  job at one sample are the job running twice. Jobs are
  submitted whole-node (``gpus_per_node = gpus``), so a job has exactly one run at a time.
  At the same samples the reservations of the live runs (their run records: GPUs and MiB) are
  added up per GPU: a sum above the GPU's memory is a GPU booked beyond its capacity.

``oom_storm``: every job claims half its true peak (``memory_mib = peak / 2``, estimator
``none``): each first run crashes with an OOM unless collocation luck saves it; recovery (the
stepwise margins of ``core/recovery.py``) must converge for every job, with nothing lost.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hier_sched.core.job import TERMINAL  # str states compare equal to these members

__all__ = ["ChaosPlan", "SMALL", "run_chaos", "JobProcessSampler", "KILL_KINDS", "gpu_capacities"]

KILL_KINDS = ("queue", "node_actor", "node", "drain", "head")
_JOB_ENV = b"HIER_SCHED_JOB_ID="
_ATTEMPT = re.compile(r"attempt(\d+)\.(?:pid|peak)")
_RECORD = re.compile(r"attempt(\d+)\.json")
_SUBMIT_RETRY_S = 90.0  # a submission that meets the queue restarting is asked again this long


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    jobs: int = 90  # the first N jobs of the trace (it has 90)
    time_scale: float = 0.01  # 1 wall second = 100 trace seconds
    queue_kills: int = 3
    node_actor_kills: int = 3
    node_kills: int = 2
    drains: int = 1
    head_restarts: int = 0  # needs redis-server (GCS fault tolerance)
    first_kill_s: float = 10.0  # wall seconds after the first submission
    kill_every_s: float = 14.0  # between the starts of two kills (a node's return delays the next)
    node_down_s: float = 5.0  # how long a killed node stays away before it rejoins
    oom_storm: bool = False
    seed: int = 14
    nodes: int = 3
    gpus_per_node: int = 2
    finish_timeout_s: float = 300.0  # after the last submission and kill
    sample_every_s: float = 0.5

    def __post_init__(self) -> None:
        if self.nodes < 2 and (self.node_kills or self.head_restarts):
            raise ValueError("killing a worker node or the head needs at least 2 nodes "
                             "(node 0, the head, holds the queue)")
        if self.head_restarts and shutil.which("redis-server") is None:
            raise ValueError("restarting the head needs Ray's GCS fault tolerance, and so redis-server "
                             "(`apt-get install --no-install-recommends redis-server`)")
        if min(self.jobs, self.nodes, self.gpus_per_node) < 1 or self.time_scale <= 0:
            raise ValueError(f"jobs, nodes and gpus_per_node must be >= 1 and time_scale > 0 (got {self})")


# The CI size (tests/ray_clusters/test_chaos.py, `bench chaos --small`): one kill of each kind on the first
# jobs of the trace, compressed further, so that the whole run fits in about a minute.
SMALL = ChaosPlan(jobs=14, time_scale=0.005, queue_kills=1, node_actor_kills=1, node_kills=1, drains=1,
                  first_kill_s=2.0, kill_every_s=4.0, node_down_s=1.0, finish_timeout_s=90.0)


# ---------------------------------------------------------------------------------- node side
@dataclass(slots=True)
class _Seen:
    samples: int = 0
    # job -> when it was first seen running twice, the attempts then, and in how many samples;
    # any job of this machine: the jobs of other clusters are left out afterwards
    duplicates: dict[str, dict[str, Any]] = field(default_factory=dict)
    overbooked_samples: int = 0  # samples in which a GPU's live runs reserved more than it holds
    overbooked: list[dict[str, Any]] = field(default_factory=list)  # the first few such GPUs, as seen


class JobProcessSampler:
    """Samples the live runs of jobs from the OS: ``{job id: {session id: attempt}}``.

    A run is a session (the node's fork server starts each run in its own). Its live processes
    are found two ways: by ``HIER_SCHED_JOB_ID`` in ``/proc/<pid>/environ`` (every process a job
    exec'd carries it), and -- for a job's first stages, which the fork server forks without an
    exec, so the kernel still shows the server's environment -- by the PID files of the runs under
    ``state_dirs`` (``<state>/**/nodes/<node>/jobs/<job>/attempt<N>.pid``) whose process still lives."""

    def __init__(self, every_s: float = 0.5, proc: str = "/proc", state_dirs: tuple[Path, ...] = (),
                 capacities: dict[str, list[float]] | None = None):
        self.every_s = every_s
        self.proc = proc
        self.state_dirs = state_dirs
        self.capacities = capacities  # node -> per-GPU MiB: with it, each sample adds up reservations
        self.seen = _Seen()
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)

    def sample(self) -> dict[str, dict[int, int | None]]:
        runs: dict[str, dict[int, int | None]] = {}
        for pid, job, attempt in (*self._by_environment(), *self._by_pid_file()):
            try:
                session = os.getsid(pid)
            except OSError:  # gone meanwhile
                continue
            run = runs.setdefault(job, {})
            if attempt is not None:
                run[session] = attempt
            else:
                run.setdefault(session, None)
        return runs

    def _by_environment(self) -> list[tuple[int, str, int | None]]:
        found = []
        for entry in os.scandir(self.proc):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"{entry.path}/environ", "rb") as fh:
                    env = fh.read()
                at = env.find(_JOB_ENV)
                if at < 0 or (at and env[at - 1] != 0):
                    continue
                job = env[at + len(_JOB_ENV):env.find(b"\0", at)].decode("utf-8", "replace")
                with open(f"{entry.path}/cmdline", "rb") as fh:
                    attempt = _ATTEMPT.search(fh.read().decode("utf-8", "replace"))
            except OSError:  # gone, or not ours to read
                continue
            found.append((int(entry.name), job, int(attempt.group(1)) if attempt else None))
        return found

    def _by_pid_file(self) -> list[tuple[int, str, int | None]]:
        from node_actor.launcher import live_pid

        found = []
        for state in self.state_dirs:
            for path in state.glob("**/nodes/*/jobs/*/attempt*.pid"):
                pid = live_pid(path)
                attempt = _ATTEMPT.search(path.name)
                if pid is not None and attempt:
                    found.append((pid, path.parent.name, int(attempt.group(1))))
        return found

    def bookings(self, runs: dict[str, dict[int, int | None]]) -> dict[tuple[str, int], tuple[float, list[str]]]:
        """(node, GPU) -> (MiB reserved there by the live ``runs``, those runs), from the runs'
        records (``attempt<N>.json``: the placement as launched) under ``state_dirs``."""
        records = {}
        for state in self.state_dirs:
            for path in state.glob("**/nodes/*/jobs/*/attempt*.json"):
                if m := _RECORD.fullmatch(path.name):
                    records[path.parent.name, int(m.group(1))] = path
        booked: dict[tuple[str, int], tuple[float, list[str]]] = {}
        for job, sessions in runs.items():
            for attempt in {a for a in sessions.values() if a is not None}:
                path = records.get((job, attempt))
                try:
                    record = json.loads(path.read_text()) if path else None
                    placement = record["placement"] if record else None
                except (OSError, ValueError, KeyError):  # written as we read: the next sample has it
                    placement = None
                if placement is None:
                    continue
                reserved = record.get("settled_mib") or placement["reserved_mib"]  # its reservation now
                for gpu in placement["gpus"]:
                    mib, who = booked.get((placement["node"], gpu), (0.0, []))
                    booked[placement["node"], gpu] = (mib + reserved, who + [f"{job}#{attempt}"])
        return booked

    def _overbooked(self, runs: dict[str, dict[int, int | None]]) -> list[dict[str, Any]]:
        capacities = self.capacities or {}
        over = []
        for (node, gpu), (mib, who) in sorted(self.bookings(runs).items()):
            total = capacities.get(node, [])
            if gpu < len(total) and mib > total[gpu] + 1e-6:
                over.append({"t_s": round(time.monotonic() - self._t0, 1), "node": node, "gpu": gpu,
                             "reserved_mib": round(mib), "capacity_mib": round(total[gpu]), "runs": who})
        return over

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            runs = self.sample()
            self.seen.samples += 1
            if self.capacities is not None and (over := self._overbooked(runs)):
                self.seen.overbooked_samples += 1
                self.seen.overbooked += over[: max(0, 10 - len(self.seen.overbooked))]
            for job, sessions in runs.items():
                if len(sessions) > 1:
                    seen = self.seen.duplicates.setdefault(job, {
                        "t_s": round(time.monotonic() - self._t0, 1),
                        "attempts": sorted(a or 0 for a in sessions.values()), "samples": 0})
                    seen["samples"] += 1

    def start(self) -> "JobProcessSampler":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def gpu_capacities(scheduler: Any) -> dict[str, list[float]]:
    """node -> each GPU's memory (MiB), as the nodes report it to the queue."""
    nodes = scheduler.call_whole("cluster")["nodes"]
    return {n["node"]: [float(g["total_mib"]) for g in n["gpu_detail"]] for n in nodes}


def _busiest_node(scheduler: Any, rng: random.Random) -> str:
    """The node with the most runs now (ties broken by ``rng``): a drain there meets runs to stop."""
    nodes = scheduler.call_whole("cluster")["nodes"]
    return max(nodes, key=lambda n: (len(n["running"]), rng.random()))["node"]


# ---------------------------------------------------------------------------------- the trace
def chaos_specs(plan: ChaosPlan) -> list[tuple[float, dict[str, Any]]]:
    """(wall seconds after the first arrival, job spec) for each job of the trace slice."""
    from hier_sched.front.demo import demo_slice, trace_job_spec

    jobs = demo_slice(plan.jobs).jobs
    first = jobs[0].submit_s
    out = []
    for tj in jobs:
        spec = trace_job_spec(tj, "oracle")  # the true peak: kills, not estimates, cause re-runs
        spec.update(estimator="none", gpus_per_node=tj.gpus)  # one run per job: a second live one is a duplicate
        if plan.oom_storm:
            spec["memory_mib"] = round(tj.peak_mib / 2)
        out.append(((tj.submit_s - first) * plan.time_scale, spec))
    return out


def kill_schedule(plan: ChaosPlan, rng: random.Random) -> list[tuple[float, str]]:
    """(wall seconds after the first arrival, kind): the kinds in turn, ``kill_every_s`` apart
    (+-20 % jitter), until each kind has had its count."""
    left = dict(zip(KILL_KINDS, _planned(plan)))
    kinds = []
    while any(left.values()):
        for kind in KILL_KINDS:
            if left[kind]:
                kinds.append(kind)
                left[kind] -= 1
    return [(plan.first_kill_s + i * plan.kill_every_s + rng.uniform(-0.2, 0.2) * plan.kill_every_s, kind)
            for i, kind in enumerate(kinds)]


def _planned(plan: ChaosPlan) -> tuple[int, ...]:
    """How many of each of ``KILL_KINDS``."""
    return plan.queue_kills, plan.node_actor_kills, plan.node_kills, plan.drains, plan.head_restarts


# ---------------------------------------------------------------------------------- the run
class _Submitter(threading.Thread):
    """Submits the trace's jobs at their times; a submission that meets the queue restarting is
    repeated with the same request id, which the queue answers with the first call's job."""

    def __init__(self, scheduler: Any, specs: list[tuple[float, dict[str, Any]]], t0: float):
        super().__init__(name="chaos-submitter", daemon=True)
        self.scheduler, self.specs, self.t0 = scheduler, specs, t0  # (the main thread swaps in a new
        # scheduler after a head restart, which ends this process's Ray connection)
        # Held for each call, and by the main thread while the head restarts: a call made while this
        # process has no Ray connection would start one of its own (Ray's auto-init), and the
        # restart's own connection would then find Ray started twice.
        self.connection = threading.Lock()
        self.accepted: list[str] = []
        self.rejected: list[str] = []
        self.retried = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for at, spec in self.specs:
                time.sleep(max(0.0, self.t0 + at - time.time()))
                request, deadline = uuid.uuid4().hex, time.monotonic() + _SUBMIT_RETRY_S
                while True:
                    try:
                        with self.connection:
                            answer = self.scheduler.submit(spec, request_id=request, timeout=30.0)
                        break
                    except Exception:  # noqa: BLE001 - unavailable: the queue, or the head, restarting
                        if time.monotonic() > deadline:
                            raise
                        self.retried += 1
                        time.sleep(0.5)
                if "error" in answer:
                    self.rejected.append(f"{spec['name']}: {answer['error']}")
                else:
                    self.accepted.append(answer["job_id"])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc


class _GcsStore:
    """A Redis of the bench's own for Ray's GCS fault tolerance, named to the ``ray start``s of
    this process (``RAY_REDIS_ADDRESS``) until ``stop``."""

    def __init__(self, state: Path):
        import subprocess

        from hier_sched.front.local_cluster import free_port

        port = free_port()
        self.log = open(state / "redis.log", "w")
        self.process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no"], stdout=self.log, stderr=subprocess.STDOUT)
        self.before = os.environ.get("RAY_REDIS_ADDRESS")
        os.environ["RAY_REDIS_ADDRESS"] = f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self.before is None:
            os.environ.pop("RAY_REDIS_ADDRESS", None)
        else:
            os.environ["RAY_REDIS_ADDRESS"] = self.before
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def run_chaos(plan: ChaosPlan, *, log: Any = print) -> dict[str, Any]:
    """Run the plan on a cluster of its own (started and stopped here); the figures as a dict."""
    import ray

    from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE, node_actor_name
    from hier_sched.front.cluster_record import read_record
    from hier_sched.front.connection import connect
    from hier_sched.front.deploy import rejoin_local_node, restart_head, start_cluster, stop_cluster
    from hier_sched.front.local_cluster import SCHEDULER_NODE_PREFIX, ClusterConfig, kill_local_node

    rng = random.Random(plan.seed)
    specs = chaos_specs(plan)
    kills = kill_schedule(plan, rng)
    state = Path(tempfile.mkdtemp(prefix="hs-chaos-"))
    started = time.time()
    done_kills: Counter[str] = Counter()
    kill_log: list[dict[str, Any]] = []
    sampler = JobProcessSampler(plan.sample_every_s, state_dirs=(state,))
    config = ClusterConfig(nodes=plan.nodes, gpus_per_node=plan.gpus_per_node, time_scale=plan.time_scale,
                           policy="auto", estimator="none", backend="emulated")
    redis = _GcsStore(state) if plan.head_restarts else None
    try:
        log(f"chaos: seed {plan.seed}, {len(specs)} jobs, kills {dict(Counter(k for _, k in kills))}, "
            f"cluster {plan.nodes} x {plan.gpus_per_node} emulated A100-40GB, state {state}")
        start_cluster(config, directory=state)
        up_s = time.time() - started
        scheduler = connect(state)
        sampler.capacities = gpu_capacities(scheduler)
        sampler.start()
        t0 = time.time()
        submitter = _Submitter(scheduler, specs, t0)
        submitter.start()
        for at, kind in kills:
            time.sleep(max(0.0, t0 + at - time.time()))
            entry: dict[str, Any] = {"kind": kind, "t_s": round(time.time() - t0, 1)}
            if kind == "queue":
                ray.kill(ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE), no_restart=False)
            elif kind == "node_actor":
                entry["node"] = f"{SCHEDULER_NODE_PREFIX}{rng.randrange(plan.nodes)}"
                ray.kill(ray.get_actor(node_actor_name(entry["node"]), namespace=NAMESPACE), no_restart=False)
            elif kind == "drain":  # with a deadline: what runs there then is stopped and requeued
                entry["node"] = name = _busiest_node(scheduler, rng)
                entry["jobs"] = len(scheduler.call("drain_node", name, plan.node_down_s, "chaos")["jobs"])
                time.sleep(plan.node_down_s + 1.0)
                scheduler.call("undrain_node", name)
            elif kind == "head":
                with submitter.connection:
                    entry["queue_back_s"] = round(restart_head(state), 1)
                    scheduler = submitter.scheduler = connect(state)  # this process's Ray connection went with the head
            else:
                index = rng.randrange(1, plan.nodes)
                entry["node"] = name = f"{SCHEDULER_NODE_PREFIX}{index}"
                entry["processes"] = kill_local_node(read_record(state).local_ray, index, state / "nodes" / name)
                time.sleep(plan.node_down_s)
                rejoin_local_node(state, index)
                entry["back_after_s"] = round(time.time() - t0 - entry["t_s"], 1)
            done_kills[kind] += 1
            kill_log.append(entry)
            log(f"  {entry['t_s']:6.1f} s: killed {kind} {entry.get('node', '')}".rstrip())
        submitter.join()
        if submitter.error is not None:
            raise submitter.error
        deadline = time.time() + plan.finish_timeout_s
        while True:
            jobs = {j["job_id"]: j for j in scheduler.call("status", None)}
            open_jobs = [i for i in submitter.accepted if jobs.get(i, {}).get("state") not in TERMINAL]
            if not open_jobs or time.time() > deadline:
                break
            time.sleep(1.0)
        trace_s = time.time() - t0
        histories = {i: scheduler.call("history", i) for i in submitter.accepted}
        time.sleep(max(2.0, 2 * plan.sample_every_s))  # what still runs now runs after its job ended
        left_running = {j: s for j, s in sampler.sample().items() if j in jobs}
        sampler.stop()
    finally:
        sampler.stop()
        stopping = time.time()
        stop_cluster(state)
        down_s = time.time() - stopping
        if redis is not None:
            redis.stop()
    figures = _figures(plan, submitter, jobs, histories, sampler.seen, left_running, done_kills, kill_log,
                       dict(up_s=up_s, trace_s=trace_s, down_s=down_s, wall_s=time.time() - started))
    if figures["ok"]:
        shutil.rmtree(state, ignore_errors=True)
    else:  # the run files and logs of the nodes and the queue's log tell what happened
        figures["state_dir"] = str(state)
        log(f"chaos: a check failed; the cluster's state is kept in {state}")
    return figures


def _figures(plan: ChaosPlan, submitter: _Submitter, jobs: dict[str, dict[str, Any]],
             histories: dict[str, Any], seen: _Seen, left_running: dict[str, Any], kills: Counter[str],
             kill_log: list[dict[str, Any]], times: dict[str, float]) -> dict[str, Any]:
    accepted = submitter.accepted
    mine = [jobs[i] for i in accepted if i in jobs]
    states = Counter(j["state"] for j in mine)
    ended = {i: sum(1 for _, _, to, _ in (histories.get(i) or []) if to in TERMINAL) for i in accepted}
    attempts = [j["attempts"] for j in mine]
    problems = {
        "lost": [i for i in accepted if i not in jobs],
        "unfinished": [i for i in accepted if i in jobs and jobs[i]["state"] not in TERMINAL],
        "ended_more_than_once": [i for i, n in ended.items() if n > 1],
        "ran_twice": sorted(j for j in seen.duplicates if j in jobs),
        "left_running": sorted(left_running),
        "overbooked_gpus": [f"{o['node']} gpu{o['gpu']} at {o['t_s']} s: {o['reserved_mib']}/{o['capacity_mib']} MiB "
                            f"by {', '.join(o['runs'])}" for o in seen.overbooked],
    }
    planned = dict(zip(KILL_KINDS, _planned(plan)))
    figures: dict[str, Any] = {
        "mode": "oom-storm" if plan.oom_storm else "chaos",
        "seed": plan.seed,
        "jobs": len(submitter.specs),
        "accepted": len(accepted),
        "rejected": len(submitter.rejected),
        "submissions_repeated": submitter.retried,
        "succeeded": states["succeeded"],
        "failed": states["failed"],
        "cancelled": states["cancelled"],
        **{k: len(v) for k, v in problems.items()},
        "duplicate_samples": sum(seen.duplicates[j]["samples"] for j in problems["ran_twice"]),
        "process_samples": seen.samples,
        "overbooked_samples": seen.overbooked_samples,
        "kills": {k: kills[k] for k in KILL_KINDS},
        "kills_planned": planned,
        "attempts_histogram": {str(k): v for k, v in sorted(Counter(attempts).items())},
        "attempts_mean": round(sum(attempts) / len(attempts), 2) if attempts else None,
        "attempts_max": max(attempts, default=None),
        "oom_crashes": sum(j["oom_crashes"] for j in mine),
        "runs_lost_with_a_node": sum(j.get("lost_runs", 0) for j in mine),
        **{k: round(v, 1) for k, v in times.items()},
        "plan": asdict(plan),
        "kill_log": kill_log,
        "problem_jobs": {k: v[:20] for k, v in problems.items() if v},
        "duplicates_seen": {j: seen.duplicates[j] for j in problems["ran_twice"]},
        "not_succeeded": {j["job_id"]: [f"{a} -> {b}: {why}"[:200] for _, a, b, why in histories.get(j["job_id"]) or []]
                          for j in mine if j["state"] != "succeeded"},
        "rejections": submitter.rejected[:20],
    }
    # every job of the trace ends well when run: a failure here is the scheduler's
    figures["ok"] = (not any(problems.values()) and figures["rejected"] == 0 and figures["succeeded"] == len(accepted)
                     and dict(kills) == {k: n for k, n in planned.items() if n})
    return figures
