"""Choosing a node's device backend by name, or automatically.

``BACKENDS`` maps a name to a factory; the node actor registers ``"emulated"`` (the GPU model)
there itself. ``"auto"`` only ever picks real hardware: on a machine without GPUs it fails with
an error that points to the emulated backend, so a missing driver is never mistaken for an
empty node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from node_actor.backends.base import BackendUnavailable, DeviceBackend
from node_actor.backends.dcgm import DcgmBackend
from node_actor.backends.emulated import EmulatedBackend
from node_actor.backends.nvml import NvmlBackend

__all__ = ["BACKENDS", "BackendFactory", "select_backend"]

log = logging.getLogger(__name__)

BackendFactory = Callable[..., DeviceBackend]

BACKENDS: dict[str, BackendFactory] = {
    "nvml": NvmlBackend,
    "dcgm": DcgmBackend,  # DCGM activity + NVML memory
    "emulated": EmulatedBackend,  # the GPU model in a shared file (never picked by "auto")
}


def select_backend(preference: str = "auto", **options: Any) -> DeviceBackend:
    """Build the backend named ``preference`` with ``options``, or pick one with ``"auto"``.

    ``"auto"``: DCGM (with NVML memory) where both run, else NVML alone, else
    ``BackendUnavailable``; ``options`` go to whichever backend is picked.
    """
    if preference == "auto":
        return _auto(options)
    try:
        factory = BACKENDS[preference]
    except KeyError:
        known = ", ".join(["auto", *sorted(BACKENDS)])
        raise ValueError(f"unknown device backend {preference!r}; known: {known}") from None
    return factory(**options)


def _auto(options: dict[str, Any]) -> DeviceBackend:
    nvml = NvmlBackend.available()
    if not nvml:
        raise BackendUnavailable(
            f"no real GPU backend can run on this node ({nvml.reason}); "
            "on a machine without NVIDIA GPUs use the 'emulated' backend"
        )
    dcgm = DcgmBackend.available()
    if dcgm:
        return DcgmBackend(**options)
    log.info("DCGM unavailable (%s): NVML alone, SM activity approximated", dcgm.reason)
    return NvmlBackend(**options)
