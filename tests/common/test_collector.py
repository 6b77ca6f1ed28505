"""The collector's set-up for long-lived heaps: survivors of a full collection frozen, and all as
it was afterwards."""

import gc

from hier_sched.common.collector import collector_paused, long_lived_heap


def test_within_a_long_lived_heap_what_survives_a_full_collection_is_frozen_and_afterwards_not() -> None:
    before = gc.get_threshold()
    kept = [[i] for i in range(1000)]  # long-lived state
    with long_lived_heap(young_threshold=5000):
        assert gc.get_threshold() == (5000, *before[1:])
        gc.collect(1)
        assert gc.get_freeze_count() == 0  # a younger collection freezes nothing
        gc.collect()
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert not [cb for cb in gc.callbacks if getattr(cb, "__module__", "") == "hier_sched.common.collector"]


def test_the_collector_paused_within_is_on_again_after_unless_it_was_off() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
