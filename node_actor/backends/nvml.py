"""Device readings through NVML (``import pynvml``, provided by the ``nvidia-ml-py`` package).

NVML gives exact memory (total, used, per process), power, the energy counter, UUIDs and MIG
slices. It does *not* give DCGM's profiling metrics. Without DCGM this backend fills the
activity fields conservatively from NVML's coarse utilization:

* ``smact`` <- ``utilization.gpu`` (fraction of time any kernel ran). It is an upper bound of SM
  activity — the recorded micro-benchmark in ``shared/data/telemetry/pmdlt`` shows 90 % GPU
  utilization at SMACT 0.002 — so the utilization gate errs towards *not* collocating.
* ``drama`` <- ``utilization.memory`` (fraction of time device memory was read or written).
* ``smocc`` <- 0: NVML has no occupancy figure.

Use the ``dcgm`` backend (DCGM activity + NVML memory) where DCGM runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from hier_sched.core.gpu import GpuSample
from node_actor.backends.base import Availability, BackendUnavailable, MigDevice
from node_actor.backends.device_names import gpu_type_for, is_compute_device

__all__ = ["NvmlBackend"]

_MIB = 1024 * 1024
_MIG_PROFILE = re.compile(r"\d+g\.\d+gb")
T = TypeVar("T")


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    """Older pynvml releases return ``bytes`` for names and UUIDs (a byte that is not UTF-8
    becomes U+FFFD rather than an error that would keep the node from starting)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlBackend:
    """Reads this node's GPUs through NVML; ``nvml`` lets a caller pass the library module."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise BackendUnavailable(f"NVML could not start: {error}") from error
        self._open = True
        self._devices: list[tuple[int, Any, str]] = []  # (NVML index, handle, name)
        for index in range(self._nvml.nvmlDeviceGetCount()):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            device_name = _text(self._nvml.nvmlDeviceGetName(handle))
            if is_compute_device(device_name):
                self._devices.append((index, handle, device_name))
        if not self._devices:
            self.close()
            raise BackendUnavailable("NVML found no compute GPU on this node")
        self._uuids = [_text(self._nvml.nvmlDeviceGetUUID(h)) for _, h, _ in self._devices]

    @classmethod
    def available(cls, nvml: ModuleType | Any | None = None) -> Availability:
        """Whether NVML loads and sees at least one device; the reason when it does not."""
        try:
            module = nvml if nvml is not None else _import_pynvml()
        except ImportError:
            return Availability(False, "pynvml is not installed (pip install nvidia-ml-py)")
        try:
            module.nvmlInit()
        except module.NVMLError as error:
            return Availability(False, f"NVML could not start: {error}")
        try:
            count = module.nvmlDeviceGetCount()
        finally:
            module.nvmlShutdown()
        if count == 0:
            return Availability(False, "NVML sees no GPU")
        return Availability(True, f"NVML sees {count} device(s)")

    def gpu_count(self) -> int:
        return len(self._devices)

    def uuids(self) -> list[str]:
        return list(self._uuids)

    def gpu_type(self) -> str:
        """The first schedulable GPU's type (nodes are assumed homogeneous)."""
        _, handle, device_name = self._devices[0]
        total_mib = self._nvml.nvmlDeviceGetMemoryInfo(handle).total / _MIB
        return gpu_type_for(device_name, total_mib)

    def sample(self) -> list[GpuSample]:
        return [
            self._sample_one(index, handle, uuid)
            for (index, handle, _), uuid in zip(self._devices, self._uuids)
        ]

    def _sample_one(self, index: int, handle: Any, uuid: str) -> GpuSample:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        energy_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        return GpuSample(
            index=index,
            uuid=uuid,
            memory_total_mib=memory.total / _MIB,
            memory_used_mib=memory.used / _MIB,
            smact=utilization.gpu / 100.0 if utilization is not None else 0.0,
            drama=utilization.memory / 100.0 if utilization is not None else 0.0,
            power_w=power_mw / 1000.0 if power_mw is not None else 0.0,
            energy_j=energy_mj / 1000.0 if energy_mj is not None else 0.0,
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> tuple[tuple[int, float], ...]:
        """(pid, MiB) of every compute process; under MPS the clients are listed separately
        from the MPS server, so both lists are merged. Memory NVML cannot attribute counts 0."""
        used_by_pid: dict[int, float] = {}
        for query in (
            self._nvml.nvmlDeviceGetComputeRunningProcesses,
            self._nvml.nvmlDeviceGetMPSComputeRunningProcesses,
        ):
            for process in self._optional(query, handle) or ():
                used_mib = (process.usedGpuMemory or 0) / _MIB
                used_by_pid[process.pid] = max(used_mib, used_by_pid.get(process.pid, 0.0))
        return tuple(sorted(used_by_pid.items()))

    def mig_devices(self) -> list[MigDevice]:
        nvml = self._nvml
        slices: list[MigDevice] = []
        for index, handle, _ in self._devices:
            mode = self._optional(nvml.nvmlDeviceGetMigMode, handle)
            if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                continue
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nvml.NVMLError_NotFound:
                    continue  # an empty slot: MIG slots need not be contiguous
                mig_name = _text(nvml.nvmlDeviceGetName(mig))
                profile = _MIG_PROFILE.search(mig_name)
                slices.append(
                    MigDevice(
                        parent_index=index,
                        uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                        profile=profile.group(0) if profile else mig_name,
                        memory_total_mib=nvml.nvmlDeviceGetMemoryInfo(mig).total / _MIB,
                        gpu_instance_id=self._optional(nvml.nvmlDeviceGetGpuInstanceId, mig),
                        compute_instance_id=self._optional(nvml.nvmlDeviceGetComputeInstanceId, mig),
                    )
                )
        return slices

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()

    def _optional(self, query: Callable[..., T], *args: Any) -> T | None:
        """A reading some GPUs or drivers do not offer (energy before Volta, utilization in MIG
        mode, ...): ``None`` instead of an error."""
        try:
            return query(*args)
        except (self._nvml.NVMLError_NotSupported, self._nvml.NVMLError_NoPermission):
            return None
