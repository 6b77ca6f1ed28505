"""A node's GPU monitoring: one-second samples into the core's risk windows, and the snapshots
placement decides on.

Clock: every ``now_s`` is in *emulated* seconds (wall / time_scale; 1:1 on real GPUs), so the
30 s post-launch grace and the 1 s monitoring samples mean the same on every node.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from hier_sched.core.gpu import GpuSample, GpuState, SharingMode, unused_reservation_mib
from hier_sched.core.monitoring import GpuMonitor
from node_actor.backends.base import DeviceBackend

__all__ = ["NodeMonitor", "Resident"]


@dataclass(frozen=True, slots=True)
class Resident:
    """What the snapshot needs to know of a run on some of this node's GPUs."""

    job_id: str
    attempt: int
    gpus: tuple[int, ...]
    reserved_mib: float
    launched_s: float
    pid: int | None
    multi_gpu: bool


class NodeMonitor:
    def __init__(self, name: str, backend: DeviceBackend, *, sharing: SharingMode, window: int = 30):
        self.name = name
        self.backend = backend
        self.sharing = sharing
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
        """The GpuStates placement decides on (risk, memory, residents, grace, unused reservations)."""
        residents = list(residents)
        group_of = _ProcessGroups()
        states = []
        for index, monitor in enumerate(self.monitors):
            reading = monitor.last
            if reading is None:
                raise RuntimeError(f"node {self.name}: snapshot before the first sample")
            here = [r for r in residents if index in r.gpus]
            # What each run holds here: its processes on this GPU (the job leads its own process
            # group, so a launcher's or torchrun's workers count as the job's). A run whose
            # processes cannot be told apart holds nothing here: its whole reservation counts.
            held = [sum(mib for pid, mib in reading.processes if r.pid is not None and (pid == r.pid or group_of(pid) == r.pid))
                    for r in here]
            states.append(GpuState(
                node=self.name, index=index, memory_total_mib=reading.memory_total_mib,
                memory_used_mib=reading.memory_used_mib, gpu_type=self.gpu_type, uuid=reading.uuid,
                risk=monitor.risk(), power_w=reading.power_w, resident_jobs=tuple(r.job_id for r in here),
                resident_attempts=tuple(r.attempt for r in here),
                multi_gpu_jobs=sum(1 for r in here if r.multi_gpu), sharing=self.sharing,
                last_launch_s=self.last_launch_s[index],
                pending_mib=unused_reservation_mib(zip((r.reserved_mib for r in here), held)),
            ))
        return states


class _ProcessGroups:
    """pid -> its process group, asked of the kernel once per snapshot (None: gone, or not ours
    to see, e.g. in another PID namespace)."""

    def __init__(self) -> None:
        self._known: dict[int, int | None] = {}

    def __call__(self, pid: int) -> int | None:
        if pid not in self._known:
            try:
                self._known[pid] = os.getpgid(pid)
            except OSError:
                self._known[pid] = None
        return self._known[pid]
