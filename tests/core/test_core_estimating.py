"""A job accepted while its estimate is made elsewhere: the ``estimating`` state and its events."""

from __future__ import annotations

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    CancelRequested, EstimateArrived, EstimateFailed, JobTicket, Launch, NodeJoined, Reject, Submitted,
    event_from_record, to_record,
)
from hier_sched.core.gpu import GpuState
from hier_sched.core.job import IllegalTransition, JobRecord, JobState
from hier_sched.core.learning import PeakLearner
from hier_sched.core.presets import preset
from hier_sched.core.scheduler import Scheduler

TOTAL = 40536.0


def sched() -> Scheduler:
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (TOTAL, TOTAL))], 0.0)
    return s


def idle() -> ClusterIndex:
    return ClusterIndex.from_snapshots({"n0": [GpuState("n0", i, TOTAL, 0.0) for i in range(2)]})


def estimating(job_id: str = "a", **kw) -> JobTicket:
    return JobTicket(job_id, job_id, need_mib=None, estimate_source="estimating: auto on m:build", signature=job_id,
                     estimating=True, learn_peak=True, **kw)


def test_an_estimating_job_is_accepted_but_not_queued_nor_placed():
    s = sched()
    result = s.step([Submitted(estimating())], idle(), 1.0)
    assert result.commands == []
    assert s.state_of("a") is JobState.ESTIMATING and not s.has_queued()
    status = s.status("a")
    assert status["state"] == "estimating" and status["reason"] == "estimating: auto on m:build"
    assert "a" in s.unfinished()


def test_its_estimate_arriving_queues_it_with_the_figures_per_gpu_type_and_it_runs():
    s = sched()
    s.apply([Submitted(estimating())], 1.0)
    needs = (("A100-40GB", 3000.0), ("H100-80GB", 3100.0))
    (launch,) = s.step([EstimateArrived("a", 3100.0, "auto:trace (Ray task)", needs)], idle(), 2.0).commands
    assert isinstance(launch, Launch)
    status = s.status("a")
    assert status["estimate_mib"] == 3100.0 and status["estimate_source"] == "auto:trace (Ray task)"
    assert status["estimates"] == {"A100-40GB": 3000.0, "H100-80GB": 3100.0}
    assert s.view("a").history[0][1:3] == ("estimating", "queued")
    assert s.jobs["a"].ticket.need_on("H100-80GB") == 3100.0 and not s.jobs["a"].ticket.estimating


def test_an_estimate_no_node_can_hold_rejects_the_job_at_arrival():
    s = sched()
    s.apply([Submitted(estimating())], 1.0)
    commands = s.apply([EstimateArrived("a", 90_000.0, "auto:trace")], 2.0)
    assert [type(c) for c in commands] == [Reject]
    assert s.state_of("a") is JobState.FAILED and s.status("a")["reason"].startswith("rejected:")


def test_a_failed_estimate_ends_the_job_failed_naming_the_reason():
    s = sched()
    s.apply([Submitted(estimating())], 1.0)
    s.apply([EstimateFailed("a", "model.factory m:build: ModuleNotFoundError: No module named 'm'")], 2.0)
    assert s.state_of("a") is JobState.FAILED
    assert s.status("a")["reason"] == "rejected: model.factory m:build: ModuleNotFoundError: No module named 'm'"


def test_cancel_while_estimating_ends_it_and_a_late_estimate_changes_nothing():
    s = sched()
    s.apply([Submitted(estimating())], 1.0)
    s.apply([CancelRequested("a")], 2.0)
    assert s.state_of("a") is JobState.CANCELLED
    assert s.apply([EstimateArrived("a", 3000.0, "auto:trace"), EstimateFailed("a", "late")], 3.0) == []
    assert s.state_of("a") is JobState.CANCELLED and not s.has_queued()


def test_replaying_the_events_rebuilds_the_same_job_and_repeats_change_nothing():
    events = [Submitted(estimating()), EstimateArrived("a", 3000.0, "auto:trace", (("A100-40GB", 3000.0),))]
    logged = [(event_from_record(to_record(e)), float(i)) for i, e in enumerate(events)]
    assert [e for e, _ in logged] == events  # the journal's round trip
    s = sched()
    s.rebuild(logged + logged)  # a repeated record (a log replayed twice) is ignored
    assert s.state_of("a") is JobState.QUEUED and s.status("a")["estimates"] == {"A100-40GB": 3000.0}
    assert s.counts().queued == 1


def test_a_learned_peak_of_the_same_job_replaces_the_estimate_when_it_arrives():
    peaks = PeakLearner()
    peaks.observe("a", "A100-40GB", 5000.0)
    s = Scheduler(preset("magm"), peaks=peaks)
    s.apply([NodeJoined("n0", (TOTAL,), ("A100-40GB",)), Submitted(estimating())], 0.0)
    s.apply([EstimateArrived("a", 3000.0, "auto:trace")], 1.0)
    assert s.status("a")["estimate_mib"] == pytest.approx(peaks.need("a", "A100-40GB"))
    assert "measured peak" in s.status("a")["estimate_source"]


def test_estimating_moves_only_to_queued_failed_or_cancelled():
    rec = JobRecord("a", "a", 0.0, state=JobState.ESTIMATING)
    with pytest.raises(IllegalTransition):
        rec.transition(JobState.RUNNING, 1.0)
    rec.transition(JobState.QUEUED, 1.0)
    assert not rec.done
