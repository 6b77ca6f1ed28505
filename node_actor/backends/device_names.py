"""From what the driver calls a device to what the scheduler calls its type.

NVML and nvidia-smi report names like ``NVIDIA A100-SXM4-40GB`` or ``Tesla T4``; the GPU
constants table (``hier_sched.core.gpu_types``) is keyed ``A100-40GB``, ``T4``. Some nodes also
carry a device no job may use: the DGX Station A100 lists an ``NVIDIA DGX Display`` (4 GiB)
between its four A100s (see ``shared/data/telemetry/pmdlt/1024.128.nvsm.txt``).
"""

from __future__ import annotations

import re

from hier_sched.core.gpu_types import GPU_TYPES

__all__ = ["is_compute_device", "gpu_type_for"]

_NON_COMPUTE_MARKERS = ("DISPLAY",)


def is_compute_device(device_name: str) -> bool:
    """False for display-only devices that must never receive a job."""
    upper = device_name.upper()
    return not any(marker in upper for marker in _NON_COMPUTE_MARKERS)


def gpu_type_for(device_name: str, memory_total_mib: float) -> str:
    """The ``GPU_TYPES`` key for a device, or the driver's name unchanged when none matches.

    The model family (``A100``, ``T4``, ``RTX-3090``) must appear in the name as a whole token;
    among the table's types of that family the one with the closest memory size wins, which
    tells ``A100-40GB`` from ``A100-80GB`` without trusting the marketing suffix.
    """
    normalized = re.sub(r"[\s_]+", "-", device_name.upper())
    candidates = [
        gpu_type
        for gpu_type in GPU_TYPES.values()
        if re.search(rf"(?<![A-Z0-9]){re.escape(_family(gpu_type.name))}(?![0-9])", normalized)
    ]
    if not candidates:
        return device_name
    return min(candidates, key=lambda t: abs(t.memory_mib - memory_total_mib)).name


def _family(type_name: str) -> str:
    return re.sub(r"-\d+GB$", "", type_name.upper())
