"""The emulated GPUs of one node, kept in a file that real OS processes share.

Every emulated training job is its own process (so kill, exit codes, logs and signals are
real), yet they must all see one device: the memory ledger of ``EmulatedGpu``. The devices
therefore live in one msgpack file per node — each GPU's ``EmulatedGpu.to_state()``, the wall
time of the last change and each GPU's cumulative energy — read and written under
``fcntl.flock``. A process that allocates does load -> mutate -> save while holding the
exclusive lock, so two processes can never both take the last free gigabyte.

Time: ``time_scale`` is wall seconds per emulated second (0.01: a 3000 s job takes 30 s), and
energy integrates power over *emulated* seconds, so figures read like the real GPU's.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgpack

from hier_sched.common.private_files import open_private, private_dir, replace_private
from hier_sched.core.gpu import GpuSample, SharingMode
from hier_sched.device.gpu_model import EmulatedGpu, GpuBusy, GpuOutOfMemory, JobActivity

__all__ = ["EmulatedNodeDevices", "DeviceFileState", "emulated_now_s"]

_DEVICE_FILE = "devices.msgpack"
_LOCK_FILE = "devices.lock"


def emulated_now_s(time_scale: float) -> float:
    """The node's clock in emulated seconds (wall time divided by the time scale)."""
    return time.time() / time_scale


_PROBE_JOB = "<baseline probe>"  # the probe's name on the device: a job id cannot hold '<' or ' '  (paths.check_job_id)


@dataclass(slots=True)
class DeviceFileState:
    """What the file holds, loaded: mutate ``gpus`` inside ``locked()`` and it is saved."""

    gpus: list[EmulatedGpu]
    energy_j: list[float]
    wall_s: float
    time_scale: float

    def gpu(self, index: int) -> EmulatedGpu:
        if not 0 <= index < len(self.gpus):
            raise ValueError(f"no emulated GPU {index} on this node (it has {len(self.gpus)})")
        return self.gpus[index]


class EmulatedNodeDevices:
    """A node's emulated GPUs in ``directory`` (created on first use, reused afterwards)."""

    def __init__(self, directory: str | Path, gpu_type: str = "A100-40GB", count: int = 1,
                 sharing: SharingMode | str = SharingMode.MPS, time_scale: float = 1.0):
        if count < 1:
            raise ValueError(f"an emulated node needs at least one GPU (got {count})")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0 wall seconds per emulated second (got {time_scale})")
        self.directory = Path(directory)
        private_dir(self.directory)
        self.path = self.directory / _DEVICE_FILE
        self._lock_path = self.directory / _LOCK_FILE
        self.gpu_type = gpu_type
        self.count = count
        self.sharing = SharingMode(sharing)
        self.time_scale = time_scale
        with self.locked(write=not self.path.is_file()) as state:  # creates the file when it does not exist yet
            if len(state.gpus) != count or state.gpus[0].gpu_type.name != gpu_type:
                raise ValueError(f"{self.path} holds {len(state.gpus)} x {state.gpus[0].gpu_type.name}, not "
                                 f"{count} x {gpu_type}: remove it to start a new emulated node")

    @classmethod
    def open(cls, directory: str | Path) -> "EmulatedNodeDevices":
        """Attach to an existing device file (what an emulated job process does)."""
        path = Path(directory) / _DEVICE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no emulated device file {path}: is the node actor running?")
        raw = msgpack.unpackb(path.read_bytes())
        first = raw["gpus"][0]
        return cls(directory, first["gpu_type"] if isinstance(first["gpu_type"], str) else "A100-40GB",
                   len(raw["gpus"]), first["sharing"], raw["time_scale"])

    @contextmanager
    def locked(self, *, write: bool = True) -> Iterator[DeviceFileState]:
        """Load under the lock, yield, and (``write``) save what the caller changed.

        Energy is brought up to now before the caller sees the devices, so a change of power
        starts its own interval."""
        with os.fdopen(open_private(self._lock_path, os.O_RDWR), "r+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            try:
                state = self._load_or_create()
                self._integrate_energy(state, time.time())
                yield state
                if write:
                    self._save(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def samples(self) -> list[GpuSample]:
        """One reading per GPU (what NVML/DCGM would report), energy up to now."""
        with self.locked(write=False) as state:
            return [g.sample(energy_j=e) for g, e in zip(state.gpus, state.energy_j)]

    def process_baseline_mib(self, index: int = 0) -> float | None:
        """What a process holds on emulated GPU ``index`` before its first allocation, read as the
        real probe reads NVML: a probe process attaches, is found by its pid in the device's
        process list, and detaches. None when the GPU cannot take another process now."""
        pid = os.getpid()
        with self.locked() as state:
            gpu = state.gpu(index)
            try:
                gpu.attach(_PROBE_JOB, JobActivity(0.0), pid=pid)
            except (GpuOutOfMemory, GpuBusy):
                return None
            try:
                processes = gpu.sample().processes
            finally:
                gpu.detach(_PROBE_JOB)
        return next((mib for p, mib in processes if p == pid), None)

    def detach_everywhere(self, job_id: str) -> float:
        """Free whatever ``job_id`` still holds (a killed process cannot detach itself)."""
        with self.locked() as state:
            return sum(g.detach(job_id) for g in state.gpus)

    # ------------------------------------------------------------------ file format
    def _load_or_create(self) -> DeviceFileState:
        if self.path.is_file() and self.path.stat().st_size:
            raw = msgpack.unpackb(self.path.read_bytes())
            return DeviceFileState([EmulatedGpu.from_state(s) for s in raw["gpus"]], list(raw["energy_j"]),
                                   raw["wall_s"], raw["time_scale"])
        gpus = [EmulatedGpu(self.gpu_type, index=i, uuid=f"GPU-emulated-{self.directory.name}-{i}", sharing=self.sharing)
                for i in range(self.count)]
        return DeviceFileState(gpus, [0.0] * self.count, time.time(), self.time_scale)

    def _save(self, state: DeviceFileState) -> None:
        payload = msgpack.packb({"gpus": [g.to_state() for g in state.gpus], "energy_j": state.energy_j,
                                 "wall_s": state.wall_s, "time_scale": state.time_scale})
        replace_private(self.path, payload)  # a reader that ignores the lock still never sees half a file

    @staticmethod
    def _integrate_energy(state: DeviceFileState, wall_now: float) -> None:
        emulated_dt = max(0.0, wall_now - state.wall_s) / state.time_scale
        state.energy_j = [e + g.power_w() * emulated_dt for g, e in zip(state.gpus, state.energy_j)]
        state.wall_s = wall_now
