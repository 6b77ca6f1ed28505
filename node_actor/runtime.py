"""One node's scheduler state, without Ray: monitoring, snapshots, local decisions, supervision.

``NodeRuntime`` is what the ``NodeActor`` wraps. Keeping it free of Ray makes the node's
decision testable against the pure core directly (tests/test_live_node_decisions.py): the
snapshots it builds are what ``plan_cycle`` gets, and the placement it launches is exactly
the plan's. Launching goes through a ``Launcher`` (the Ray task in production).

Clock: every ``now_s`` is in *emulated* seconds (wall / time_scale; 1:1 on real GPUs), so the
30 s post-launch grace and the 1 s monitoring samples mean the same on every node.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.failures import Failure, classify_failure
from hier_sched.core.gpu import GpuSample, GpuState, SharingMode
from hier_sched.core.monitoring import GpuMonitor
from hier_sched.core.presets import SchedulerConfig
from hier_sched.core.placement import memory_requirement
from hier_sched.core.queueing import QueuedJob, placement_request, plan_cycle
from hier_sched.core.recovery import decide_after_failure
from hier_sched.core.spec import JobSpec
from node_actor.backends.base import DeviceBackend
from node_actor.emulated_device import EmulatedNodeDevices
from node_actor.launcher import LaunchRequest, RunOutcome, gpu_resource
from node_actor.mps import MpsController, limits_by_client_index, mps_limits

__all__ = ["Assignment", "Launcher", "NodeRuntime", "RunningJob", "CANCEL_GRACE_S"]

CANCEL_GRACE_S = 10.0  # wall seconds between SIGTERM and SIGKILL on cancel


@dataclass(frozen=True, slots=True)
class Assignment:
    """A job the global queue offers this node: the queue entry plus what is needed to run it."""

    queued: QueuedJob
    spec: dict[str, Any]  # JobSpec.model_dump() (validated at submit)
    attempts: int  # runs started before this one
    other_failures: int = 0  # non-OOM failures so far
    payload: bytes | None = None  # cloudpickled (fn, args, kwargs) of hs.submit(fn)
    rr_cursor: int = 0  # the global plan's round-robin cursor before this job


class Launcher(Protocol):
    def launch(self, request: LaunchRequest, resources: dict[str, float], env: dict[str, str]) -> Any:
        """Start the job; returns a handle for ``poll``."""
        ...

    def poll(self, handle: Any) -> RunOutcome | None:
        """The outcome once the job's process ended, else None."""
        ...


@dataclass(slots=True)
class RunningJob:
    assignment: Assignment
    gpus: tuple[int, ...]
    reserved_mib: float
    launched_s: float
    handle: Any
    pid_path: Path
    log_path: Path
    pid: int | None = None
    cancel_requested: bool = False
    kill_at_wall: float | None = None  # set when SIGTERM was sent: SIGKILL after this
    peak_mib: float = 0.0  # largest per-process memory seen in monitoring (real GPUs)
    spec: JobSpec | None = field(default=None, repr=False)

    @property
    def job_id(self) -> str:
        return self.assignment.queued.job_id


class NodeRuntime:
    def __init__(self, name: str, backend: DeviceBackend, config: SchedulerConfig, *, state_dir: str | Path,
                 launcher: Launcher, sharing: SharingMode = SharingMode.MPS, window: int = 30,
                 emulated_device_dir: str | None = None, mps: MpsController | None = None):
        self.name = name
        self.backend = backend
        self.config = config
        self.state_dir = Path(state_dir)
        self.launcher = launcher
        self.sharing = sharing
        self.gpu_type = backend.gpu_type()
        self.emulated_device_dir = emulated_device_dir
        self.mps = mps
        count = backend.gpu_count()
        self.monitors = [GpuMonitor(window) for _ in range(count)]
        self.last_sample_s: float | None = None
        self.last_launch_s: list[float | None] = [None] * count
        self.running: dict[str, RunningJob] = {}
        self.events: list[dict[str, Any]] = []
        self.launched_total = 0

    # ------------------------------------------------------------------ monitoring
    def sample(self, now_s: float) -> None:
        """Feed the monitors the one-second samples since the last call (a run of them)."""
        readings = self.backend.sample()
        count = 1 if self.last_sample_s is None else math.floor(now_s) - math.floor(self.last_sample_s)
        for monitor, reading in zip(self.monitors, readings):
            if count > 0:
                monitor.observe(reading, count)
            else:
                monitor.last = reading  # memory is read fresh; the windows only advance per second
        self.last_sample_s = now_s
        self._track_peaks(readings)

    def _track_peaks(self, readings: list[GpuSample]) -> None:
        by_pid = {pid: mib for r in readings for pid, mib in r.processes}
        for job in self.running.values():
            pid = self._pid(job)
            if pid is not None and pid in by_pid:
                job.peak_mib = max(job.peak_mib, by_pid[pid])

    def snapshot(self, now_s: float) -> list[GpuState]:
        """The GpuStates placement decides on (monitor risk, memory, residents, grace, pending)."""
        grace = self.config.placement.launch_grace_s
        states = []
        for index, monitor in enumerate(self.monitors):
            reading = monitor.last
            if reading is None:
                raise RuntimeError(f"node {self.name}: snapshot before the first sample")
            held = dict(reading.processes)
            residents, pending = [], 0.0
            for job in self.running.values():
                if index not in job.gpus:
                    continue
                residents.append(job.job_id)
                if now_s - job.launched_s < grace:  # allocations may not be visible yet
                    pid = self._pid(job)
                    pending += max(0.0, job.reserved_mib - held.get(pid, 0.0)) if pid else job.reserved_mib
            states.append(GpuState(
                node=self.name, index=index, memory_total_mib=reading.memory_total_mib,
                memory_used_mib=reading.memory_used_mib, gpu_type=self.gpu_type, uuid=reading.uuid,
                risk=monitor.risk(), power_w=reading.power_w, resident_jobs=tuple(residents),
                sharing=self.sharing, last_launch_s=self.last_launch_s[index], pending_mib=pending,
            ))
        return states

    # ------------------------------------------------------------------ deciding and launching
    def decide(self, assignment: Assignment, now_s: float):
        """The core's plan for this one job on this node's current snapshot."""
        cfg = self.config
        index = ClusterIndex.from_snapshots({self.name: self.snapshot(now_s)})
        return plan_cycle([assignment.queued], index, cfg.placement, cfg.queue, now_s, rr_cursor=assignment.rr_cursor)

    def offer(self, assignment: Assignment, now_s: float) -> dict[str, Any]:
        """Run the job here if the core places it on this node now; otherwise say why not."""
        job_id = assignment.queued.job_id
        if job_id in self.running:
            return {"launched": False, "reason": f"{job_id} already runs on {self.name}"}
        plan = self.decide(assignment, now_s)
        if not plan.placements:
            return {"launched": False, "reason": "; ".join(plan.waiting.get(job_id, ("not placed",)))}
        (_, (placement,)), = plan.placements
        spec = JobSpec.model_validate(assignment.spec)
        self._launch(assignment, spec, placement.gpus, placement.reserved_mib, now_s)
        return {"launched": True, "gpus": list(placement.gpus), "reserved_mib": placement.reserved_mib,
                "exclusive": placement.exclusive, "reason": placement.reason, "rr_cursor": plan.rr_cursor}

    def _launch(self, assignment: Assignment, spec: JobSpec, gpus: tuple[int, ...], reserved: float,
                now_s: float) -> None:
        job_id = assignment.queued.job_id
        attempt = assignment.attempts + 1
        run_dir = self.state_dir / "jobs" / job_id
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path = run_dir / "output.log"  # every attempt appends: `logs` shows the whole history
        pid_path = run_dir / f"attempt{attempt}.pid"
        peak_path = run_dir / f"attempt{attempt}.peak"
        result_path = None
        if assignment.payload is not None:
            result_path = run_dir / "result.pkl"
            (run_dir / "payload.pkl").write_bytes(assignment.payload)
        limit = self._memory_limit(assignment.queued)
        argv = self._argv(assignment, spec, gpus, peak_path, result_path)
        env = {**spec.env, **self._device_env(assignment.queued.smact, gpus, limit)}
        with open(log_path, "a") as log:
            log.write(f"==== hier_sched: attempt {attempt} on {self.name} GPU(s) {list(gpus)} "
                      f"(reserved {reserved:.0f} MiB, limit {limit and f'{limit:.0f} MiB' or 'none'})\n")
        request = LaunchRequest(job_id, tuple(argv), str(log_path), str(pid_path), spec.workdir, env,
                                str(peak_path) if self.emulated_device_dir else None,
                                str(result_path) if result_path else None)
        resources = self._ray_resources(gpus, reserved)
        handle = self.launcher.launch(request, resources, env)
        self.running[job_id] = RunningJob(assignment, gpus, reserved, now_s, handle, pid_path, log_path, spec=spec)
        for i in gpus:
            self.last_launch_s[i] = now_s
        self.launched_total += 1

    def _memory_limit(self, q: QueuedJob) -> float | None:
        """The MPS pinned-memory limit: the free memory the core's gate asked for, so a job that
        outgrows its estimate fails itself, not its neighbour. None without an estimate, outside
        MPS, and for the last recovery step (an idle GPU of its own)."""
        if self.sharing is not SharingMode.MPS:
            return None
        total = self.monitors[0].last.memory_total_mib if self.monitors[0].last else math.inf
        req = placement_request(q, total, self.config.queue)
        if req.exclusive or (req.need_mib is None and req.min_free_mib is None):
            return None
        return memory_requirement(req, self.config.placement)[0]

    def _device_env(self, smact: float | None, gpus: tuple[int, ...], limit: float | None) -> dict[str, str]:
        uuids = self.backend.uuids()
        visible = [uuids[i] for i in gpus] if self.emulated_device_dir is None else [str(i) for i in gpus]
        env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)}
        if self.mps is not None:
            threads = mps_limits(1.0, 0.0, smact)[0] if smact is not None else None  # depends on SMACT only
            pinned = limits_by_client_index({i: limit for i in gpus}, list(gpus)) if limit is not None else None
            env.update(self.mps.client_env(threads, pinned))
        return env

    def _ray_resources(self, gpus: tuple[int, ...], reserved: float) -> dict[str, float]:
        """Per-GPU MiB resources for Ray's books, capped by what is still unbooked on that GPU
        (the gates decide on *measured* memory, so reservations may add up past the GPU)."""
        resources: dict[str, float] = {}
        for i in gpus:
            total = self.monitors[i].last.memory_total_mib if self.monitors[i].last else reserved
            booked = sum(j.reserved_mib for j in self.running.values() if i in j.gpus)
            amount = math.floor(min(reserved, total - booked))
            if amount >= 1:
                resources[gpu_resource(i)] = float(amount)
        return resources

    def _argv(self, assignment: Assignment, spec: JobSpec, gpus: tuple[int, ...], peak_path: Path,
              result_path: Path | None) -> list[str]:
        """The job's argv: its own command, or on emulated GPUs the emulated training process
        (which runs the command as its child). The MPS memory limit travels in the environment
        (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), read by the emulated job as by a real MPS client."""
        command = self._user_command(assignment, spec, result_path)
        if self.emulated_device_dir is None:
            if command is None:
                raise ValueError("an emulation-only spec (no command) needs emulated GPUs")
            return command
        emu = spec.emulation
        argv = [sys.executable, "-m", "node_actor.emulated_job", "--device-dir", self.emulated_device_dir,
                "--job-id", assignment.queued.job_id, "--gpus", ",".join(map(str, gpus)),
                "--peak-file", str(peak_path)]
        if emu is not None:
            argv += ["--peak-mib", f"{emu.peak_mib}", "--duration-s", f"{emu.duration_s}", "--smact", f"{emu.smact}",
                     "--warmup-s", f"{emu.warmup_s}"]
            argv += ["--smocc", f"{emu.smocc}"] if emu.smocc is not None else []
            argv += ["--drama", f"{emu.drama}"] if emu.drama is not None else []
        else:  # a real command on an emulated GPU: it occupies what the scheduler believes it needs
            occupy = assignment.queued.need_mib or self.config.placement.no_estimate_mib
            argv += ["--peak-mib", f"{occupy}", "--warmup-s", "0"]
        if spec.checkpoint_dir:
            argv += ["--checkpoint-dir", str(self._resolve(spec.checkpoint_dir, spec))]
        if command is not None:
            argv += ["--", *command]
        return argv

    @staticmethod
    def _resolve(path: str, spec: JobSpec) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() or not spec.workdir else Path(spec.workdir) / p

    @staticmethod
    def _user_command(assignment: Assignment, spec: JobSpec, result_path: Path | None) -> list[str] | None:
        if result_path is not None:
            return [sys.executable, "-m", "node_actor.run_callable", str(result_path.with_name("payload.pkl")),
                    str(result_path)]
        if spec.command is not None:
            return list(spec.command)
        if spec.entrypoint is not None:
            module, func = spec.entrypoint.split(":")
            return [sys.executable, "-c", f"import importlib, sys; sys.exit(importlib.import_module({module!r}).{func}())"]
        return None

    # ------------------------------------------------------------------ supervision
    def supervise(self, now_s: float) -> None:
        """Collect ended jobs (classify, decide), and escalate cancels past their grace."""
        wall = time.time()
        for job_id, job in list(self.running.items()):
            if job.cancel_requested:
                self._enforce_cancel(job, wall)
            outcome = self.launcher.poll(job.handle)
            if outcome is None:
                continue
            del self.running[job_id]
            self._release_device(job_id)
            self.events.append(self._ended_event(job, outcome))

    def _release_device(self, job_id: str) -> None:
        """An emulated job killed by a signal could not detach itself: free its memory."""
        if self.emulated_device_dir is not None:
            EmulatedNodeDevices.open(self.emulated_device_dir).detach_everywhere(job_id)

    def _ended_event(self, job: RunningJob, outcome: RunOutcome) -> dict[str, Any]:
        a = job.assignment
        peak = outcome.peak_mib if outcome.peak_mib is not None else (job.peak_mib or None)
        event = {"job_id": job.job_id, "node": self.name, "gpus": list(job.gpus), "exit_code": outcome.exit_code,
                 "peak_mib": peak, "result": outcome.result, "failure_kind": None}
        if job.cancel_requested:
            return {**event, "outcome": "cancelled", "reason": "cancelled by the user"}
        if outcome.start_error:
            failure: Failure | None = Failure("error", outcome.start_error, outcome.exit_code)
        else:
            failure = classify_failure(outcome.exit_code, outcome.log_tail)
        if failure is None:
            return {**event, "outcome": "succeeded", "reason": "exit code 0"}
        spec = job.spec or JobSpec.model_validate(a.spec)
        oom_count = a.queued.oom_count + (failure.kind == "oom")
        other = a.other_failures + (failure.kind in ("error", "killed"))
        retries = spec.retry.max_retries
        if spec.retry.on_exit_codes is not None and outcome.exit_code not in spec.retry.on_exit_codes:
            retries = 0
        if outcome.start_error:
            retries = 0  # a missing command does not appear by retrying
        policy = replace(self.config.recovery, max_attempts=spec.max_attempts, max_retries_other=retries)
        decision = decide_after_failure(failure, attempts=a.attempts + 1, oom_count=oom_count,
                                        other_failures=other, policy=policy)
        return {**event, "outcome": "requeue" if decision.requeue else "failed", "failure_kind": failure.kind,
                "reason": decision.reason}

    def poll_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    # ------------------------------------------------------------------ signals
    def _pid(self, job: RunningJob) -> int | None:
        if job.pid is None:
            try:
                job.pid = int(job.pid_path.read_text())
            except (OSError, ValueError):
                return None
        return job.pid

    def _signal(self, job: RunningJob, sig: int, *, group: bool) -> bool:
        pid = self._pid(job)
        if pid is None:
            return False
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def cancel(self, job_id: str) -> bool:
        """SIGTERM to the job's process group now, SIGKILL after ``CANCEL_GRACE_S``."""
        job = self.running.get(job_id)
        if job is None:
            return False
        job.cancel_requested = True
        self._enforce_cancel(job, time.time())
        return True

    def _enforce_cancel(self, job: RunningJob, wall: float) -> None:
        """SIGTERM once the process exists (its Ray task may not have started it yet), then
        SIGKILL to the whole process group after the grace."""
        if job.kill_at_wall is None:
            if self._signal(job, signal.SIGTERM, group=True):
                job.kill_at_wall = wall + CANCEL_GRACE_S
        elif wall >= job.kill_at_wall:
            self._signal(job, signal.SIGKILL, group=True)

    def checkpoint(self, job_id: str) -> bool:
        """Send the checkpoint signal (SIGUSR1) to the job's main process -- only once that
        process shows up on its GPU: before that it may not have installed its handler yet,
        and SIGUSR1's default action would kill it instead of saving a checkpoint."""
        job = self.running.get(job_id)
        if job is None or (pid := self._pid(job)) is None:
            return False
        on_gpu = any(pid == p for i in job.gpus if self.monitors[i].last for p, _ in self.monitors[i].last.processes)
        return on_gpu and self._signal(job, signal.SIGUSR1, group=False)

    def summary(self, now_s: float) -> dict[str, Any]:
        states = self.snapshot(now_s)
        return {
            "node": self.name, "gpu_type": self.gpu_type, "backend": self.backend.name, "gpus": len(states),
            "idle_gpus": sum(1 for g in states if g.idle), "running": sorted(self.running),
            "free_mib": [round(g.memory_free_mib) for g in states],
            "smact_risk": [round(g.risk.smact, 3) for g in states], "launched_total": self.launched_total,
        }
