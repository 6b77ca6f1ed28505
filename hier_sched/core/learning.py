"""What the scheduler learns of a job's memory from its earlier runs: one rule for both shells.

"The same job" is one ``job_signature`` — what runs, how big a batch, on how many GPUs. A job's
peak depends on the GPU type it ran on too (workspaces, allocator, process baseline), so peaks
are learned per (signature, GPU type): when a run succeeds, its measured peak is remembered for
the type of the GPUs it ran on (the largest seen); a later job of that signature whose estimator
learns (``auto``) is then believed to need that peak plus ``MEASURED_MARGIN`` on that type
instead of its estimate. Persistence is a small port: any ``get(key)`` / ``[key] = mib`` store —
a dict in the simulator, a file on a live cluster.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

__all__ = ["MEASURED_MARGIN", "PeakStore", "PeakLearner", "job_signature", "settled_reservation"]

# Run-to-run variation of one job's peak (allocator caching, cuDNN algorithm choice): a few per
# cent on the thesis' repeated runs, so a measured peak is reserved with 3 % on top.
MEASURED_MARGIN = 0.03


class PeakStore(Protocol):
    def get(self, signature: str, default: float | None = None) -> float | None: ...

    def __setitem__(self, signature: str, mib: float) -> None: ...


def job_signature(workload: str, batch_size: int | None, gpus: int) -> str:
    """A short stable key for "the same job" (the same text gives the same key everywhere)."""
    text = f"{workload}|b={batch_size if batch_size is not None else '-'}|gpus={gpus}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _peak_key(signature: str, gpu_type: str) -> str:
    return f"{signature}@{gpu_type}"


class PeakLearner:
    def __init__(self, store: PeakStore | None = None, margin: float = MEASURED_MARGIN):
        self.store: PeakStore = store if store is not None else {}
        self.margin = margin

    def observe(self, signature: str, gpu_type: str, peak_mib: float) -> None:
        """A run of ``signature`` on GPUs of ``gpu_type`` succeeded with this peak."""
        if peak_mib > 0:
            key = _peak_key(signature, gpu_type)
            known = self.store.get(key)
            if known is None or peak_mib > known:
                self.store[key] = float(peak_mib)

    def need(self, signature: str, gpu_type: str) -> float | None:
        """MiB to believe a job of this signature needs on a GPU of ``gpu_type``, or None when none
        has run on that type yet."""
        known = self.store.get(_peak_key(signature, gpu_type))
        return None if known is None else known * (1 + self.margin)


def settled_reservation(reserved_mib: float, held_mib: float) -> float:
    """A run's reservation once it has reported its memory settled (it reached the steady memory of
    its training steps, ``hier_sched.memory_settled``): what it holds, with the margin of a
    measured peak, never more than it was given. An over-estimated job gives the rest back to
    the GPU; an under-estimated one keeps its reservation (it holds more: that counts anyway)."""
    return min(reserved_mib, held_mib * (1 + MEASURED_MARGIN))
