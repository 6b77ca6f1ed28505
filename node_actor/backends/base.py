"""What every device backend offers the node actor, whatever it reads its GPUs through.

A backend only *reads* devices; it never decides. The node actor turns its ``GpuSample`` list
into ``GpuState`` snapshots for the pure placement core. Index convention: ``GpuSample.index`` is
the NVML index of the device (stable for the node's lifetime); launches must address a device
by its UUID (``uuids()``), because CUDA's own enumeration order can differ from NVML's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hier_sched.core.gpu import GpuSample

__all__ = ["Availability", "BackendUnavailable", "DeviceBackend", "MigDevice"]


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this node (no library, no tool, no GPU)."""


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run here, and if not, why (truthy when it can)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG slice: jobs are dispatched to slices whole (no MPS mixing inside MIG)."""

    parent_index: int
    uuid: str  # "MIG-..." — what CUDA_VISIBLE_DEVICES takes
    profile: str  # e.g. "1g.5gb", matching hier_sched.core.gpu_types.MigProfile.name
    memory_total_mib: float
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@runtime_checkable
class DeviceBackend(Protocol):
    """A source of per-GPU readings for one node."""

    name: str

    def gpu_count(self) -> int:
        """Number of schedulable GPUs (display-only devices excluded)."""
        ...

    def sample(self) -> list[GpuSample]:
        """One reading per schedulable GPU, in index order."""
        ...

    def gpu_type(self) -> str:
        """The node's GPU type, a key of ``hier_sched.core.gpu_types.GPU_TYPES`` when known."""
        ...

    def uuids(self) -> list[str]:
        """UUIDs of the schedulable GPUs, in the order of ``sample()``."""
        ...

    def mig_devices(self) -> list[MigDevice]:
        """The MIG slices that exist now (empty when no GPU is in MIG mode)."""
        ...

    def close(self) -> None:
        """Release the library handle / stop helper processes. Idempotent."""
        ...
