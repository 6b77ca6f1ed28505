"""A node's runs: start them, watch them end, signal them, and report each end exactly once.

Every run leaves files in ``<state>/jobs/<job>/`` (``launcher.RunFiles``): the record of the run
as launched, the job's PID and, once it ended, its exit code (written by the exit recorder,
which outlives this actor). So a restarted node actor re-adopts what still runs and reports
what ended while it was away (``adopt``).

Ends are reported through an outbox of numbered ``RunEnded`` events that the global queue
acknowledges once it has logged them; an acknowledged run is marked on disk (``.acked``) and
never reported again. A report the queue received twice (it restarted before acknowledging)
is harmless: events name their attempt and the core ignores one about a run already ended.

A run whose job says its memory is steady (``hier_sched.memory_settled``: its ``.settled`` file)
settles once monitoring has seen it hold that much: its reservation shrinks to what it holds
(``core.learning.settled_reservation``), in its run record too, and a ``RunSettled`` event tells
the queue. A restarted node actor reads it back from the record and tells the queue again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from hier_sched.common.messages import RunOnNode
from hier_sched.common.paths import check_job_id
from hier_sched.common.private_files import private_dir, replace_private, write_private
from hier_sched.common.progress import read_progress
from hier_sched.core.events import NodeEvent, RunEnded, RunSettled
from hier_sched.core.failures import Failure, classify_failure
from hier_sched.core.gpu import Placement
from hier_sched.core.learning import settled_reservation
from node_actor.launcher import LaunchRequest, RunFiles, live_pid, read_outcome
from node_actor.monitor import Resident

__all__ = ["Launcher", "Run", "RunTable", "NO_EXIT_RECORD_GRACE_S"]

# A job whose process is gone but whose exit file is missing: the recorder may still be writing
# it; after this long (wall seconds) the run counts as killed.
NO_EXIT_RECORD_GRACE_S = 3.0


class Launcher(Protocol):
    def launch(self, request: LaunchRequest, resources: dict[str, float], env: dict[str, str]) -> Any:
        """Start ``run_process(request)``; returns a handle for ``failed``."""
        ...

    def failed(self, handle: Any) -> str | None:
        """Why the job's task failed before it could start the job, or None (running or fine)."""
        ...

    def ended(self, handle: Any) -> None:
        """The run of ``handle`` ended (its outcome came from its files): let go of its task."""
        ...


@dataclass(slots=True)
class Run:
    job_id: str
    attempt: int
    placement: Placement
    files: RunFiles
    launched_s: float  # scheduler clock
    multi_gpu: bool
    with_result: bool  # a Python callable job: its return value comes back
    pid: int | None = None
    peak_mib: float = 0.0  # largest per-process memory seen in monitoring (real GPUs)
    kill_at_wall: float | None = None  # a stop was sent: SIGKILL the group then
    kill_after_s: float | None = None  # a stop was ordered; sent once the process exists
    handle: Any = None  # the Ray task, while this actor incarnation owns it
    gone_since_wall: float | None = None  # process gone, exit record not (yet) there
    host: str = ""  # the Ray node (machine) it was started on; "" when unknown
    settled_mib: float | None = None  # its reservation per GPU since its memory settled (None: as placed)

    @property
    def reserved_mib(self) -> float:
        """What the run reserves on each of its GPUs now."""
        return self.placement.reserved_mib if self.settled_mib is None else self.settled_mib

    def record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "placement": asdict(self.placement),
                "launched_s": self.launched_s, "multi_gpu": self.multi_gpu, "with_result": self.with_result,
                "host": self.host, "settled_mib": self.settled_mib}

    @classmethod
    def from_record(cls, data: dict[str, Any], files: RunFiles) -> "Run":
        p = data["placement"]
        placement = Placement(**{**p, "gpus": tuple(p["gpus"])})
        return cls(data["job_id"], data["attempt"], placement, files, data["launched_s"], data["multi_gpu"],
                   data["with_result"], host=data.get("host", ""), settled_mib=data.get("settled_mib"))

    @property
    def resident(self) -> Resident:
        return Resident(self.job_id, self.attempt, self.placement.gpus, self.reserved_mib, self.launched_s, self.pid,
                        self.multi_gpu)


class RunTable:
    def __init__(self, jobs_dir: Path, launcher: Launcher, *, on_kill: Callable[[str], None] = lambda job_id: None,
                 host: str = ""):
        self.jobs_dir = Path(jobs_dir)
        self.launcher = launcher
        # The Ray node this table runs on. A run started on another one, found gone without an
        # exit record, died with its machine (the node came back, or a replacement took its
        # name): it was lost, not killed, and is requeued like the runs of a node found lost.
        self.host = host
        self.on_kill = on_kill  # a run that did not exit by itself ended: e.g. free the emulated memory it held
        self.runs: dict[str, Run] = {}
        # (seq, event, result, files of the run whose end it reports: acknowledged on disk; None: nothing to mark)
        self.outbox: list[tuple[int, NodeEvent, bytes | None, RunFiles | None]] = []
        self._seq = 0

    def files(self, job_id: str, attempt: int) -> RunFiles:
        check_job_id(job_id)
        return RunFiles(str(private_dir(self.jobs_dir / job_id)), attempt)

    # ------------------------------------------------------------------ starting and adopting
    def start(self, run: Run, request: LaunchRequest, resources: dict[str, float]) -> None:
        run.host = self.host
        write_private(run.files.record, json.dumps(run.record()))
        run.handle = self.launcher.launch(request, resources, request.env)
        self.runs[run.job_id] = run

    def adopt(self) -> None:
        """After a restart: take back the runs this node's earlier incarnation started. A run that
        still runs is watched again; one that ended (or vanished) is reported."""
        for record in sorted(self.jobs_dir.glob("*/attempt*.json")):
            attempt = int(record.stem.removeprefix("attempt"))
            files = RunFiles(str(record.parent), attempt)
            if os.path.exists(files.acked):
                continue
            try:
                run = Run.from_record(json.loads(record.read_text()), files)
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a record cut short by a crash at launch: that run never started
            current = self.runs.get(run.job_id)
            if current is None or current.attempt < run.attempt:
                self.runs[run.job_id] = run
        for run in self.runs.values():
            if run.settled_mib is not None:  # the queue may not have logged it before the restart
                self._report(RunSettled(run.job_id, run.attempt, run.settled_mib, run.placement.node), None, None)

    # ------------------------------------------------------------------ watching
    def poll(self, memory_by_pid: dict[int, float]) -> None:
        """Collect the runs that ended; escalate stops past their grace."""
        wall = time.time()
        for job_id, run in list(self.runs.items()):
            pid = self._pid(run)
            if pid is not None and pid in memory_by_pid:
                run.peak_mib = max(run.peak_mib, memory_by_pid[pid])
            if run.kill_after_s is not None:
                self._enforce_stop(run, wall)
            ended = self._ended(run, wall)
            if ended is not None:
                del self.runs[job_id]
                if run.handle is not None:
                    self.launcher.ended(run.handle)
                if ended[0].exit_code is None or ended[0].exit_code < 0:  # killed by a signal, or vanished
                    self.on_kill(job_id)
                self._report(*ended, run.files)
            elif run.settled_mib is None:
                self._settle(run)

    def _report(self, event: NodeEvent, result: bytes | None, files: RunFiles | None) -> None:
        self._seq += 1
        self.outbox.append((self._seq, event, result, files))

    def _settle(self, run: Run) -> None:
        """Once the job said its memory is steady and monitoring has seen it hold that much: its
        reservation becomes what it holds (with a measured peak's margin), on disk first."""
        try:
            said = float(Path(run.files.settled).read_text())
        except (OSError, ValueError):  # not said (yet), or being written
            return
        if run.peak_mib <= 0 or run.peak_mib < said:
            return  # monitoring has not seen it hold that much yet (its process' memory may not show at all)
        run.settled_mib = settled_reservation(run.placement.reserved_mib, run.peak_mib)
        replace_private(run.files.record, json.dumps(run.record()))  # whole: a restart re-adopts the run from it
        self._report(RunSettled(run.job_id, run.attempt, run.settled_mib, run.placement.node), None, None)

    def _ended(self, run: Run, wall: float) -> tuple[RunEnded, bytes | None] | None:
        """(how the run ended, its pickled return value) once it has ended, else None."""
        outcome = read_outcome(run.files, run.with_result)
        if outcome is not None:
            peak = outcome.peak_mib if outcome.peak_mib is not None else (run.peak_mib or None)
            if outcome.start_error:
                failure: Failure | None = Failure("start_error", outcome.start_error, outcome.exit_code)
            else:
                failure = classify_failure(outcome.exit_code, outcome.log_tail)
            return RunEnded(run.job_id, run.attempt, failure, outcome.exit_code, peak, run.placement.node), outcome.result
        task_error = self.launcher.failed(run.handle) if run.handle is not None else None
        if task_error is not None and run.pid is None and not os.path.exists(run.files.pid):
            return RunEnded(run.job_id, run.attempt, Failure("error", task_error), None, None, run.placement.node), None
        pid = self._pid(run)
        if pid is None and run.handle is not None:
            return None  # its task has not started the process yet
        if pid is not None and live_pid(run.files.pid) == pid:
            run.gone_since_wall = None
            return None
        run.gone_since_wall = run.gone_since_wall or wall
        if wall - run.gone_since_wall < NO_EXIT_RECORD_GRACE_S:
            return None
        if run.host and self.host and run.host != self.host:
            failure = Failure("lost", f"its node died under it (Ray node {run.host[:12]} is gone; this node is now "
                                      f"Ray node {self.host[:12]})")
        elif pid is None:  # launched by an earlier incarnation of this actor, whose death took the job's task along
            failure = Failure("lost", "its start was lost: the node actor that launched it died before the job's "
                                      "process started")
        else:
            failure = Failure("killed", "ended without an exit record (killed with its exit recorder)")
        return RunEnded(run.job_id, run.attempt, failure, None, run.peak_mib or None, run.placement.node), None

    def ack(self, upto: int) -> None:
        """The queue logged every event up to ``upto``: never report them again."""
        keep = []
        for entry in self.outbox:
            if entry[0] > upto:
                keep.append(entry)
            elif entry[3] is not None:
                Path(entry[3].acked).touch()
        self.outbox = keep

    def pending(self) -> list[tuple[int, NodeEvent, bytes | None]]:
        return [(seq, event, result) for seq, event, result, _ in self.outbox]

    def details(self) -> list[dict[str, Any]]:
        """What ``top`` shows of each run: how far the job says it is (``hier_sched.report_progress``;
        None: it says nothing) and the most GPU memory monitoring has seen it hold so far."""
        return [{"job_id": r.job_id, "attempt": r.attempt, "progress": read_progress(r.files.progress),
                 "peak_mib": round(r.peak_mib) if r.peak_mib > 0 else None} for r in self.runs.values()]

    def on_node(self) -> list[RunOnNode]:
        return [RunOnNode(r.job_id, r.attempt, r.placement) for r in self.runs.values()]

    def residents(self) -> list[Resident]:
        for run in self.runs.values():
            self._pid(run)
        return [r.resident for r in self.runs.values()]

    # ------------------------------------------------------------------ signals
    def _pid(self, run: Run) -> int | None:
        if run.pid is None:
            try:
                run.pid = int(Path(run.files.pid).read_text())
            except (OSError, ValueError):
                return None
        return run.pid

    def _signal(self, run: Run, sig: int, *, group: bool) -> bool:
        pid = self._pid(run)
        if pid is None or live_pid(run.files.pid) != pid:  # ended: its PID may be someone else's by now
            return False
        try:
            os.killpg(os.getpgid(pid), sig) if group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def stop(self, job_id: str, attempt: int, kill_after_s: float) -> bool:
        """SIGTERM to the run's process group now (or once it exists), SIGKILL after the grace."""
        run = self.runs.get(job_id)
        if run is None or run.attempt != attempt:
            return False
        run.kill_after_s = kill_after_s
        self._enforce_stop(run, time.time())
        return True

    def _enforce_stop(self, run: Run, wall: float) -> None:
        if run.kill_at_wall is None:
            if self._signal(run, signal.SIGTERM, group=True):
                run.kill_at_wall = wall + (run.kill_after_s or 0.0)
        elif wall >= run.kill_at_wall:
            self._signal(run, signal.SIGKILL, group=True)

    def signal_checkpoint(self, job_id: str, attempt: int, on_gpu: Callable[[int], bool]) -> bool:
        """SIGUSR1 to the job's main process -- only once it shows up on its GPU (``on_gpu``):
        before that it may not have installed its handler yet, and SIGUSR1's default action would
        kill it instead of saving a checkpoint."""
        run = self.runs.get(job_id)
        if run is None or run.attempt != attempt or (pid := self._pid(run)) is None:
            return False
        return on_gpu(pid) and self._signal(run, signal.SIGUSR1, group=False)

