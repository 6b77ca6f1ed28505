"""Drained nodes in the core (``core.drains``): closed to new work, their runs moved off, a deadline
that stops what is left, and the same decisions again from the log."""

from __future__ import annotations

import math

from hier_sched.core.events import (
    NodeDraining, NodeLost, NodeUndrained, RunEnded, RunEvicted, RunStarted, SignalCheckpoint, Stop, Submitted, event_from_record, to_record,
)
from hier_sched.core.failures import REQUEUE_EXIT_CODE, Failure
from hier_sched.core.job import JobState
from hier_sched.core.scheduler import Scheduler
from tests.core.test_core_lifecycle import TOTAL, cluster, launches, sched, ticket


def started_on(s: Scheduler, job_id: str) -> tuple[str, ...]:
    return s.jobs[job_id].nodes


def test_a_drained_node_takes_no_new_job_until_it_is_undrained():
    s = sched(nodes={"n0": 2, "n1": 2})
    s.step([NodeDraining("n0")], None, 1.0)
    free = {"n0": [0, 0], "n1": [30000, 30000]}  # n0 has the most room, and is drained
    s.step([Submitted(ticket("a")), Submitted(ticket("b", need_mib=20000))], cluster(free), 2.0)
    assert started_on(s, "a") == ("n1",)
    assert s.jobs["b"].record.state is JobState.QUEUED  # it fits only on n0
    s.step([NodeUndrained("n0")], None, 3.0)
    assert launches(s.step([], cluster(free), 4.0).commands)[0].placements[0].node == "n0"


def test_a_job_that_checkpoints_is_signalled_requeued_and_resumes_elsewhere():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("saver", checkpoints=True)), Submitted(ticket("plain"))], cluster({"n0": [0], "n1": [0]}), 1.0)
    saver_node = started_on(s, "saver")[0]
    plain_node = started_on(s, "plain")[0]
    out = s.step([NodeDraining(saver_node, "maintenance")], None, 2.0).commands
    assert [(type(c), c.job_id, c.nodes) for c in out] == [(SignalCheckpoint, "saver", (saver_node,))]
    assert "node " + saver_node + " drains (maintenance)" in s.jobs["saver"].record.reason
    s.step([RunEnded("saver", 1, Failure("checkpoint_requeue", "saved"), REQUEUE_EXIT_CODE)], None, 5.0)
    both_busy = {saver_node: [0], plain_node: [35000]}
    assert not launches(s.step([], cluster(both_busy), 6.0).commands)  # only the drained node has room
    s.step([RunEnded("plain", 1)], None, 7.0)
    (launch,) = launches(s.step([], cluster({saver_node: [0], plain_node: [0]}), 8.0).commands)
    assert launch.placements[0].node == plain_node and launch.resume and s.jobs["saver"].record.checkpoints == 1


def test_a_job_that_cannot_checkpoint_finishes_on_a_drained_node_without_a_deadline():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("plain"))], cluster({"n0": [0]}), 1.0)
    result = s.step([NodeDraining("n0")], None, 2.0)
    assert result.commands == [] and result.wake_at_s is None
    assert s.drained_nodes()[0] | {"since": None} == {"node": "n0", "state": "draining", "reason": "asked by an operator",
                                                       "since": None, "deadline": None, "jobs": ["plain"]}
    s.step([RunEnded("plain", 1)], None, 9.0)
    assert s.jobs["plain"].record.state is JobState.SUCCEEDED and s.drained_nodes()[0]["state"] == "drained"


def test_at_the_deadline_what_still_runs_is_stopped_and_requeued_a_gang_with_every_rank():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("gang", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0]}), 1.0)
    result = s.step([NodeDraining("n1", "spot notice", deadline_s=30.0)], None, 2.0)
    assert result.commands == [] and result.wake_at_s == 30.0  # a gang without checkpoints: nothing to signal
    assert s.step([], None, 29.0).decided == []
    result = s.step([], None, 30.5)
    assert [(type(c), c.job_id, c.nodes) for c in result.commands] == [(Stop, "gang", ("n0", "n1"))]
    assert result.decided == [RunEvicted("gang", 1, "node n1 drained: its deadline came (spot notice)")]
    job = s.jobs["gang"]
    # not requeued while its ranks may still live: a second run would start beside them
    assert job.record.state is JobState.RUNNING and job.evicted_for is not None
    assert s.step([], None, 40.0).decided == []  # stopped once
    s.step([RunEnded("gang", 1, Failure("killed", "stopped"), 143, node="n0")], None, 31.0)
    assert job.record.state is JobState.RUNNING  # rank 1 has not exited yet
    assert not launches(s.step([], cluster({"n0": [0], "n1": [0]}), 31.5).commands)
    s.step([RunEnded("gang", 1, Failure("killed", "stopped"), 143, node="n1")], None, 32.0)
    assert job.record.state is JobState.QUEUED and job.lost_runs == 1 and "deadline came" in job.record.reason
    assert job.other_failures == 0


def test_a_run_stopped_at_the_deadline_is_requeued_only_once_it_has_exited_or_its_node_is_lost():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("a"))], cluster({"n0": [0], "n1": [38000]}), 1.0)
    s.step([Submitted(ticket("c"))], cluster({"n0": [38000], "n1": [0]}), 1.5)
    assert (s.jobs["a"].nodes, s.jobs["c"].nodes) == (("n0",), ("n1",))
    s.step([NodeDraining("n0", deadline_s=10.0), NodeDraining("n1", deadline_s=10.0)], None, 2.0)
    (stop_a, stop_c) = s.step([], None, 10.0).commands
    assert (stop_a.job_id, stop_c.job_id) == ("a", "c")
    s.step([NodeUndrained("n0"), NodeUndrained("n1")], None, 10.5)
    # the node still shows the run on its GPU: nothing is placed anew while it exits
    assert not launches(s.step([], cluster({"n0": [0], "n1": [0]}), 11.0).commands)
    s.step([RunEnded("a", 1, Failure("killed", "SIGTERM"), -15)], None, 12.0)
    (launch,) = launches(s.step([], cluster({"n0": [0], "n1": [35000]}), 13.0).commands)
    assert (launch.job_id, launch.attempt) == ("a", 2) and s.jobs["a"].lost_runs == 1
    s.step([NodeLost("n1", "its Ray node died")], None, 14.0)  # c's run is gone with its machine
    assert s.jobs["c"].record.state is JobState.QUEUED and s.jobs["c"].lost_runs == 1


def test_a_signalled_run_that_does_not_exit_is_stopped_when_its_grace_ends():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("slow", checkpoints=True, slot_grace_s=60.0))], cluster({"n0": [0]}), 1.0)
    s.step([NodeDraining("n0")], None, 2.0)
    (stop,) = s.step([], None, 62.5).commands
    assert isinstance(stop, Stop) and stop.reason == "checkpoint grace ended: node n0 drains"


def test_undrained_before_its_deadline_stops_nothing_and_a_second_drain_keeps_the_earlier_deadline():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("plain"))], cluster({"n0": [0]}), 1.0)
    s.step([NodeDraining("n0", deadline_s=50.0), NodeDraining("n0", deadline_s=500.0)], None, 2.0)
    assert s.drained_nodes()[0]["deadline"] == 50.0
    s.step([NodeUndrained("n0")], None, 3.0)
    assert s.step([], None, 60.0).commands == [] and s.jobs["plain"].record.state is JobState.RUNNING


def test_a_rebuild_from_the_log_evicts_the_same_run_and_keeps_the_drain():
    live = sched(nodes={"n0": 1, "n1": 1})
    logged = [(Submitted(ticket("plain")), 1.0)]
    (launch,) = live.step([logged[0][0]], cluster({"n0": [0], "n1": [35000]}), 1.0).commands
    logged.append((RunStarted("plain", 1, launch.placements), 1.0))  # the node's answer to the launch
    logged.append((NodeDraining("n0", deadline_s=10.0), 2.0))
    live.step([logged[-1][0]], None, 2.0)
    logged += [(e, 11.0) for e in live.step([], None, 11.0).decided]  # what the live queue writes after the step
    rebuilt = sched(nodes={"n0": 1, "n1": 1})
    rebuilt.rebuild((event_from_record(to_record(e)), t) for e, t in logged)
    assert rebuilt.jobs["plain"].evicted_for == live.jobs["plain"].evicted_for is not None
    assert rebuilt.step([], None, 11.5).decided == []  # stopped already: not evicted twice
    for s in (live, rebuilt):
        s.step([RunEnded("plain", 1, Failure("killed", "SIGTERM"), -15)], None, 12.0)
        job = s.jobs["plain"]
        assert job.record.state is JobState.QUEUED and job.lost_runs == 1 and job.record.attempts == 1
        assert [d["node"] for d in s.drained_nodes()] == ["n0"]


def test_a_closed_nodes_row_shows_no_room_and_keeps_what_its_node_reports_for_the_day_it_opens():
    index = cluster({"n0": [0, 0], "n1": [30000, 30000]})
    index.close(["n0"])
    assert index.free[0].max() == -math.inf and index.idle[0] == 0
    index.update_gpu("n0", 1, 1000.0, idle_delta=-1)  # a report while closed
    assert index.free[0].max() == -math.inf
    index.close([])
    assert index.free[0].tolist() == [TOTAL, 1000.0] and index.idle[0] == 1


def test_drain_events_survive_their_records():
    events = [NodeDraining("n0", "spot notice", 12.5), NodeDraining("n1"), NodeUndrained("n0"),
              RunEvicted("a", 3, "node n0 drained")]
    assert [event_from_record(to_record(e)) for e in events] == events
