"""The simulated cluster: emulated GPUs with their monitoring windows, on a virtual clock.

Each ``SimGpu`` wraps one ``EmulatedGpu`` (the same device model the live node actor runs) and
a ``GpuMonitor`` (the same window the live node fills once per second). Metrics are constant
between events, so the monitor receives runs of identical one-second samples — exactly what
the live loop would have recorded — and the energy integral advances piecewise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState, SharingMode, gpu_state, unused_reservation_mib
from hier_sched.core.gpu_types import gpu_type
from hier_sched.core.monitoring import DEFAULT_WINDOW, GpuMonitor
from hier_sched.device.gpu_model import EmulatedGpu, mig_slices

__all__ = ["ClusterShape", "SimGpu", "SimCluster", "REPORT_DELAY_S"]

# How late a node's news reaches the planner by default: the live queue's tick (0.2 s) plus the
# report's round trip (``replay.world``).
REPORT_DELAY_S = 0.25

# MIG layouts used when a replay asks for --sharing mig (the thesis' mixed-workload split).
DEFAULT_MIG_LAYOUT = {
    "A100-40GB": ("4g.20gb", "2g.10gb", "1g.5gb"),
    "A100-80GB": ("4g.40gb", "2g.20gb", "1g.10gb"),
    "H100-80GB": ("4g.40gb", "2g.20gb", "1g.10gb"),
}


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """Nodes of the cluster as (name, GPU count, GPU type)."""

    nodes: tuple[tuple[str, int, str], ...]
    sharing: SharingMode = SharingMode.MPS

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int, gpu: str = "A100-40GB", sharing: SharingMode = SharingMode.MPS):
        width = max(1, len(str(nodes - 1)))
        return cls(tuple((f"node{i:0{width}d}", gpus_per_node, gpu) for i in range(nodes)), sharing)

    @property
    def total_gpus(self) -> int:
        return sum(g for _, g, _ in self.nodes)


def _nothing() -> None:
    pass


class SimGpu:
    __slots__ = (
        "node", "index", "device", "multi_gpu_jobs", "monitor", "last_flush_s", "last_launch_s", "reserved", "energy_j",
        "smact_integral", "busy_s", "power_w", "smact", "last_power_s", "series", "quiet_after_s", "window", "_state",
        "_activity", "on_change", "seen_used", "seen_pending", "seen_residents", "seen_multi", "seen_launch", "seen_idle",
        "attempts", "seen_attempts",
    )

    def __init__(self, node: str, index: int, device: EmulatedGpu, window: int, record_series: bool):
        self.node = node
        self.index = index
        self.device = device
        self.multi_gpu_jobs = 0
        self.monitor = GpuMonitor(window)
        self.last_flush_s = 0.0
        self.last_launch_s: float | None = None
        self.reserved: dict[str, float] = {}  # resident job -> MiB reserved for it here
        self.attempts: dict[str, int] = {}  # resident job -> the attempt that runs here
        self.energy_j = 0.0
        self.smact_integral = 0.0
        self.busy_s = 0.0  # time with at least one job on the GPU, however many share it
        self.power_w = device.power_w()
        self.smact = 0.0
        self._activity = device.utilization()  # (SMACT, SMOCC, DRAMA): constant until the device changes
        self.last_power_s = 0.0
        # (t, memory used MiB, SMACT, power W) at every change, from the idle state at t = 0 on
        self.series: list[tuple[float, float, float, float]] | None = (
            [(0.0, device.memory_used_mib, 0.0, self.power_w)] if record_series else None)
        self.window = window
        self.quiet_after_s = 0.0
        self._state: GpuState | None = None  # the last snapshot: valid until a change or a new sample
        # Told whenever the snapshot is dropped (the next one is a new object): the planner's index
        # keeps what it learnt from a node's snapshots until then (``ClusterIndex.changed``).
        self.on_change: Callable[[], None] = _nothing
        # What the node last reported of the device (``see``): the planner's snapshots show this,
        # not the device itself, so a change reaches the planner only with the node's next report.
        self.seen_used = device.memory_used_mib
        self.seen_pending = 0.0
        self.seen_residents: tuple[str, ...] = ()
        self.seen_attempts: tuple[int, ...] = ()
        self.seen_multi = 0
        self.seen_launch: float | None = None
        self.seen_idle = True

    def flush(self, now_s: float) -> None:
        """Record the one-second samples the live monitor would have taken up to ``now_s``.

        Once a GPU's activity has been constant for 20 windows its window holds one value and
        its EMA has converged (to within (1 - 2/(W+1))**(20 W) < 1e-17), so further identical
        samples change nothing and are skipped."""
        if self.last_flush_s >= self.quiet_after_s:
            self.last_flush_s = now_s
            return
        count = math.floor(now_s) - math.floor(self.last_flush_s)
        if count > 0:
            self.monitor.observe_tuple(self._activity, count)
            self._state = None  # the window moved: the risk in the snapshot did too
            self.on_change()
        self.last_flush_s = now_s

    def before_change(self, now_s: float) -> None:
        """Close the current constant-metrics interval (monitor, energy) before the device changes."""
        self.flush(now_s)
        dt = now_s - self.last_power_s
        self.energy_j += self.power_w * dt
        self.smact_integral += self.smact * dt
        if self.device.residents:
            self.busy_s += dt
        self.last_power_s = now_s

    def after_change(self, now_s: float) -> None:
        """The device changed (a job arrived, allocated or left): new power, SMACT, snapshot."""
        self.quiet_after_s = now_s + 20 * self.window
        self._state = None
        self.on_change()
        self.power_w = self.device.power_w()
        self._activity = self.device.utilization()
        self.smact = self._activity[0]
        if self.series is not None:
            self.series.append((now_s, self.device.memory_used_mib, self.smact, self.power_w))

    def see(self) -> None:
        """Take the device as it is now into what the node reports (its next report, live)."""
        dev = self.device
        self.seen_used = dev.memory_used_mib
        reserved = self.reserved
        self.seen_pending = unused_reservation_mib(
            (mib, dev.job_memory_mib(job)) for job, mib in reserved.items()) if reserved else 0.0
        self.seen_residents = dev.residents
        self.seen_attempts = tuple(self.attempts.get(job, 0) for job in self.seen_residents)
        self.seen_multi = self.multi_gpu_jobs
        self.seen_launch = self.last_launch_s
        self.seen_idle = not self.seen_residents
        self._state = None  # (the index hears of it from ``SimCluster.report``)

    def state(self, now_s: float, gpu_type_name: str, sharing: SharingMode) -> GpuState:
        """The snapshot the planner gets: the node's last report, with the monitoring window as of now."""
        if self.last_flush_s != now_s:  # (a second flush at the same time changes nothing)
            self.flush(now_s)
        if self._state is not None:
            return self._state
        dev = self.device
        state = gpu_state(  # positional, and fast: this is the simulator's hottest constructor
            self.node, self.index, dev.memory_total_mib, self.seen_used, gpu_type_name, dev.uuid,
            self.monitor.risk(), self.power_w, self.seen_residents, self.seen_multi, sharing, dev.mig_profile,
            self.seen_launch, self.seen_pending, self.seen_attempts,
        )
        self._state = state
        return state

    def fresh_state(self, now_s: float, gpu_type_name: str, sharing: SharingMode) -> GpuState:
        """The device as it is now: what the node checks a launch order against."""
        self.flush(now_s)
        dev = self.device
        reserved = self.reserved
        pending = unused_reservation_mib((mib, dev.job_memory_mib(job)) for job, mib in reserved.items())
        return gpu_state(self.node, self.index, dev.memory_total_mib, dev.memory_used_mib, gpu_type_name, dev.uuid,
                         self.monitor.risk(), self.power_w, dev.residents, self.multi_gpu_jobs, sharing, dev.mig_profile,
                         self.last_launch_s, pending, tuple(self.attempts.get(job, 0) for job in dev.residents))

    @property
    def seen_free(self) -> float:
        """Free memory as the node last reported it, reservations not yet used counted as used."""
        return self.device.memory_total_mib - self.seen_used - self.seen_pending


class SimCluster:
    """All simulated GPUs, grouped by node, plus the planner's ``ClusterIndex``."""

    def __init__(self, shape: ClusterShape, *, window: int = DEFAULT_WINDOW, record_series: bool | None = None):
        self.shape = shape
        record = shape.total_gpus <= 16 if record_series is None else record_series
        self.gpus: dict[str, list[SimGpu]] = {}
        self.gpu_type_of: dict[str, str] = {}
        for name, count, type_name in shape.nodes:
            kind = gpu_type(type_name)
            devices: list[EmulatedGpu] = []
            for i in range(count):
                uuid = f"GPU-{name}-{i}"
                if shape.sharing is SharingMode.MIG:
                    layout = DEFAULT_MIG_LAYOUT.get(type_name)
                    if layout is None:
                        raise ValueError(f"GPU type {type_name} has no MIG layout; use --sharing mps|streams|none")
                    devices.extend(mig_slices(kind, layout, uuid=uuid))
                else:
                    devices.append(EmulatedGpu(kind, index=i, uuid=uuid, sharing=shape.sharing))
            self.gpus[name] = [SimGpu(name, j, d, window, record) for j, d in enumerate(devices)]
            self.gpu_type_of[name] = type_name
        self.index = ClusterIndex([(n, len(g)) for n, g in self.gpus.items()], self._snapshot, self._runs_on,
                                  [self.gpu_type_of[n] for n in self.gpus])
        self.index.sharing = shape.sharing
        for name, gpus in self.gpus.items():
            for g in gpus:
                g.on_change = partial(self.index.changed, name)
        self.now_s = 0.0
        self.down: set[str] = set()  # nodes lost: no longer offered
        self.largest_node = max(len(g) for g in self.gpus.values())
        self.largest_gpu_mib = max(g.device.memory_total_mib for g in self.all_gpus())
        for name, gpus in self.gpus.items():
            for g in gpus:
                self.index.update_gpu(name, g.index, g.seen_free, idle_delta=1)
            self.index.gpu_total_mib = max(self.index.gpu_total_mib, max(g.device.memory_total_mib for g in gpus))
        # each type's GPU memory as simulated (a MIG slice's, under MIG)
        for kind in self.index.type_names:
            self.index.type_capacity[kind] = max(g.device.memory_total_mib for name, gpus in self.gpus.items()
                                                 if self.gpu_type_of[name] == kind for g in gpus)

    def _snapshot(self, node: str) -> list[GpuState]:
        kind = self.gpu_type_of[node]
        return [g.state(self.now_s, kind, self.shape.sharing) for g in self.gpus[node]]

    def _runs_on(self, node: str, gpu: int) -> Iterable[tuple[str, int]]:
        """The runs the node's last report shows on one GPU (the launch ledger asks it of the GPUs
        of every unshown run, at every plan: a node's every GPU built then was 8 % of a replay)."""
        g = self.gpus[node][gpu]
        return zip(g.seen_residents, g.seen_attempts)

    def fresh_snapshot(self, node: str, indices: tuple[int, ...]) -> list[GpuState]:
        """GPUs ``indices`` of ``node`` as they are now (not as last reported)."""
        kind = self.gpu_type_of[node]
        gpus = self.gpus[node]
        return [gpus[i].fresh_state(self.now_s, kind, self.shape.sharing) for i in indices]

    def report(self, gpus: Iterable[SimGpu]) -> bool:
        """These GPUs' node reports them as they are now: the planner's index learns their state.
        True when one has more room than reported before (a job ended, or holds less)."""
        more = False
        for g in gpus:
            if g.node in self.down:
                continue
            was_idle, was_free = g.seen_idle, g.seen_free
            g.see()
            more |= g.seen_free > was_free or (g.seen_idle and not was_idle)
            self.index.update_gpu(g.node, g.index, g.seen_free, g.seen_idle - was_idle)
        return more

    def lose(self, node: str) -> None:
        """The node is gone: offered no more until it is back (``rejoin``)."""
        self.down.add(node)
        self.index.remove(node)
        for g in self.gpus[node]:
            g.seen_idle = False  # (the index counts none of its GPUs idle now)

    def rejoin(self, node: str) -> None:
        self.down.discard(node)
        self.report(self.gpus[node])

    def all_gpus(self):
        for gpus in self.gpus.values():
            yield from gpus

