"""The collector's set-up for long-lived heaps: survivors of a full collection frozen, and all as
it was afterwards."""

import gc

from hier_sched.common.collector import long_lived_heap


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
