"""Team queues with GPU quotas in the core: admission by quota, order, and reclaiming borrowed GPUs."""

from __future__ import annotations

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    JobTicket, Launch, NodeJoined, QueuesConfigured, Reject, RunEnded, RunReclaimed, RunStarted, SignalCheckpoint, Stop,
    Submitted, event_from_record, to_record,
)
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState
from hier_sched.core.job import JobState
from hier_sched.core.presets import preset
from hier_sched.core.queues_spec import parse_queues
from hier_sched.core.quotas import Charge, QueueQuota, QueueSetup
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.spec import SpecError
from hier_sched.core.team_queue_part import OpenQueue, QuotaQueues

TOTAL = 40536.0
TEAMS = (QueueQuota("team-a", 2, 2), QueueQuota("team-b", 2))


def idle(nodes: int = 2, gpus: int = 2) -> ClusterIndex:
    """Snapshots that show nothing running: the scheduler counts its own runs there (``LaunchLedger``)."""
    return ClusterIndex.from_snapshots({f"n{n}": [GpuState(f"n{n}", i, TOTAL, 0.0) for i in range(gpus)]
                                        for n in range(nodes)})


def sched(queues=TEAMS, nodes: int = 2, gpus: int = 2) -> Scheduler:
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined(f"n{n}", (TOTAL,) * gpus) for n in range(nodes)], 0.0)
    if queues is not None:
        s.apply([QueuesConfigured(QueueSetup(tuple(queues)))], 0.0)
    return s


def big(job_id: str, queue: str | None, **kw) -> JobTicket:
    """A job that fills a GPU (two never share one), which checkpoints."""
    return JobTicket(job_id, job_id, need_mib=30000.0, signature=job_id, queue=queue, **{"checkpoints": True, **kw})


def launched(commands) -> list[str]:
    return [c.job_id for c in commands if isinstance(c, Launch)]


def requeue(job_id: str, attempt: int = 1) -> RunEnded:
    return RunEnded(job_id, attempt, Failure("checkpoint_requeue", "checkpointed"), 85)


def test_charges_add_and_subtract_in_each_currency_and_stay_charges():
    total = Charge(2, 1024.0) + Charge(1, 512.0)
    assert total == Charge(3, 1536.0) and type(total) is Charge and total.gpus == 3
    left = total - Charge(3, 36.0)
    assert left == Charge(0, 1500.0) and type(left) is Charge and left.mib == 1500.0


def test_the_queue_file_is_validated_with_each_bad_field_named():
    assert parse_queues({"queues": [{"name": "team-a", "nominal": {"gpus": 2}, "borrowing_limit": {"gpus": 2}},
                                    {"name": "team-b", "nominal": {"gpus": 2}}]}).queues == TEAMS
    with pytest.raises(SpecError) as bad:
        parse_queues({"queues": [{"name": "a", "nominal": {"gpus": -1}}, {"name": "b", "nominl": {"gpus": 1}}]})
    assert bad.value.problems == ["queues.0.nominal.gpus: input should be greater than or equal to 0 (got -1)",
                                  "queues.1.nominl: unknown field (did you mean nominal?)"]
    with pytest.raises(SpecError, match="queues: queue 'a' is defined twice"):
        parse_queues({"queues": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(SpecError, match="expected a mapping with a 'queues' list, got list"):
        parse_queues([{"name": "a"}])


def test_a_tickets_queue_fields_survive_its_log_record():
    ticket = big("a1", "team-a", user="alice")
    assert event_from_record(to_record(Submitted(ticket))) == Submitted(ticket)


def test_a_queue_borrows_idle_gpus_up_to_its_limit_and_then_waits_without_blocking_others():
    s = sched((QueueQuota("team-a", 1, 1),))
    out = s.step([Submitted(big(f"a{i}", "team-a")) for i in (1, 2, 3)] + [Submitted(big("d1", None))],
                 idle(), 1.0).commands
    # strict FIFO, yet a3 (waiting for quota) is not the head; among the borrowers the queue that
    # holds less goes first (default holds nothing, team-a a1's GPU)
    assert launched(out) == ["a1", "d1", "a2"]
    assert s.reason("a3") == "waiting: queue team-a over quota: 2/1 GPUs, borrowing limit reached"
    assert s.status("d1")["queue"] == "default"


def test_a_job_without_a_queue_is_in_its_users_queue_else_in_default():
    s = sched()
    s.step([Submitted(big("mine", None, user="team-b")), Submitted(big("other", None, user="carol"))], idle(), 1.0)
    assert s.status("mine")["queue"] == "team-b" and s.status("other")["queue"] == "default"


def test_an_unknown_queue_is_rejected_at_submission():
    s = sched()
    (reject,) = s.step([Submitted(big("x", "team-c"))], idle(), 1.0).commands
    assert isinstance(reject, Reject) and reject.reason == "queue: unknown queue 'team-c'; known: team-a, team-b"


def test_jobs_within_their_nominal_quota_go_before_borrowers():
    s = sched(nodes=1)  # 2 GPUs
    s.step([Submitted(big("a1", "team-a")), Submitted(big("a2", "team-a"))], idle(1), 1.0)
    # d1 (in ``default``: no quota, it would borrow) waits first; b1 is within team-b's quota: the
    # GPU that frees goes to b1.
    s.step([Submitted(big("d1", None)), Submitted(big("b1", "team-b"))], idle(1), 2.0)
    out = s.step([RunEnded("a1", 1)], idle(1), 3.0).commands
    assert launched(out) == ["b1"] and s.jobs["d1"].record.state is JobState.QUEUED


def test_borrowed_gpus_are_reclaimed_checkpoint_first_and_the_victims_resume():
    s = sched()
    out = s.step([Submitted(big(f"a{i}", "team-a")) for i in (1, 2, 3, 4)], idle(), 1.0).commands
    assert launched(out) == ["a1", "a2", "a3", "a4"]  # team-a borrows team-b's idle quota
    out = s.step([Submitted(big("b1", "team-b")), Submitted(big("b2", "team-b"))], idle(), 2.0).commands
    signals = [c for c in out if isinstance(c, SignalCheckpoint)]
    assert [c.job_id for c in signals] == ["a4", "a3"] and not launched(out)  # the newest runs, only what is borrowed
    assert "queue team-b reclaims what its fair share gives it" in signals[0].reason
    assert s.step([], idle(), 3.0).commands == []  # no second reclaim while the first drains
    assert s.reason("b1").endswith("; queue team-b holds 0/2 GPUs of its nominal quota: reclaiming from team-a: "
                                   "checkpoint signal sent to a4, a3")
    out = s.step([requeue("a4")], idle(), 4.0).commands
    assert launched(out) == ["b1"]  # not a4 (it would borrow again): team-b is within its quota
    out = s.step([requeue("a3")], idle(), 5.0).commands
    assert launched(out) == ["b2"]
    assert s.step([], None, 2.0 + 600.0).commands == []  # both exited in time: no stop at the grace's end
    for j in ("a3", "a4"):
        job = s.jobs[j]
        assert job.record.state is JobState.QUEUED and job.preemptions == job.record.checkpoints == 1
    assert "quota" not in s.reason("a3") + s.reason("a4")  # under their limit: they wait for room, not quota
    out = s.step([RunEnded("b1", 1), RunEnded("b2", 1)], idle(), 700.0).commands
    launch = {c.job_id: c for c in out if isinstance(c, Launch)}
    assert set(launch) == {"a3", "a4"} and all(c.resume and c.attempt == 2 for c in launch.values())


def test_a_reclaim_is_logged_and_a_rebuild_from_the_log_neither_signals_again_nor_takes_another_run():
    s = sched()
    log = [(e, 0.0) for e in (NodeJoined("n0", (TOTAL,) * 2), NodeJoined("n1", (TOTAL,) * 2),
                              QueuesConfigured(QueueSetup(TEAMS)))]
    arrivals = [Submitted(big(f"a{i}", "team-a")) for i in (1, 2, 3, 4)]
    out = s.step(arrivals, idle(), 1.0).commands
    log += [(e, 1.0) for e in arrivals]
    log += [(RunStarted(c.job_id, c.attempt, c.placements, 1.0), 1.0) for c in out if isinstance(c, Launch)]
    owed = [Submitted(big("b1", "team-b")), Submitted(big("b2", "team-b"))]
    reclaim = s.step(owed, idle(), 2.0)
    assert [(e.job_id, e.for_queue) for e in reclaim.decided] == [("a4", "team-b"), ("a3", "team-b")]
    assert all(isinstance(e, RunReclaimed) for e in reclaim.decided)
    rebuilt = sched(queues=None)
    rebuilt.rebuild(log + [(e, 2.0) for e in owed + reclaim.decided])
    rebuilt.heard_from(["n0", "n1"])
    assert rebuilt.step([], idle(), 3.0).commands == []  # the same two drain: nothing signalled again
    for j in ("a3", "a4"):
        job = rebuilt.jobs[j]
        assert job.record.state is JobState.CHECKPOINTING and job.reclaimed_for == "team-b" and job.preemptions == 1
    assert [c.job_id for c in rebuilt.step([requeue("a4")], idle(), 4.0).commands if isinstance(c, Launch)] == ["b1"]


def test_a_victim_that_does_not_exit_is_stopped_when_its_grace_ends():
    s = sched()
    s.step([Submitted(big(f"a{i}", "team-a", slot_grace_s=60.0)) for i in (1, 2, 3)], idle(), 1.0)
    out = s.step([Submitted(big("b1", "team-b")), Submitted(big("b2", "team-b"))], idle(), 2.0).commands
    assert launched(out) == ["b1"] and [c.job_id for c in out if isinstance(c, SignalCheckpoint)] == ["a3"]
    assert s.step([], None, 61.0).commands == []
    (stop,) = s.step([], None, 62.0).commands
    assert isinstance(stop, Stop) and stop.job_id == "a3"
    assert stop.reason == "checkpoint grace ended: its GPUs are reclaimed for queue team-b"


def test_runs_that_cannot_checkpoint_are_never_preempted_and_a_queue_keeps_its_fair_share():
    s = sched()
    s.step([Submitted(big("a1", "team-a")), Submitted(big("a2", "team-a")),
            Submitted(big("a3", "team-a", checkpoints=False)), Submitted(big("d1", None, checkpoints=False))],
           idle(), 1.0)
    out = s.step([Submitted(big("b1", "team-b")), Submitted(big("b2", "team-b"))], idle(), 2.0).commands
    # team-a holds 3 GPUs, 1 beyond its fair share (2): one run leaves, the newest that can checkpoint
    # (a3 cannot); d1 (default: fair share 0) cannot checkpoint either, so b2 waits for a run to end.
    assert [c.job_id for c in out if isinstance(c, SignalCheckpoint)] == ["a2"] and not launched(out)
    out = s.step([requeue("a2")], idle(), 3.0).commands
    assert launched(out) == ["b1"] and s.jobs["b2"].record.state is JobState.QUEUED
    assert s.step([], idle(), 4.0).commands == []  # team-a is at its fair share: nothing more is taken


def test_without_queues_nothing_changes_and_a_new_configuration_counts_the_runs_again():
    s = sched(queues=None)
    out = s.step([Submitted(big(f"a{i}", "team-a")) for i in (1, 2, 3, 4)], idle(), 1.0).commands
    assert launched(out) == ["a1", "a2", "a3", "a4"] and type(s.teams) is OpenQueue  # a queue name alone limits nothing
    s.step([QueuesConfigured(QueueSetup(TEAMS)), Submitted(big("b1", "team-b"))], idle(), 2.0)
    assert isinstance(s.teams, QuotaQueues) and s.teams.book.usage == {"team-a": Charge(4, 4 * 30000.0)}
    assert s.jobs["a4"].record.state is JobState.CHECKPOINTING
    s.step([QueuesConfigured(QueueSetup())], None, 3.0)
    assert type(s.teams) is OpenQueue


def test_a_run_reclaimed_twice_before_it_checkpointed_is_not_reclaimed_again():
    s = sched()
    s.step([Submitted(big(f"a{i}", "team-a", slot_grace_s=60.0)) for i in (1, 2, 3)], idle(), 1.0)
    now, attempt = 2.0, 1
    for round_ in (1, 2):
        b = [f"b{round_}x", f"b{round_}y"]
        out = s.step([Submitted(big(j, "team-b")) for j in b], idle(), now).commands
        assert [c.job_id for c in out if isinstance(c, SignalCheckpoint)] == ["a3"]
        s.step([], None, now + 60.0)  # its grace ends: stopped
        s.step([RunEnded("a3", attempt, Failure("killed", "SIGTERM"), -15)], idle(), now + 61.0)
        out = s.step([RunEnded(j, 1) for j in b], idle(), now + 100.0).commands
        assert launched(out) == ["a3"]
        now, attempt = now + 200.0, attempt + 1
    assert s.jobs["a3"].runs_to_end and "not preempted" in s.jobs["a3"].record.reason
    out = s.step([Submitted(big("b3", "team-b")), Submitted(big("b4", "team-b"))], idle(), now).commands
    assert launched(out) == ["b3"]
    assert [c.job_id for c in out if isinstance(c, SignalCheckpoint)] == ["a2"]  # the newest run that may be
