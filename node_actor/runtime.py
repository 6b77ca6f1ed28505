"""One node's part of the scheduler, without Ray: it carries out launch orders, it does not re-plan.

``NodeRuntime`` is what the ``NodeActor`` wraps. The global queue plans on a snapshot a moment
old; the node checks an order against its own fresh snapshot with the core's fit rule
(``verify_placement``) and either launches exactly the ordered GPUs or declines with the reason.
The pieces it composes each have one job: ``NodeMonitor`` (samples and snapshots),
``plan_launch`` (argv, environment, MPS limits, Ray resources) and ``RunTable`` (runs, their
ends, signals, and the acknowledged outbox of events).

Clock: every ``now_s`` is in *emulated* seconds (wall / time_scale; 1:1 on real GPUs).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport
from hier_sched.common.private_files import open_private, write_private
from hier_sched.core.gpu import SharingMode
from hier_sched.core.placement import verify_placement
from hier_sched.core.scheduler_config import SchedulerConfig
from node_actor.backends.base import DeviceBackend
from node_actor.emulated_device import EmulatedNodeDevices
from node_actor.launch_plan import NodeFacts, plan_launch
from node_actor.monitor import NodeMonitor
from node_actor.mps import MpsController
from node_actor.supervision import Launcher, Run, RunTable

__all__ = ["NodeRuntime"]


class NodeRuntime:
    def __init__(self, name: str, backend: DeviceBackend, config: SchedulerConfig, *, state_dir: str | Path,
                 launcher: Launcher, sharing: SharingMode = SharingMode.MPS, window: int = 30,
                 emulated_device_dir: str | None = None, mps: MpsController | None = None, host: str = ""):
        self.name = name
        self.backend = backend
        self.config = config
        self.state_dir = Path(state_dir)
        self.emulated_device_dir = emulated_device_dir
        self.mps = mps
        self.incarnation = uuid.uuid4().hex[:12]
        self.monitor = NodeMonitor(name, backend, sharing=sharing, window=window)
        self.runs = RunTable(self.state_dir / "jobs", launcher, on_kill=self._release_device, host=host)
        self.runs.adopt()
        self.launched_total = 0
        self.version = 0  # of the snapshot and runs last reported (``exchange``)
        self._reported: tuple[list, list] | None = None

    @property
    def gpu_type(self) -> str:
        return self.monitor.gpu_type

    # ------------------------------------------------------------------ the loop
    def tick(self, now_s: float) -> None:
        """One monitoring sample, then collect the runs that ended."""
        self.monitor.sample(now_s)
        self.runs.poll(self.monitor.memory_by_pid())

    def snapshot(self, now_s: float):
        return self.monitor.snapshot(now_s, self.runs.residents())

    def exchange(self, now_s: float, ack: int = 0, incarnation: str | None = None, version: int = -1) -> NodeReport:
        """Snapshot, unacknowledged run events and current runs, in one answer. ``ack`` confirms the
        events up to that number (of this incarnation) were logged by the queue. ``version``: the
        one the queue holds; when the snapshot and runs are still that, they are left out."""
        if incarnation == self.incarnation:
            self.runs.ack(ack)
        picture = (self.snapshot(now_s), self.runs.on_node())
        if picture != self._reported:
            self._reported = picture
            self.version += 1
        if incarnation == self.incarnation and version == self.version:
            return NodeReport(self.name, now_s, None, self.incarnation, self.runs.pending(), None, self.version)
        return NodeReport(self.name, now_s, picture[0], self.incarnation, self.runs.pending(), picture[1], self.version)

    # ------------------------------------------------------------------ carrying out orders
    def launch(self, order: LaunchOrder, now_s: float) -> LaunchReply:
        """Start this node's part of a run if the ordered GPUs still fit; else decline, with why.
        The order's spec was validated at submission: the fit is all this checks."""
        job_id, placement = order.job_id, order.placement
        if placement.node != self.name:
            return LaunchReply(False, f"order for {placement.node} sent to {self.name}")
        running = self.runs.runs.get(job_id)
        if running is not None:
            same = running.attempt == order.launch.attempt
            return LaunchReply(same, f"{job_id} attempt {running.attempt} already runs on {self.name}")
        problem = verify_placement(order.launch.request, self.snapshot(now_s), placement.gpus,
                                   self.config.placement, now_s)
        if problem is not None:
            return LaunchReply(False, problem)
        files = self.runs.files(job_id, order.launch.attempt)
        if order.payload is not None:
            write_private(files.payload, order.payload)
        planned = plan_launch(order, files, self._facts())
        with os.fdopen(open_private(files.log), "a") as log:
            limit = planned.limit_mib
            log.write(f"==== hier_sched: attempt {order.launch.attempt} on {self.name} GPU(s) {list(placement.gpus)} "
                      f"(reserved {placement.reserved_mib:.0f} MiB, limit {f'{limit:.0f} MiB' if limit else 'none'})\n")
        run = Run(job_id, order.launch.attempt, placement, files, now_s, order.launch.world_size > 1,
                  order.payload is not None)
        self.runs.start(run, planned.request, planned.resources)
        self.monitor.launched(placement.gpus, now_s)
        self.launched_total += 1
        return LaunchReply(True, placement.reason)

    def _facts(self) -> NodeFacts:
        booked: dict[int, float] = {}
        for run in self.runs.runs.values():
            for i in run.placement.gpus:
                booked[i] = booked.get(i, 0.0) + run.placement.reserved_mib
        return NodeFacts(self.name, self.backend.uuids(), self.monitor.totals(), booked,
                         self.config.placement.no_estimate_mib, self.emulated_device_dir,
                         self.mps.client_env if self.mps is not None else None)

    def stop(self, job_id: str, attempt: int, kill_after_s: float) -> bool:
        return self.runs.stop(job_id, attempt, kill_after_s)

    def signal_checkpoint(self, job_id: str, attempt: int) -> bool:
        run = self.runs.runs.get(job_id)
        if run is None:
            return False
        on_gpu = {p for i in run.placement.gpus if (m := self.monitor.monitors[i].last) for p, _ in m.processes}
        return self.runs.signal_checkpoint(job_id, attempt, on_gpu.__contains__)

    def stop_all(self, kill_after_s: float) -> None:
        for run in list(self.runs.runs.values()):
            self.runs.stop(run.job_id, run.attempt, kill_after_s)

    def _release_device(self, job_id: str) -> None:
        """An emulated job killed by a signal could not detach itself: free its memory."""
        if self.emulated_device_dir is not None:
            EmulatedNodeDevices.open(self.emulated_device_dir).detach_everywhere(job_id)

    def summary(self, now_s: float) -> dict[str, Any]:
        states = self.snapshot(now_s)
        return {
            "node": self.name, "gpu_type": self.gpu_type, "backend": self.backend.name, "gpus": len(states),
            "idle_gpus": sum(1 for g in states if g.idle), "running": sorted(self.runs.runs),
            "free_mib": [round(g.memory_free_mib) for g in states],
            "smact_risk": [round(g.risk.smact, 3) for g in states], "launched_total": self.launched_total,
            "gpu_detail": [{"index": g.index, "total_mib": round(g.memory_total_mib), "used_mib": round(g.memory_used_mib),
                            "reserved_mib": round(sum(r.reserved_mib for r in self.runs.runs.values()
                                                      if g.index in r.placement.gpus)),
                            "smact": round(g.risk.smact, 3), "power_w": round(g.power_w, 1),
                            "residents": list(g.resident_jobs)} for g in states],
            "runs": self.runs.details(),
        }
