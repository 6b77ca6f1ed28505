"""The ``emulated`` device backend: readings of a node's emulated GPUs (see ``emulated_device``).

It reads the device file the emulated job processes write, exactly as the NVML backend reads
the driver: the node actor cannot tell the difference, which is the point.
"""

from __future__ import annotations

from pathlib import Path

from hier_sched.core.gpu import GpuSample, SharingMode
from node_actor.backends.base import Availability, MigDevice
from node_actor.emulated_device import EmulatedNodeDevices

__all__ = ["EmulatedBackend"]


class EmulatedBackend:
    name = "emulated"

    def __init__(self, directory: str | Path, gpu_type: str = "A100-40GB", count: int = 1,
                 sharing: SharingMode | str = SharingMode.MPS, time_scale: float = 1.0):
        self.devices = EmulatedNodeDevices(directory, gpu_type, count, sharing, time_scale)

    @staticmethod
    def available() -> Availability:
        return Availability(True, "the GPU model needs no hardware")

    def gpu_count(self) -> int:
        return self.devices.count

    def sample(self) -> list[GpuSample]:
        return self.devices.samples()

    def gpu_type(self) -> str:
        return self.devices.gpu_type

    def uuids(self) -> list[str]:
        return [s.uuid for s in self.sample()]

    def mig_devices(self) -> list[MigDevice]:
        return []  # emulated MIG layouts are a simulator feature; live nodes emulate whole GPUs

    def close(self) -> None:
        """Nothing to release: the device file outlives the backend on purpose (jobs use it)."""
