"""Starting a placed job: the files of one run, and the process that runs it.

A job runs as a Ray task pinned to its node that asks for ``num_cpus=0``, the fraction of
``GPU`` its reservations make, and the per-GPU memory resource of each GPU it was placed on
(``hs_<node>_gpu<i>_mem_mib``, declared by the node in MiB) -- so ``ray status`` and the
dashboard show what the scheduler reserved (``launch_plan._ray_resources``) -- and runs in the
job's Ray ``runtime_env`` when its spec has one (``hier_sched.front.ray_job_env``). Clusters
``up`` starts declare ``GPU`` fungible (``local_cluster.ray_start_env``): Ray then only checks
that a node's fractions add up, and never refuses a task the scheduler placed on a GPU with room
because its own best-fit put fractions elsewhere (FIELD_NOTES §3).
``CUDA_VISIBLE_DEVICES``, the MPS client limits and the rest of the job's environment are set on
the job's process by ``run_process``, over the worker's (and so over the runtime_env's) own.

The task body (``run_process``) asks the node's fork server (``node_actor.fork_server``) to
start the job in its own session (so a cancel reaches the whole process tree) with
stdout/stderr into the job's log, and waits on that connection until the job ended; the server
(no child of the Ray worker, which Ray would kill with the worker) writes the job's PID and,
when it ends, its exit code. The node reads how a run ended from those files
(``read_outcome``), so a run outlives a restart of the node actor that started it.
A command that cannot be started fails the *job* with a clear reason, never the actor.

The task's own outcome mirrors the attempt's, for Ray's views (``ray list tasks``, the
dashboard): ``run_attempt`` returns a one-line summary when the attempt exited 0 (or saved its
checkpoint and asked to be requeued: that attempt did what it was asked) and raises
``AttemptEnded`` otherwise, so the task shows FAILED exactly when the attempt failed. The node
still reads the outcome from the exit file, not from the task.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hier_sched.common.private_files import private_dir
from hier_sched.core.failures import classify_failure
from node_actor.fork_server import ask

__all__ = [
    "RunFiles",
    "LaunchRequest",
    "RunOutcome",
    "read_outcome",
    "run_process",
    "run_attempt",
    "AttemptEnded",
    "live_pid",
    "gpu_resource",
    "NODE_RESOURCE_PREFIX",
    "RAY_GPU",
    "LOG_TAIL_BYTES",
    "read_tail",
]

NODE_RESOURCE_PREFIX = "hs_node_"
RAY_GPU = "GPU"  # in a job task's resources: what it asks as num_gpus (Ray takes GPU only that way)
_GROUP_POLL_S = 0.2  # how often the task checks whether its job still runs, once its server is gone
_SERVER_ANSWER_S = 60.0  # a loaded node forks within this
_PID_CLOCK_SLACK_S = 1.0  # process start times are rounded to clock ticks; a file's mtime is not
LOG_TAIL_BYTES = 16384  # enough for a traceback and the OOM line; classify_failure reads lines


def gpu_resource(node: str, index: int) -> str:
    """The Ray custom resource (MiB) of GPU ``index`` of scheduler node ``node``: named per node,
    so ``ray status`` does not add up GPU 0 of every node."""
    return f"hs_{node}_gpu{index}_mem_mib"


@dataclass(frozen=True, slots=True)
class RunFiles:
    """Where one attempt of a job keeps its traces on the node (``<state>/jobs/<job>/``)."""

    directory: str
    attempt: int

    def _path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"attempt{self.attempt}.{suffix}")

    @property
    def node_dir(self) -> str:
        return os.path.dirname(os.path.dirname(self.directory))  # <state>: where the node's fork server lives

    @property
    def log(self) -> str:
        return os.path.join(self.directory, "output.log")  # every attempt appends: the whole history

    @property
    def record(self) -> str:
        return self._path("json")  # the run as launched (for re-adoption)

    @property
    def pid(self) -> str:
        return self._path("pid")

    @property
    def exit(self) -> str:
        return self._path("exit")

    @property
    def peak(self) -> str:
        return self._path("peak")

    @property
    def settled(self) -> str:
        return self._path("settled")  # the job says its memory is steady (``hier_sched.memory_settled``)

    @property
    def progress(self) -> str:
        return self._path("progress")  # how far the job says it is (``hier_sched.report_progress``)

    @property
    def acked(self) -> str:
        return self._path("acked")  # the global queue logged how it ended

    @property
    def payload(self) -> str:
        return os.path.join(self.directory, "payload.pkl")

    @property
    def result(self) -> str:
        return os.path.join(self.directory, "result.pkl")


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    job_id: str
    argv: tuple[str, ...]
    files: RunFiles
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of the task's environment
    runtime_env: dict[str, Any] | None = None  # the spec's Ray runtime_env (hier_sched.front.ray_job_env)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    exit_code: int  # negative: killed by that signal (subprocess convention)
    log_tail: str
    peak_mib: float | None = None
    result: bytes | None = None  # pickled return value of a Python callable job
    start_error: str = ""  # set when the process never started


def read_tail(path: str | Path, size: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_float(path: str | None) -> float | None:
    if not path:
        return None
    try:
        return float(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def read_outcome(files: RunFiles, with_result: bool) -> RunOutcome | None:
    """How the run ended, once its exit file exists; None while it runs (or never recorded)."""
    try:
        record = json.loads(Path(files.exit).read_text())
    except (OSError, ValueError):
        return None
    code = int(record["exit_code"])
    result = None
    if with_result and code == 0:
        try:
            result = Path(files.result).read_bytes()
        except OSError:
            result = None
    return RunOutcome(code, read_tail(files.log), _read_float(files.peak), result, record.get("start_error", ""))


def live_pid(pid_file: str | Path) -> int | None:
    """The PID a run's PID file holds while that process still runs; None once it has ended.
    Run files outlive their runs and PIDs are reused (pid_max can be as low as 32768): a process
    started after the file was written is someone else's, and signalling its process group would
    hit a stranger."""
    import psutil

    try:
        path = Path(pid_file)
        pid = int(path.read_text())
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid if process.create_time() <= path.stat().st_mtime + _PID_CLOCK_SLACK_S else None
    except (OSError, ValueError, psutil.Error):
        return None


def run_process(req: LaunchRequest) -> int:
    """Have the node's fork server start the job and wait until it ended (the body of the job's
    Ray task, which holds the job's resources meanwhile); returns the job's exit code as
    recorded (-9 when there is no record: the server was killed)."""
    private_dir(Path(req.files.log).parent)
    if os.path.exists(req.files.acked):  # written off before it started (its start was lost and requeued)
        return -signal.SIGKILL
    env = {**os.environ, **req.env, "HIER_SCHED_JOB_ID": req.job_id}
    # the job's own directory for relative paths; the scheduler's package must stay importable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    # a relative workdir is the task's: Ray starts a task with a working_dir runtime_env in its copy
    message = {"op": "run", "argv": list(req.argv), "env": env, "cwd": os.path.join(os.getcwd(), req.workdir or ""),
               "log": req.files.log, "pid_file": req.files.pid, "exit_file": req.files.exit}
    with ask(req.files.node_dir, message, timeout=_SERVER_ANSWER_S) as conn:
        started = conn.answer(timeout=_SERVER_ANSWER_S)
        if started is None or "error" in started:
            raise RuntimeError(f"the node's fork server did not start the job: {(started or {}).get('error', 'no answer')}")
        ended = conn.answer(timeout=None)
    if ended is not None and "exit_code" in ended:
        return int(ended["exit_code"])
    while live_pid(req.files.pid) is not None:  # the server died under a running job: wait it out
        time.sleep(_GROUP_POLL_S)
    outcome = read_outcome(req.files, with_result=False)
    return outcome.exit_code if outcome is not None else -signal.SIGKILL


class AttemptEnded(Exception):
    """Raised by a job's Ray task when its attempt did not succeed: Ray then shows the task FAILED
    with this message (the scheduler decides, from the exit file, whether the job runs again)."""


def run_attempt(req: LaunchRequest) -> str:
    """The body of a job's Ray task: ``run_process``, then the attempt's verdict in Ray's terms."""
    code = run_process(req)
    failure = classify_failure(code, read_tail(req.files.log))
    where = f"{req.job_id} attempt {req.files.attempt}"
    if failure is None:
        return f"{where} succeeded"
    if failure.kind == "checkpoint_requeue":
        return f"{where} saved its checkpoint and was requeued"
    raise AttemptEnded(f"{where} {failure.kind}: {failure.reason} (`hier-sched status {req.job_id}` tells what "
                       "the scheduler does next)")
