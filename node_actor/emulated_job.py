"""An emulated training job: a real OS process that uses an emulated GPU the way training does.

    python -m node_actor.emulated_job --device-dir DIR --job-id ID --gpus 0,1 --peak-mib 7106 \\
        --duration-s 2130 --smact 0.64 [--checkpoint-dir D] [--mem-limit-mib M] [-- CMD ARGS...]

The memory limit is read like a real MPS client reads it: from ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
(``0=4048M,1=...``, keyed by the device index the process sees); ``--mem-limit-mib`` overrides
it for every GPU.

Life of the process (times are emulated seconds, the device file's ``time_scale`` converts):

* attach to each GPU (its CUDA context), then after the warm-up allocate the peak; if that does
  not fit -- or exceeds the MPS pinned-memory limit -- print PyTorch's OOM text to stderr,
  detach and exit 1, exactly what the scheduler sees from a real job;
* progress at ``relative_speed / slowdown`` solo-seconds per second, re-read every tick, so
  collocation slows it down as the GPU model says; print progress lines, and report progress
  (``hier_sched.report_progress``) as a real job may;
* SIGUSR1 (the checkpoint signal): write progress to ``checkpoint_dir``, exit
  ``REQUEUE_EXIT_CODE``; the next run resumes from there. SIGTERM: detach and exit 143;
* with a command after ``--``, run it as a child too: its output and exit code are real, and the
  job succeeds only when both the command and the emulated training succeed. Without
  ``--duration-s`` the job holds its memory for as long as the command runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hier_sched.common.private_files import write_private
from hier_sched.common.progress import report_progress
from hier_sched.common.settling import memory_settled
from hier_sched.core.failures import REQUEUE_EXIT_CODE, cannot_start
from hier_sched.core.gpu_types import gpu_type
from hier_sched.device.gpu_model import WARMUP_S, GpuOutOfMemory, JobActivity, training_rate, warmup_s
from node_actor.emulated_device import EmulatedNodeDevices
from node_actor.forking import ForkedProcess, start_process

__all__ = ["main", "mps_memory_limits", "default_activity", "CHECKPOINT_FILE"]

CHECKPOINT_FILE = "emulated_progress.json"
# Warm-up is capped at this share of the job's duration (as in replay/engine.py: short jobs
# reach their peak before they are half done).
_TERMINATED_EXIT = 128 + signal.SIGTERM
_MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
_MPS_UNITS_MIB = {"M": 1.0, "G": 1024.0}
_PROGRESS_STEPS = 10  # progress lines per run
_REFERENCE_SPEED = gpu_type("A100-40GB").relative_speed  # an emulation profile's duration is an A100-40GB figure


class _Signals:
    """Signal flags; the main loop acts on them between ticks (no work in handlers)."""

    def __init__(self) -> None:
        self.checkpoint = False
        self.terminate = False
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_usr1(self, *_: object) -> None:
        self.checkpoint = True

    def _on_term(self, *_: object) -> None:
        self.terminate = True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m node_actor.emulated_job", description=__doc__.splitlines()[0])
    p.add_argument("--device-dir", required=True, help="the node's emulated device directory")
    p.add_argument("--job-id", required=True)
    p.add_argument("--gpus", required=True, help="comma-separated node GPU indices")
    p.add_argument("--peak-mib", type=float, required=True, help="true peak per GPU (context included)")
    p.add_argument("--duration-s", type=float, default=None, help="solo run time; omit: as long as the command")
    p.add_argument("--smact", type=float, default=0.5)
    p.add_argument("--smocc", type=float, default=None)
    p.add_argument("--drama", type=float, default=None)
    p.add_argument("--warmup-s", type=float, default=WARMUP_S)
    p.add_argument("--mem-limit-mib", type=float, default=None,
                   help="MPS pinned device memory limit per GPU (default: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--peak-file", default=None, help="where to write the largest memory held (MiB)")
    p.add_argument("--tick-s", type=float, default=0.1, help="wall seconds between progress updates")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... run alongside")
    return p


# Built once at import: the node's fork server imports this module before it forks each job, so
# a job only parses (building the parser was ~1 ms of every job's CPU).
_PARSER = _parser()


def _parse(argv: list[str]) -> argparse.Namespace:
    args = _PARSER.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.duration_s is None and not args.command:
        _PARSER.error("--duration-s is required without a command")
    return args


def mps_memory_limits(env_value: str, visible: int, override: float | None = None) -> list[float | None]:
    """Per visible device, the pinned memory limit in MiB (None: unlimited), parsed from the
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` format ``"0=4048M,1=2G"``."""
    if override is not None:
        return [override] * visible
    limits: list[float | None] = [None] * visible
    for item in filter(None, (part.strip() for part in env_value.split(","))):
        device, _, amount = item.partition("=")
        unit = amount[-1:].upper()
        if not device.isdigit() or unit not in _MPS_UNITS_MIB:
            raise ValueError(f"{_MPS_LIMIT_ENV}: cannot read {item!r} (want e.g. 0=4048M)")
        if int(device) < visible:
            limits[int(device)] = float(amount[:-1]) * _MPS_UNITS_MIB[unit]
    return limits


def default_activity(smact: float, smocc: float | None, drama: float | None) -> JobActivity:
    """SMOCC/DRAMA default to the ratios of a typical CNN profile (traces.schema defaults:
    0.25 and 0.2 at SMACT 0.5) when a spec gives SMACT only."""
    return JobActivity(smact, smocc if smocc is not None else 0.5 * smact, drama if drama is not None else 0.4 * smact)


class EmulatedJob:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.devices = EmulatedNodeDevices.open(args.device_dir)
        self.gpus = [int(g) for g in args.gpus.split(",") if g != ""]
        self.checkpoint_path = Path(args.checkpoint_dir) / CHECKPOINT_FILE if args.checkpoint_dir else None
        self.progress_s = self._resume()
        self.peak_seen_mib = 0.0
        self.child: subprocess.Popen | ForkedProcess | None = None
        self.attached = False

    def run(self) -> int:
        signals = _Signals()
        try:
            self._attach()
        except GpuOutOfMemory as oom:
            return self._fail_oom(oom)
        try:
            if self.args.command:
                try:
                    self.child = start_process(self.args.command)  # forked when it is one of our stages
                except OSError as exc:
                    code, reason = cannot_start(self.args.command[0], exc)
                    print(f"hier_sched: {reason}", file=sys.stderr, flush=True)
                    return code
            return self._train(signals)
        finally:
            self._detach()

    # ------------------------------------------------------------------ phases
    def _resume(self) -> float:
        if self.checkpoint_path is None or not self.checkpoint_path.is_file():
            return 0.0
        saved = json.loads(self.checkpoint_path.read_text())
        print(f"resuming from checkpoint {self.checkpoint_path}: {saved['progress_s']:.0f} s done", flush=True)
        return float(saved["progress_s"])

    def _attach(self) -> None:
        a = self.args
        activity = default_activity(a.smact, a.smocc, a.drama)
        limits = mps_memory_limits(os.environ.get(_MPS_LIMIT_ENV, ""), len(self.gpus), a.mem_limit_mib)
        with self.devices.locked() as state:
            try:
                for i, limit in zip(self.gpus, limits):
                    state.gpu(i).attach(a.job_id, activity, mem_limit_mib=limit, pid=os.getpid())
            except GpuOutOfMemory:
                for i in self.gpus:
                    state.gpu(i).detach(a.job_id)
                raise
        self.attached = True

    def _allocate_peak(self) -> None:
        with self.devices.locked() as state:
            for i in self.gpus:
                state.gpu(i).allocate_peak(self.args.job_id, self.args.peak_mib)
            self.peak_seen_mib = max(state.gpu(i).job_memory_mib(self.args.job_id) for i in self.gpus)
        self._write_peak(self.peak_seen_mib)
        memory_settled(self.peak_seen_mib)  # an emulated job's memory is steady once it holds its peak

    def _train(self, signals: _Signals) -> int:
        a = self.args
        duration = a.duration_s
        warmup = warmup_s(duration, a.warmup_s)
        scale = self.devices.time_scale
        started = last = time.time() / scale
        allocated = False
        next_report = self._next_report(duration)
        while True:
            if signals.terminate:
                self._stop_child(signal.SIGTERM)
                print("terminated (SIGTERM)", file=sys.stderr, flush=True)
                return _TERMINATED_EXIT
            if signals.checkpoint:
                return self._checkpoint(signals)
            now = time.time() / scale
            if not allocated and now - started >= warmup:
                try:
                    self._allocate_peak()
                except GpuOutOfMemory as oom:
                    self._stop_child(signal.SIGTERM)
                    return self._fail_oom(oom)
                allocated = True
            if duration is not None:  # without one the job lasts as long as its command: no progress to rate
                self.progress_s += (now - last) * self._rate()
            last = now
            child_code = self.child.poll() if self.child is not None else None
            if child_code not in (None, 0):
                print(f"command {a.command[0]!r} exited with {child_code}", file=sys.stderr, flush=True)
                return child_code if child_code > 0 else 128 - child_code
            if duration is not None:
                report_progress(self.progress_s, duration)  # for `top`; written at most once a second
            if duration is not None and self.progress_s >= next_report:
                print(f"progress {min(100.0, 100 * self.progress_s / duration):.0f}% "
                      f"({min(self.progress_s, duration):.0f}/{duration:.0f} s emulated)", flush=True)
                next_report = self._next_report(duration)
            emulation_done = allocated and (duration is None or self.progress_s >= duration)
            command_done = self.child is None or child_code == 0
            if duration is None and child_code == 0:
                return 0
            if emulation_done and command_done:
                return 0
            self._pause(a.tick_s, child_code is None)

    def _pause(self, seconds: float, child_running: bool) -> None:
        """Wait a tick -- or less, when the command ends first: its end is the job's."""
        if self.child is None or not child_running:
            time.sleep(seconds)
            return
        try:
            self.child.wait(seconds)
        except subprocess.TimeoutExpired:
            pass

    def _next_report(self, duration: float | None) -> float:
        if not duration:
            return math.inf
        step = duration / _PROGRESS_STEPS
        return (math.floor(self.progress_s / step) + 1) * step

    def _rate(self) -> float:
        """Solo-seconds of work per emulated second under the current collocation."""
        with self.devices.locked(write=False) as state:
            return training_rate([state.gpu(i) for i in self.gpus], self.args.job_id, _REFERENCE_SPEED)

    def _checkpoint(self, signals: _Signals) -> int:
        """Save the emulated progress and exit with the requeue code. A real command gets the
        signal too and its own time to save (until the slot's SIGTERM, which it is passed on):
        its exit code is the job's, so a command that did not checkpoint is not reported as one."""
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGUSR1)
            while (code := self.child.poll()) is None:
                if signals.terminate:
                    self.child.send_signal(signal.SIGTERM)
                    signals.terminate = False
                time.sleep(self.args.tick_s)
            if code != REQUEUE_EXIT_CODE:
                print(f"command {self.args.command[0]!r} exited with {code} after the checkpoint signal",
                      file=sys.stderr, flush=True)
                return code if code >= 0 else 128 - code
        if self.checkpoint_path is None:
            print("checkpoint signal received but the job has no checkpoint_dir: progress is lost",
                  file=sys.stderr, flush=True)
        else:
            self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
            self.checkpoint_path.write_text(json.dumps({"progress_s": self.progress_s}))
            print(f"checkpoint saved at {self.progress_s:.0f} s to {self.checkpoint_path}", flush=True)
        return REQUEUE_EXIT_CODE

    def _fail_oom(self, oom: GpuOutOfMemory) -> int:
        self._write_peak(oom.wanted_mib)
        self._detach()
        gib = 1024.0
        gpu = next(iter(self.gpus), 0)
        total = self._total_mib(gpu)
        print("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>", file=sys.stderr)
        print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {oom.requested_mib / gib:.2f} GiB. "
              f"GPU {gpu} has a total capacity of {total / gib:.2f} GiB of which {oom.free_mib:.2f} MiB is free. "
              f"Including non-PyTorch memory, this process has {oom.allocated_mib / gib:.2f} GiB memory in use."
              + (f" (MPS pinned device memory limit {oom.limit_mib:.0f} MiB)" if oom.limit_mib else ""),
              file=sys.stderr, flush=True)
        return 1

    def _total_mib(self, gpu: int) -> float:
        with self.devices.locked(write=False) as state:
            return state.gpu(gpu).memory_total_mib

    def _write_peak(self, mib: float) -> None:
        if self.args.peak_file:
            write_private(self.args.peak_file, f"{mib:.1f}\n")

    def _stop_child(self, sig: int, wait_s: float = 10.0) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        self.child.send_signal(sig)
        try:
            self.child.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()

    def _detach(self) -> None:
        if self.attached:
            self.devices.detach_everywhere(self.args.job_id)
            self.attached = False


def main(argv: list[str] | None = None) -> int:
    return EmulatedJob(_parse(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
