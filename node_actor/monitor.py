"""A node's GPU monitoring: one-second samples into the core's risk windows, and the snapshots
placement decides on.

Clock: every ``now_s`` is in *emulated* seconds (wall / time_scale; 1:1 on real GPUs), so the
30 s post-launch grace and the 1 s monitoring samples mean the same on every node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from hier_sched.core.gpu import GpuSample, GpuState, SharingMode
from hier_sched.core.monitoring import GpuMonitor
from node_actor.backends.base import DeviceBackend

__all__ = ["NodeMonitor", "Resident"]


@dataclass(frozen=True, slots=True)
class Resident:
    """What the snapshot needs to know of a run on some of this node's GPUs."""

    job_id: str
    gpus: tuple[int, ...]
    reserved_mib: float
    launched_s: float
    pid: int | None
    multi_gpu: bool


class NodeMonitor:
    def __init__(self, name: str, backend: DeviceBackend, *, sharing: SharingMode, launch_grace_s: float,
                 window: int = 30):
        self.name = name
        self.backend = backend
        self.sharing = sharing
        self.launch_grace_s = launch_grace_s
        self.gpu_type = backend.gpu_type()
        self.monitors = [GpuMonitor(window) for _ in range(backend.gpu_count())]
        self.last_sample_s: float | None = None
        self.last_launch_s: list[float | None] = [None] * len(self.monitors)

    def sample(self, now_s: float) -> list[GpuSample]:
        """Feed the windows the one-second samples since the last call (a run of them)."""
        readings = self.backend.sample()
        count = 1 if self.last_sample_s is None else math.floor(now_s) - math.floor(self.last_sample_s)
        for monitor, reading in zip(self.monitors, readings):
            if count > 0:
                monitor.observe(reading, count)
            else:
                monitor.last = reading  # memory is read fresh; the windows only advance per second
        self.last_sample_s = now_s
        return readings

    def memory_by_pid(self) -> dict[int, float]:
        return {pid: mib for m in self.monitors if m.last for pid, mib in m.last.processes}

    def launched(self, gpus: Iterable[int], now_s: float) -> None:
        for i in gpus:
            self.last_launch_s[i] = now_s

    def totals(self) -> list[float]:
        return [m.last.memory_total_mib if m.last else 0.0 for m in self.monitors]

    def snapshot(self, now_s: float, residents: Iterable[Resident]) -> list[GpuState]:
        """The GpuStates placement decides on (risk, memory, residents, grace, pending)."""
        residents = list(residents)
        states = []
        for index, monitor in enumerate(self.monitors):
            reading = monitor.last
            if reading is None:
                raise RuntimeError(f"node {self.name}: snapshot before the first sample")
            held = dict(reading.processes)
            here = [r for r in residents if index in r.gpus]
            pending = 0.0
            for r in here:
                # Its allocations may not be visible yet: within the post-launch grace, and for as
                # long as its process has not shown up on the GPU at all (a slow start on a busy
                # node can outlast the grace; the memory it was promised is still coming).
                if now_s - r.launched_s < self.launch_grace_s or r.pid not in held:
                    pending += max(0.0, r.reserved_mib - held.get(r.pid, 0.0)) if r.pid else r.reserved_mib
            states.append(GpuState(
                node=self.name, index=index, memory_total_mib=reading.memory_total_mib,
                memory_used_mib=reading.memory_used_mib, gpu_type=self.gpu_type, uuid=reading.uuid,
                risk=monitor.risk(), power_w=reading.power_w, resident_jobs=tuple(r.job_id for r in here),
                multi_gpu_jobs=sum(1 for r in here if r.multi_gpu), sharing=self.sharing,
                last_launch_s=self.last_launch_s[index], pending_mib=pending,
            ))
        return states
