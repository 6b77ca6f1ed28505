"""NVIDIA MPS for one node: the control daemon's lifecycle and each job's client limits.

MPS is the collocation mechanism the thesis found worth using (streams gave almost nothing).
Each node runs one control daemon with its *own* pipe and log directories under the node
actor's state dir, so it never collides with another daemon on the host. Per job, two limits:

* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` caps the job's device memory, so a job that outgrows
  its estimate fails *itself* with an allocation error instead of OOM-killing its neighbour;
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of SMs its kernels may occupy.

The GPUs should be in EXCLUSIVE_PROCESS compute mode (``nvidia-smi -c EXCLUSIVE_PROCESS``, root)
so that no client bypasses MPS; that is a node set-up step, not done here.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hier_sched.common.private_files import private_dir
from node_actor.backends.base import Availability

__all__ = [
    "MPS_CONTROL_BINARY",
    "MpsController",
    "MpsError",
    "limits_by_client_index",
    "mps_limits",
]

MPS_CONTROL_BINARY = "nvidia-cuda-mps-control"
_PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the daemon into its pipe directory
_POLL_S = 0.05
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
_DAEMON_START = re.compile(r"Control\s+(\d+)\]\s+Starting control daemon")

# mps_limits' rules (see its docstring)
_BURST_FACTOR = 2.0
_MIN_THREAD_PCT = 20
_THREAD_PCT_STEP = 5


class MpsError(RuntimeError):
    """The MPS control daemon did not start, answer or stop as asked."""


def mps_limits(
    reserved_mib: float, margin_mib: float, smact_estimate: float | None
) -> tuple[int, int]:
    """The MPS client limits for a job: ``(active_thread_pct, pinned_mem_limit_mib)``.

    Memory: ``ceil(reserved + margin)``. ``reserved_mib`` is what placement reserved (estimate
    plus placement margin); the extra ``margin_mib`` lets a job run slightly over its estimate,
    while a job far over it hits its own limit rather than its neighbours' memory.

    Threads: 100 % when SM activity is unknown (the thesis ran MPS uncapped; a blind cap only
    slows jobs). Otherwise twice the solo SMACT estimate — SMACT is a time average, so a job
    at 0.3 may use every SM 30 % of the time, and the factor leaves room for those bursts —
    rounded up to a multiple of 5, at least 20 % so no job is starved, at most 100 %.
    """
    if reserved_mib <= 0:
        raise ValueError(f"reserved_mib must be > 0, got {reserved_mib}")
    if margin_mib < 0:
        raise ValueError(f"margin_mib must be >= 0, got {margin_mib}")
    memory_limit_mib = math.ceil(reserved_mib + margin_mib)
    if smact_estimate is None:
        return 100, memory_limit_mib
    if not 0.0 <= smact_estimate <= 1.0:
        raise ValueError(f"smact_estimate is a fraction in [0, 1], got {smact_estimate}")
    wanted_pct = _BURST_FACTOR * smact_estimate * 100
    rounded_pct = _THREAD_PCT_STEP * math.ceil(round(wanted_pct, 6) / _THREAD_PCT_STEP)
    return min(100, max(_MIN_THREAD_PCT, rounded_pct)), memory_limit_mib


def limits_by_client_index(
    limits_by_gpu: Mapping[int, float], visible_gpus: Sequence[int]
) -> dict[int, float]:
    """Re-key per-GPU limits from node GPU indices to the indices the client sees.

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is read *after* ``CUDA_VISIBLE_DEVICES``: a job
    launched on node GPU 3 alone sees it as device 0, so its limit must say ``0=...``.
    """
    position = {gpu: i for i, gpu in enumerate(visible_gpus)}
    missing = sorted(set(limits_by_gpu) - set(position))
    if missing:
        raise ValueError(f"limits for GPUs {missing} that are not visible to the job {list(visible_gpus)}")
    return {position[gpu]: limit for gpu, limit in limits_by_gpu.items()}


class MpsController:
    """Starts, queries and stops this node's MPS control daemon."""

    def __init__(self, state_dir: str | Path, *, binary: str = MPS_CONTROL_BINARY) -> None:
        self.pipe_dir = Path(state_dir) / "mps-pipe"
        self.log_dir = Path(state_dir) / "mps-log"
        self.binary = binary
        longest_socket = self.pipe_dir / "control_privileged"
        if len(str(longest_socket)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"MPS state dir {state_dir} is too deep: the daemon's socket {longest_socket} "
                f"would exceed the {_MAX_SOCKET_PATH}-character Unix socket path limit"
            )

    @staticmethod
    def available(binary: str = MPS_CONTROL_BINARY) -> Availability:
        path = shutil.which(binary)
        if path is None:
            return Availability(False, f"{binary} is not on PATH (no NVIDIA driver utilities)")
        return Availability(True, path)

    def daemon_env(self) -> dict[str, str]:
        """Where daemon and clients meet; every client must carry the same two variables."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def client_env(
        self,
        active_thread_pct: int | None = None,
        pinned_mem_limit_mib: Mapping[int, float] | None = None,
    ) -> dict[str, str]:
        """Environment for one MPS client (a job's process).

        ``pinned_mem_limit_mib`` is keyed by the device index *as the client sees it* (after
        ``CUDA_VISIBLE_DEVICES``; see ``limits_by_client_index``); values are MiB, rounded up.
        """
        env = self.daemon_env()
        if active_thread_pct is not None:
            valid = isinstance(active_thread_pct, int) and not isinstance(active_thread_pct, bool)
            if not valid or not 1 <= active_thread_pct <= 100:
                raise ValueError(f"active_thread_pct must be an int 1..100, got {active_thread_pct!r}")
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_pct)
        if pinned_mem_limit_mib:
            for device, limit in pinned_mem_limit_mib.items():
                if not isinstance(device, int) or device < 0:
                    raise ValueError(f"device index must be an int >= 0, got {device!r}")
                if not limit > 0:
                    raise ValueError(f"memory limit for device {device} must be > 0 MiB, got {limit}")
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{device}={math.ceil(limit)}M" for device, limit in sorted(pinned_mem_limit_mib.items())
            )
        return env

    def daemon_pid(self) -> int | None:
        """The running daemon's pid, or ``None`` when it is not running.

        Newer drivers write a pid file into the pipe dir; older ones (e.g. 535) do not, but
        every control.log line carries the pid (``[... Control  8559] Starting control
        daemon``). The socket files stay behind after ``quit``, so they prove nothing; the pid
        must belong to a live MPS control process (pids get reused).
        """
        for pid in (self._pid_from_file(), self._pid_from_log()):
            if pid is not None and _is_process_of(pid, Path(self.binary).name):
                return pid
        return None

    def _pid_from_file(self) -> int | None:
        try:
            return int((self.pipe_dir / _PID_FILE).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _pid_from_log(self) -> int | None:
        try:
            log_text = (self.log_dir / "control.log").read_text(errors="replace")
        except FileNotFoundError:
            return None
        starts = _DAEMON_START.findall(log_text)
        return int(starts[-1]) if starts else None

    def is_running(self) -> bool:
        return self.daemon_pid() is not None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the daemon (``-d``); a daemon already running from this state dir is kept,
        so a restarted node actor adopts it instead of failing."""
        if self.is_running():
            return
        private_dir(self.pipe_dir)  # this user's daemon: another user's client cannot reach its socket
        private_dir(self.log_dir)
        result = self._run([self.binary, "-d"], None, timeout_s)
        if result.returncode != 0:
            raise MpsError(f"{self.binary} -d exited {result.returncode}: {self._diagnostics(result)}")
        if not self._wait_until(self.is_running, timeout_s):
            raise MpsError(f"MPS daemon did not come up within {timeout_s} s: {self._log_tail()}")

    def command(self, text: str, timeout_s: float = 10.0) -> str:
        """Send one control command (e.g. ``get_server_list``) and return the daemon's answer."""
        if not self.is_running():
            raise MpsError(f"MPS daemon is not running (pipe dir {self.pipe_dir})")
        result = self._run([self.binary], text + "\n", timeout_s)
        if result.returncode != 0:
            raise MpsError(f"MPS command {text!r} failed: {self._diagnostics(result)}")
        return result.stdout.strip()

    def stop(self, timeout_s: float = 10.0) -> None:
        """``echo quit | nvidia-cuda-mps-control``; idempotent."""
        if not self.is_running():
            return
        self.command("quit", timeout_s)
        if not self._wait_until(lambda: not self.is_running(), timeout_s):
            raise MpsError(f"MPS daemon still running {timeout_s} s after quit: {self._log_tail()}")

    def _run(self, argv: list[str], stdin: str | None, timeout_s: float) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.daemon_env()}
        # The daemon must see every GPU of the node: with CUDA_VISIBLE_DEVICES set at start it
        # renumbers devices for its clients. Jobs address GPUs by UUID instead.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            return subprocess.run(
                argv, input=stdin, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise MpsError(f"{argv[0]}: {error}") from error

    def _diagnostics(self, result: subprocess.CompletedProcess[str]) -> str:
        output = (result.stderr or result.stdout).strip()
        return output or self._log_tail()

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.log_dir / "control.log").read_text(errors="replace")
        except FileNotFoundError:
            return f"no control.log in {self.log_dir}"
        return " | ".join(text.strip().splitlines()[-lines:])

    @staticmethod
    def _wait_until(condition, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True


def _is_process_of(pid: int, program: str) -> bool:
    """Whether ``pid`` is a live process running ``program`` (Linux ``/proc``; a zombie's
    cmdline is empty)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return program.encode() in cmdline
