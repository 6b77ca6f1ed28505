"""Device backends: where the node actor's GPU readings come from (NVML, DCGM, emulated)."""

from node_actor.backends.base import Availability, BackendUnavailable, DeviceBackend, MigDevice
from node_actor.backends.dcgm import DcgmBackend
from node_actor.backends.nvml import NvmlBackend
from node_actor.backends.registry import BACKENDS, select_backend

__all__ = [
    "Availability",
    "BACKENDS",
    "BackendUnavailable",
    "DcgmBackend",
    "DeviceBackend",
    "MigDevice",
    "NvmlBackend",
    "select_backend",
]
