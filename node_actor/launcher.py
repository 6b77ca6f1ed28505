"""Starting a placed job: its argv, its environment, and the process that runs it.

A job runs as a Ray task that asks for ``num_cpus=0, num_gpus=0`` plus the per-GPU memory
resource of each GPU it was placed on (``hs_gpu<i>_mem_mib``, declared by the node in MiB), is
pinned to its node, and carries ``CUDA_VISIBLE_DEVICES`` and the MPS client limits in its
``runtime_env`` -- so ``ray status`` and the dashboard show what the scheduler reserved
(FIELD_NOTES §3: fractional ``num_gpus`` would go to Ray's best-fit GPU instead).

The task body (``run_process``) is plain Python: it starts the job's process in its own
session (so a cancel reaches the whole process tree), sends stdout/stderr to the job's log
file, records the PID, waits, and reports the exit code, the log tail and the observed peak.
A command that cannot be started fails the *job* with a clear reason, never the actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LaunchRequest",
    "RunOutcome",
    "run_process",
    "gpu_resource",
    "NODE_RESOURCE_PREFIX",
    "LOG_TAIL_BYTES",
    "read_tail",
]

NODE_RESOURCE_PREFIX = "hs_node_"
LOG_TAIL_BYTES = 16384  # enough for a traceback and the OOM line; classify_failure reads lines


def gpu_resource(index: int) -> str:
    """The Ray custom resource (MiB) of GPU ``index`` of a node."""
    return f"hs_gpu{index}_mem_mib"


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    job_id: str
    argv: tuple[str, ...]
    log_path: str
    pid_path: str
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of the task's environment
    peak_path: str | None = None  # an emulated job writes its largest memory here
    result_path: str | None = None  # a Python callable's pickled result


@dataclass(frozen=True, slots=True)
class RunOutcome:
    job_id: str
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


def _read_bytes(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def run_process(req: LaunchRequest) -> RunOutcome:
    """Run the job's process to its end (the body of the job's Ray task)."""
    Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **req.env, "HIER_SCHED_JOB_ID": req.job_id}
    # the job's own directory for relative paths; the scheduler's package must stay importable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    with open(req.log_path, "ab") as log:
        try:
            proc = subprocess.Popen(list(req.argv), cwd=req.workdir or None, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:  # FileNotFoundError, PermissionError, bad workdir
            what = "working directory" if req.workdir and not os.path.isdir(req.workdir) else "command"
            reason = f"cannot start {what} {req.workdir if what != 'command' else req.argv[0]!r}: {exc.strerror or exc}"
            log.write(f"hier_sched: {reason}\n".encode())
            code = 127 if isinstance(exc, FileNotFoundError) and what == "command" else 126
            return RunOutcome(req.job_id, code, reason, start_error=reason)
        Path(req.pid_path).write_text(str(proc.pid))
        code = proc.wait()
    return RunOutcome(req.job_id, code, read_tail(req.log_path), _read_float(req.peak_path),
                      _read_bytes(req.result_path) if code == 0 else None)
