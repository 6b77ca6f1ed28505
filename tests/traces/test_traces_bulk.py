"""``trace_jobs`` builds values indistinguishable from ``TraceJob(*row)``."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from traces.bulk import trace_jobs
from traces.schema import TraceJob

ROWS = [("a", 1.0, "w", 2, 10.0, 100.0, 0.5, 0.2, 0.1, 1, 32, "cnn", 1.0, None, 3.0),
        ("b", 2.0, "v", 1, 5.0, 50.0)]


def test_same_values_as_the_dataclass_constructor():
    built = trace_jobs(iter(ROWS))
    expected = [TraceJob(*row) for row in ROWS]
    assert built == expected
    assert [type(j) for j in built] == [TraceJob, TraceJob]
    assert [hash(j) for j in built] == [hash(j) for j in expected]
    assert repr(built[1]) == repr(expected[1])
    assert dataclasses.replace(built[0], gpus=4).gpus == 4


def test_built_values_are_frozen():
    job = trace_jobs(ROWS)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.gpus = 3  # type: ignore[misc]


def test_garbage_collector_state_is_restored():
    assert gc.isenabled()
    trace_jobs(ROWS)
    assert gc.isenabled()
    with pytest.raises(TypeError):
        trace_jobs([("too", "few")])
    assert gc.isenabled()
