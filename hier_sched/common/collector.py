"""CPython's garbage collector in processes whose heap is mostly long-lived state.

The global queue keeps every job it knows and the simulator every job of its trace: hundreds of
thousands of records that live until the process ends. CPython collects its oldest generation
whenever that has grown by a quarter, and each such collection walks the whole heap, under the
GIL: 0.1-0.25 s at 10,000 jobs in the queue, 0.4 s at 40,000 in a replay, growing with them.
What survived a full collection is that long-lived state; frozen (``gc.freeze``), the next
collections walk only what came since. Nothing frozen is collected: a cycle of frozen objects
that later becomes garbage stays, which these processes, that drop little of what they keep,
can afford. Building such state in one go (a million trace jobs) pauses the collector instead.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused", "freeze_after_full_collections", "long_lived_heap"]


def freeze_after_full_collections() -> None:
    """From now on, freeze what survives each full collection (once per process, however often asked)."""
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def _freeze_survivors(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


@contextmanager
def long_lived_heap(young_threshold: int = 10_000) -> Iterator[None]:
    """Within: survivors of full collections frozen, and the youngest generation collected after
    ``young_threshold`` allocations instead of 700 -- a replay's objects mostly outlive a young
    collection, so each of them walked the same survivors again (a 40,000-job replay on 25,000
    GPUs: 2,119 young collections, 1.5 s). After: the collector as it was, and what it froze
    collectable again (a process may run several replays)."""
    thresholds = gc.get_threshold()
    registered = _freeze_survivors in gc.callbacks
    freeze_after_full_collections()
    gc.set_threshold(young_threshold, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not registered:
            gc.callbacks.remove(_freeze_survivors)
            gc.unfreeze()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection within (as before after): for building a long list of new objects at once,
    which each young collection would walk again while it grows (``traces.bulk``)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
