"""The scheduler's query API and its read-only job views (core.views): what shells may read."""

from __future__ import annotations

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import CheckpointRequested, JobTicket, NodeJoined, RunEnded, Submitted
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState
from hier_sched.core.job import JobState
from hier_sched.core.presets import preset
from hier_sched.core.scheduler import Scheduler

TOTAL = 40536.0


def idle(node="n0", gpus=1) -> ClusterIndex:
    return ClusterIndex.from_snapshots({node: [GpuState(node, i, TOTAL, 0.0) for i in range(gpus)]})


def test_a_view_follows_its_job_and_cannot_change_it():
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (TOTAL,)), Submitted(JobTicket("a", "a", need_mib=4000.0))], 0.0)
    view = s.view("a")
    assert view.state is JobState.QUEUED and view.attempts == 0 and s.state_of("a") is JobState.QUEUED
    s.step([], idle(), 1.0)
    assert view.state is JobState.RUNNING and view.attempts == 1 and view.nodes_ran == ("n0",)
    with pytest.raises(AttributeError):
        view.attempts = 5  # type: ignore[misc]
    assert s.view("nope") is None and s.state_of("nope") is None and not s.knows("nope")


def test_status_counts_and_the_jobs_by_end():
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (TOTAL, TOTAL))], 0.0)
    s.step([Submitted(JobTicket(j, j, need_mib=30000.0)) for j in ("a", "b", "c")], idle(gpus=2), 1.0)
    assert s.counts().queued == 1 and s.counts().jobs == 3 and s.unfinished() == ["a", "b", "c"]
    s.step([CheckpointRequested("a")], None, 2.0)
    assert s.awaits_checkpoint("a", 1) and not s.awaits_checkpoint("a", 2) and not s.awaits_checkpoint("b", 1)
    s.step([RunEnded("b", 1)], None, 3.0)
    s.step([RunEnded("a", 1, Failure("oom", "oom"), 1, 39000.0)], None, 4.0)
    s.step([RunEnded("a", 2)], None, 5.0)  # not running attempt 2: changes nothing
    status = s.status("b")
    assert status["state"] == "succeeded" and status["ranks"] == [{"rank": 0, "node": "n0", "gpus": [1]}]
    assert s.finished_oldest_first() == ["b"]
    counts = s.counts()
    assert (counts.jobs, counts.ended, counts.queued, counts.recovering) == (3, 1, 2, 1)
    assert s.has_queued() and s.job_ids() == ["a", "b", "c"]
    assert [v.job_id for v in s.views()] == ["a", "b", "c"]


def test_node_totals_are_read_only():
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (TOTAL,))], 0.0)
    totals = s.node_totals()
    assert dict(totals) == {"n0": (TOTAL,)}
    with pytest.raises(TypeError):
        totals["n1"] = (1.0,)  # type: ignore[index]
