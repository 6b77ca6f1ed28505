"""The job lifecycle in the core: events in, commands out, on hand-built cluster snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    CancelRequested, CheckpointRequested, HeadWaiting, JobTicket, Launch, LaunchDeclined, NodeJoined, NodeLost, Reject,
    RunEnded, QueuesConfigured, RunReclaimed, RunSettled, RunStarted, SignalCheckpoint, SlotEnded, Stop, Submitted,
    event_from_record, to_record,
)
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState, Placement
from hier_sched.core.job import JobState
from hier_sched.core.learning import MEASURED_MARGIN
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueQuota, QueueSetup
from hier_sched.core.scheduler import Scheduler

TOTAL = 40536.0


def cluster(used: dict[str, list[float]], now: float = 0.0) -> ClusterIndex:
    """Nodes with GPUs whose used memory is given (a GPU in use hosts some other job); nothing
    launched recently."""
    return ClusterIndex.from_snapshots({n: [GpuState(n, i, TOTAL, u, resident_jobs=("other",) if u else ())
                                            for i, u in enumerate(gpus)] for n, gpus in used.items()})


def sched(policy: str = "magm", nodes: dict[str, int] | None = None) -> Scheduler:
    s = Scheduler(preset(policy))
    s.apply([NodeJoined(n, (TOTAL,) * g) for n, g in (nodes or {"n0": 2}).items()], 0.0)
    return s


def ticket(job_id: str, **kw) -> JobTicket:
    return JobTicket(job_id, job_id, **{"need_mib": 4000.0, "signature": job_id, **kw})


def launches(commands) -> list[Launch]:
    return [c for c in commands if isinstance(c, Launch)]


@pytest.mark.parametrize("policy, limit", [("auto", 4000 + 2048), ("magm", None)])
def test_a_submitted_job_is_launched_with_a_new_attempt_and_its_mps_limit(policy, limit):
    s = sched(policy)
    (launch,) = s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0).commands
    assert isinstance(launch, Launch) and launch.attempt == 1 and launch.placements[0].node == "n0"
    assert launch.memory_limit_mib == limit  # auto: neighbours may join it later; the thesis ran without
    rec = s.jobs["a"].record
    assert rec.state is JobState.RUNNING and rec.attempts == 1 and rec.estimate_mib == 4000.0


def test_the_last_recovery_step_gets_an_idle_gpu_and_no_limit():
    s = sched("auto")
    s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0)
    for attempt in (1, 2, 3):
        s.step([RunEnded("a", attempt, Failure("oom", "oom"), 1, 9000.0)], None, 1.0 + attempt)
        (launch,) = launches(s.step([], cluster({"n0": [0, 0]}), 1.5 + attempt).commands)
    assert launch.request.exclusive and launch.memory_limit_mib is None


def test_admission_rejects_what_no_node_can_hold_and_names_the_field():
    s = sched(nodes={"n0": 2})
    out = s.step([Submitted(ticket("wide", gpus=4)), Submitted(ticket("huge", need_mib=50000)),
                  Submitted(ticket("gang", gpus=4, gpus_per_node=2))], cluster({"n0": [0, 0]}), 1.0).commands
    rejects = {c.job_id: c.reason for c in out if isinstance(c, Reject)}
    assert "gpus: 4 GPUs on one node" in rejects["wide"]
    assert "largest GPU has 40536" in rejects["huge"]
    assert "gang shape: needs 2 nodes, the cluster has 1" in rejects["gang"]
    assert all(s.jobs[j].record.state is JobState.FAILED for j in rejects) and not s.job_queue


def test_oom_requeues_with_a_larger_margin_and_fails_after_its_attempts():
    s = sched()
    s.step([Submitted(ticket("liar", max_attempts=2))], cluster({"n0": [0, 0]}), 1.0)
    oom = Failure("oom", "CUDA out of memory")
    s.step([RunEnded("liar", 1, oom, 1, 9000.0)], None, 2.0)
    job = s.jobs["liar"]
    assert job.record.state is JobState.QUEUED and job.queued.oom_count == 1 and job.queued.observed_peak_mib == 9000
    (launch,) = launches(s.step([], cluster({"n0": [30000, 0]}), 3.0).commands)
    assert launch.attempt == 2 and launch.request.min_free_mib == pytest.approx(9000 + 5120)
    s.step([RunEnded("liar", 2, oom, 1, 9500.0)], None, 4.0)
    assert job.record.state is JobState.FAILED and "all 2 attempts" in job.record.reason


@pytest.mark.parametrize("code, retries, codes, state", [
    (3, 0, None, JobState.FAILED), (3, 1, None, JobState.QUEUED), (3, 1, (4,), JobState.FAILED)])
def test_other_failures_follow_the_tickets_retry_rule(code, retries, codes, state):
    s = sched()
    s.step([Submitted(ticket("crash", max_retries=retries, retry_exit_codes=codes))], cluster({"n0": [0, 0]}), 1.0)
    s.step([RunEnded("crash", 1, Failure("error", f"exit code {code}", code), code)], None, 2.0)
    assert s.jobs["crash"].record.state is state and s.jobs["crash"].record.exit_code == code


def test_a_command_that_cannot_start_is_not_retried():
    s = sched()
    s.step([Submitted(ticket("missing", max_retries=3))], cluster({"n0": [0, 0]}), 1.0)
    s.step([RunEnded("missing", 1, Failure("start_error", "cannot start command 'x'", 127), 127)], None, 2.0)
    assert s.jobs["missing"].record.state is JobState.FAILED


def test_events_about_an_earlier_attempt_or_repeated_change_nothing():
    s = sched()
    s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0)
    s.step([RunEnded("a", 1, Failure("oom", "oom"), 1, 5000.0)], None, 2.0)
    s.step([], cluster({"n0": [0, 0]}), 3.0)  # attempt 2 runs
    before = (s.jobs["a"].record.state, s.jobs["a"].record.attempts, s.jobs["a"].record.oom_crashes)
    s.step([RunEnded("a", 1, Failure("oom", "oom"), 1, 5000.0), Submitted(ticket("a")),
            RunStarted("a", 2, s.jobs["a"].placements)], None, 4.0)
    assert (s.jobs["a"].record.state, s.jobs["a"].record.attempts, s.jobs["a"].record.oom_crashes) == before


def test_a_declined_launch_is_taken_back_and_waits_again():
    s = sched()
    (launch,) = s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0).commands
    s.step([LaunchDeclined("a", launch.attempt, "gpu0: 100 MiB free < 6048 needed")], None, 1.5)
    rec = s.jobs["a"].record
    assert rec.state is JobState.QUEUED and rec.attempts == 0 and "declined" in rec.reason
    (again,) = launches(s.step([], cluster({"n0": [0, 0]}), 2.0).commands)
    assert again.attempt == 1


def test_a_run_a_node_reports_after_a_restart_is_re_adopted():
    s = sched()
    s.step([Submitted(ticket("a"))], None, 1.0)  # the log knew the submission only
    (launch,) = launches(Scheduler(preset("magm")).step([Submitted(ticket("a")), NodeJoined("n0", (TOTAL,))],
                                                        cluster({"n0": [0]}), 1.0).commands)
    s.step([RunStarted("a", 1, launch.placements)], None, 2.0)
    rec = s.jobs["a"].record
    assert rec.state is JobState.RUNNING and rec.attempts == 1 and rec.reason.startswith("running on n0")
    assert not launches(s.step([], cluster({"n0": [0, 0]}), 3.0).commands)  # never launched twice


def test_cancel_while_queued_ends_it_and_while_running_stops_it():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("run")), Submitted(ticket("wait", need_mib=39000))], cluster({"n0": [0]}), 1.0)
    out = s.step([CancelRequested("wait"), CancelRequested("run")], None, 2.0).commands
    assert s.jobs["wait"].record.state is JobState.CANCELLED
    assert [type(c) for c in out] == [Stop] and out[0].job_id == "run"
    s.step([RunEnded("run", 1, Failure("killed", "SIGTERM"), -15)], None, 3.0)
    assert s.jobs["run"].record.state is JobState.CANCELLED


def test_a_slot_signals_a_checkpoint_when_others_wait_and_the_job_goes_to_the_back():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0))], cluster({"n0": [0]}), 0.0)
    s.step([Submitted(ticket("next", need_mib=39000))], cluster({"n0": [36000]}), 10.0)
    result = s.step([], None, 900.0)
    assert [type(c) for c in result.commands] == [SignalCheckpoint]
    assert s.jobs["long"].record.state is JobState.CHECKPOINTING and result.wake_at_s == 1000.0
    s.step([RunEnded("long", 1, Failure("checkpoint_requeue", "checkpointed"), 85)], None, 950.0)
    long = s.jobs["long"]
    assert long.record.state is JobState.QUEUED and long.record.checkpoints == 1 and long.queued.submit_s == 950.0
    (launch,) = launches(s.step([], cluster({"n0": [0]}), 951.0).commands)
    assert launch.job_id == "next"  # the job that waited goes first


def test_a_slot_is_extended_when_nobody_waits_and_a_job_that_does_not_save_is_stopped():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0, slot_extends=True))], cluster({"n0": [0]}), 0.0)
    assert not s.step([], None, 900.0).commands and "slot extended" in s.jobs["long"].record.reason
    s.step([Submitted(ticket("next", need_mib=39000))], cluster({"n0": [36000]}), 1000.0)
    assert [type(c) for c in s.step([], None, 1900.0).commands] == [SignalCheckpoint]
    (stop,) = s.step([], None, 2000.0).commands
    assert isinstance(stop, Stop) and stop.reason == "time slot ended"
    s.step([RunEnded("long", 1, Failure("killed", "SIGTERM"), -15)], None, 2001.0)
    long = s.jobs["long"]
    assert long.record.state is JobState.QUEUED and long.lost_runs == 1 and long.other_failures == 0


def test_a_lost_node_requeues_its_jobs_and_stops_a_gangs_other_ranks():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("gang", gpus=2, gpus_per_node=1)), Submitted(ticket("solo"))],
           cluster({"n0": [0], "n1": [0]}), 1.0)
    assert s.jobs["gang"].nodes == ("n0", "n1")
    out = s.step([NodeLost("n1")], None, 50.0).commands
    assert [(type(c), c.job_id, c.nodes) for c in out] == [(Stop, "gang", ("n0",))]
    assert s.jobs["gang"].record.state is JobState.RUNNING  # its rank on n0 has not exited yet
    s.step([RunEnded("gang", 1, Failure("killed", "SIGTERM"), -15, node="n0")], None, 51.0)
    assert s.jobs["gang"].record.state is JobState.QUEUED and s.jobs["gang"].lost_runs == 1
    assert s.jobs["gang"].other_failures == 0 and "node lost" in s.jobs["gang"].record.reason
    assert s.jobs["solo"].record.state is JobState.QUEUED or s.jobs["solo"].nodes == ("n0",)
    # a rank that ended well before its node was lost: the gang runs on
    s.step([NodeJoined("n1", (TOTAL,))], None, 52.0)
    (again,) = launches(s.step([], cluster({"n0": [0], "n1": [0]}), 53.0).commands)
    s.step([RunEnded("gang", again.attempt, None, 0, node="n1")], None, 54.0)
    assert s.step([NodeLost("n1")], None, 55.0).commands == [] and s.jobs["gang"].record.state is JobState.RUNNING


def test_a_run_its_node_reports_lost_with_the_machine_is_requeued_not_failed():
    """A node that came back (or its replacement) reports a run that died with the machine as
    lost: nothing the job did, so it runs again like the runs of a node the queue found lost."""
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("a"))], cluster({"n0": [0]}), 1.0)
    s.step([RunEnded("a", 1, Failure("lost", "its node died under it"), None)], None, 50.0)
    a = s.jobs["a"]
    assert a.record.state is JobState.QUEUED and a.lost_runs == 1 and a.other_failures == 0
    (launch,) = launches(s.step([], cluster({"n0": [0]}), 51.0).commands)
    assert (launch.job_id, launch.attempt) == ("a", 2)


def test_a_hard_slot_preempts_even_when_nobody_waits_and_the_job_resumes():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0))], cluster({"n0": [0]}), 0.0)
    assert [type(c) for c in s.step([], None, 900.0).commands] == [SignalCheckpoint]
    s.step([RunEnded("long", 1, Failure("checkpoint_requeue", "checkpointed"), 85)], None, 950.0)
    (launch,) = launches(s.step([], cluster({"n0": [0]}), 951.0).commands)
    assert launch.attempt == 2 and s.jobs["long"].record.checkpoints == 1


def test_a_gang_ends_when_its_last_rank_ends_and_a_failed_rank_stops_the_others():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("ok", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0]}), 1.0)
    assert not s.step([RunEnded("ok", 1, None, 0, 5000.0, node="n1")], None, 10.0).commands
    assert s.jobs["ok"].record.state is JobState.RUNNING  # rank 0 still runs
    s.step([RunEnded("ok", 1, None, 0, 6000.0, node="n0")], None, 11.0)
    assert s.jobs["ok"].record.state is JobState.SUCCEEDED and s.jobs["ok"].record.observed_peak_mib == 6000.0

    s.step([Submitted(ticket("oom", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0]}), 20.0)
    (stop,) = s.step([RunEnded("oom", 1, Failure("oom", "CUDA out of memory"), 1, 9000.0, node="n0")], None, 30.0).commands
    assert isinstance(stop, Stop) and "gang rank on n0 failed" in stop.reason and stop.nodes == ("n1",)
    job = s.jobs["oom"]
    assert job.record.state is JobState.RUNNING  # its rank on n1 still holds its GPU until it has exited
    assert not launches(s.step([], cluster({"n0": [0], "n1": [0]}), 30.5).commands)
    s.step([RunEnded("oom", 1, Failure("killed", "SIGTERM"), -15, node="n1")], None, 31.0)  # the stopped rank
    assert job.record.state is JobState.QUEUED and job.record.oom_crashes == 1  # recovered as one job, by its first failure
    assert job.other_failures == 0


def test_a_gang_is_requeued_once_every_rank_checkpointed():
    s = sched(nodes={"n0": 1, "n1": 1})
    s.step([Submitted(ticket("g", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0]}), 1.0)
    s.step([CheckpointRequested("g")], None, 5.0)
    s.step([RunEnded("g", 1, Failure("checkpoint_requeue", "saved"), 85, node="n0")], None, 6.0)
    assert s.jobs["g"].record.state is JobState.CHECKPOINTING
    s.step([RunEnded("g", 1, Failure("checkpoint_requeue", "saved"), 85, node="n1")], None, 7.0)
    assert s.jobs["g"].record.state is JobState.QUEUED and s.jobs["g"].record.checkpoints == 1


def test_a_user_checkpoint_request_signals_the_run():
    s = sched()
    s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0)
    (sig,) = s.step([CheckpointRequested("a")], None, 2.0).commands
    assert isinstance(sig, SignalCheckpoint) and s.jobs["a"].record.state is JobState.CHECKPOINTING


def test_a_learning_job_is_believed_to_need_the_measured_peak_of_its_earlier_run():
    s = sched()
    s.step([Submitted(ticket("first", learn_peak=True, signature="w"))], cluster({"n0": [0, 0]}), 1.0)
    s.step([RunEnded("first", 1, None, 0, 6000.0)], None, 2.0)
    s.step([Submitted(ticket("second", learn_peak=True, signature="w")),
            Submitted(ticket("other", learn_peak=False, signature="w"))], None, 3.0)
    assert s.jobs["second"].record.estimate_mib == pytest.approx(6000 * (1 + MEASURED_MARGIN))
    assert "measured peak" in s.jobs["second"].record.estimate_source
    assert s.jobs["other"].record.estimate_mib == 4000.0


def test_a_waiting_job_says_why_in_gib_and_names_the_best_gpu():
    s = sched(nodes={"n0": 2})
    s.step([Submitted(ticket("big", need_mib=30000))], cluster({"n0": [20000, 30000]}), 1.0)
    reason = s.reason("big", cluster({"n0": [20000, 30000]}))
    assert reason.startswith("waiting: no GPU with 31.3 GiB usable (best: n0 gpu0, 19.6 GiB; usable = free minus the 0.5 GiB kept free "
                              "on every GPU)"), reason
    assert "MiB" not in reason, reason  # one unit per sentence
    assert "no node has" not in reason, reason  # the plan's words would say the same again


def test_every_event_survives_its_record_unchanged():
    launch = launches(sched().step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0).commands)[0]
    events = [Submitted(ticket("a", retry_exit_codes=(3, 4), slot_s=60.0)), RunStarted("a", 1, launch.placements),
              RunStarted("a", 1, launch.placements, 0.5), HeadWaiting("a", 2.0, (("n0", (0, 1)), ("n1", (1,)))),
              SlotEnded("a", 1, 3.0), RunReclaimed("a", 1, "team-b", "queue team-b reclaims"),
              RunEnded("a", 1, Failure("oom", "x", 1), 1, 123.0), RunEnded("a", 2), LaunchDeclined("a", 1, "r"),
              CancelRequested("a"), CheckpointRequested("a"), NodeJoined("n0", (TOTAL, TOTAL)), NodeLost("n0"),
              QueuesConfigured(QueueSetup((QueueQuota("team-a", 2, 2), QueueQuota("team-b", 1))))]
    assert [event_from_record(to_record(e)) for e in events] == events
    # the record is what ``dataclasses.asdict`` makes of the event, without its copies
    assert [to_record(e) for e in events] == [{"type": type(e).__name__, **dataclasses.asdict(e)} for e in events]


def test_a_blocked_heads_wait_and_hold_are_logged_and_a_rebuild_from_the_log_keeps_them():
    """Planning decides when a blocked head's wait began and which GPUs are held for it past the
    limit: both go out as ``HeadWaiting`` (``StepResult.noted``), and a scheduler rebuilt from
    the log holds the same GPUs from the same time instead of starting the head's wait again."""
    cfg = preset("magm")
    cfg = dataclasses.replace(cfg, queue=dataclasses.replace(cfg.queue, strict_fifo=False, head_wait_limit_s=100.0))
    joined, wide = NodeJoined("n0", (TOTAL, TOTAL)), Submitted(ticket("wide", need_mib=20000.0, gpus=2))
    s = Scheduler(cfg)
    s.apply([joined], 0.0)
    busy = cluster({"n0": [30000, 30000]})
    first = s.step([wide], busy, 1.0)
    assert first.noted == [HeadWaiting("wide", 1.0)] and not first.decided
    assert s.step([], busy, 50.0).noted == []  # still waiting, nothing held: nothing new to log
    (held,) = s.step([], busy, 200.0).noted  # past the limit
    assert held.job_id == "wide" and held.since_s == 1.0 and held.held == (("n0", (0, 1)),)
    assert s.step([], busy, 250.0).noted == []  # the same GPUs kept
    rebuilt = Scheduler(cfg)
    rebuilt.rebuild([(joined, 0.0), (wide, 1.0), (first.noted[0], 1.0), (held, 200.0)])
    q = rebuilt.job_queue["wide"]
    assert (q.waiting_since_s, q.held) == (1.0, (("n0", (0, 1)),))


def test_a_rebuilt_run_counts_from_when_it_was_decided_not_when_its_start_was_logged():
    """A live queue logs ``RunStarted`` once the nodes replied; its ``started_s`` is the decision,
    so the rebuilt run's slot ends when the running queue's would have."""
    s = sched()
    s.apply([Submitted(ticket("a", slot_s=3600.0, slot_grace_s=300.0))], 1.0)
    s.apply([RunStarted("a", 1, (Placement("a", "n0", (0,), 4000.0),), 1.0)], 6.0)  # decided at 1, logged at 6
    assert s.jobs["a"].run_started_s == 1.0
    assert not s.step([], None, 3300.5).commands
    assert [type(c) for c in s.step([], None, 3303.0).commands] == [SignalCheckpoint]  # 1 + 3600 - 300


def test_a_slots_end_is_logged_and_a_rebuild_from_the_log_neither_signals_again_nor_counts_it_twice():
    s = sched()
    submitted = Submitted(ticket("a", slot_s=3600.0, slot_grace_s=300.0))
    (launch,) = launches(s.step([submitted], cluster({"n0": [0, 0]}), 1.0).commands)
    signalled = s.step([], None, 3302.0)  # the signal was due at 3301
    assert [type(c) for c in signalled.commands] == [SignalCheckpoint]
    assert signalled.decided == [SlotEnded("a", 1, 3301.0)]
    rebuilt = sched()
    rebuilt.rebuild([(submitted, 1.0), (RunStarted("a", 1, launch.placements, 1.0), 2.0),
                     (signalled.decided[0], 3302.0)])
    rebuilt.heard_from(["n0"])
    job = rebuilt.jobs["a"]
    assert job.record.state is JobState.CHECKPOINTING and job.preemptions == 1
    assert not rebuilt.step([], None, 3303.0).commands  # not signalled again
    (stop,) = rebuilt.step([], None, 3601.0).commands  # the grace ends when it would have
    assert isinstance(stop, Stop) and stop.job_id == "a"


def test_an_extended_slot_is_logged_and_a_rebuild_does_not_end_it_at_the_first_slots_end():
    s = sched(nodes={"n0": 1})
    submitted = Submitted(ticket("a", slot_s=3600.0, slot_grace_s=300.0, slot_extends=True))
    (launch,) = launches(s.step([submitted], cluster({"n0": [0]}), 1.0).commands)
    extended = s.step([], None, 3302.0)  # nobody waits at the first slot's end (due 3301)
    assert not extended.commands and extended.decided == [SlotEnded("a", 1, 3301.0, True)]
    waiting = Submitted(ticket("b", need_mib=38000.0))  # cannot share a's GPU: it waits
    rebuilt = sched(nodes={"n0": 1})
    rebuilt.rebuild([(submitted, 1.0), (RunStarted("a", 1, launch.placements, 1.0), 2.0),
                     (extended.decided[0], 3302.0), (waiting, 3400.0)])
    assert not rebuilt.step([], None, 3500.0).commands  # the first slot's deadline was overtaken
    assert [type(c) for c in rebuilt.step([], None, 6902.0).commands] == [SignalCheckpoint]  # 3301 + 3600


def _stopped_at_its_slots_end(s, job_id: str, attempt: int, start_s: float) -> None:
    """Run ``attempt`` of a job with 1000 s slots and 100 s of grace, started at ``start_s``, is
    signalled and then stopped before it checkpointed."""
    assert [type(c) for c in s.step([], None, start_s + 900.0).commands] == [SignalCheckpoint]
    assert [type(c) for c in s.step([], None, start_s + 1000.0).commands] == [Stop]
    s.step([RunEnded(job_id, attempt, Failure("killed", "SIGTERM"), -15)], None, start_s + 1001.0)


def test_a_job_stopped_twice_in_a_row_before_it_checkpointed_runs_to_its_end():
    """A job that never checkpoints in its grace would restart from scratch at every slot's end,
    for ever: after two such slots its next run has no slot."""
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0))], cluster({"n0": [0]}), 0.0)
    _stopped_at_its_slots_end(s, "long", 1, 0.0)
    long = s.jobs["long"]
    assert long.unsaved_preemptions == 1 and not long.runs_to_end and "not preempted" not in long.record.reason
    (second,) = launches(s.step([], cluster({"n0": [0]}), 1002.0).commands)
    _stopped_at_its_slots_end(s, "long", second.attempt, 1002.0)
    assert long.runs_to_end and "its next run goes to its end, not preempted" in long.record.reason
    (third,) = launches(s.step([], cluster({"n0": [0]}), 2004.0).commands)
    assert "runs to its end, not preempted: stopped 2x in a row before it checkpointed" in long.record.reason
    s.step([Submitted(ticket("next", need_mib=39000))], cluster({"n0": [36000]}), 2010.0)
    assert not s.step([], None, 50_000.0).commands  # no slot: not signalled, however long it runs
    s.step([RunEnded("long", third.attempt, None, 0)], None, 60_000.0)
    assert long.record.state is JobState.SUCCEEDED and long.lost_runs == 2 and long.preemptions == 2


def test_a_checkpoint_between_two_lost_slots_keeps_the_job_in_its_slots():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0))], cluster({"n0": [0]}), 0.0)
    _stopped_at_its_slots_end(s, "long", 1, 0.0)
    (second,) = launches(s.step([], cluster({"n0": [0]}), 1002.0).commands)
    s.step([], None, 1902.0)  # signalled; this time it saves
    s.step([RunEnded("long", second.attempt, Failure("checkpoint_requeue", "checkpointed"), 85)], None, 1950.0)
    (third,) = launches(s.step([], cluster({"n0": [0]}), 1951.0).commands)
    _stopped_at_its_slots_end(s, "long", third.attempt, 1951.0)
    assert s.jobs["long"].unsaved_preemptions == 1 and not s.jobs["long"].runs_to_end


def test_a_rebuild_from_the_log_knows_a_job_that_runs_to_its_end():
    s = sched(nodes={"n0": 1})
    submitted = Submitted(ticket("long", slot_s=1000.0, slot_grace_s=100.0))
    log: list = [(submitted, 0.0)]
    (launch,) = launches(s.step([submitted], cluster({"n0": [0]}), 0.0).commands)
    for start_s in (0.0, 1002.0):
        log.append((RunStarted("long", launch.attempt, launch.placements, start_s), start_s))
        signalled = s.step([], None, start_s + 900.0)
        log += [(e, start_s + 900.0) for e in signalled.decided]
        s.step([], None, start_s + 1000.0)
        ended = RunEnded("long", launch.attempt, Failure("killed", "SIGTERM"), -15)
        s.step([ended], None, start_s + 1001.0)
        log.append((ended, start_s + 1001.0))
        if start_s == 0.0:
            (launch,) = launches(s.step([], cluster({"n0": [0]}), 1002.0).commands)
    rebuilt = sched(nodes={"n0": 1})
    rebuilt.rebuild(log)
    rebuilt.heard_from(["n0"])
    assert rebuilt.jobs["long"].runs_to_end
    (third,) = launches(rebuilt.step([], cluster({"n0": [0]}), 2004.0).commands)
    assert third.attempt == 3 and not rebuilt.step([], None, 50_000.0).commands


def test_the_scheduler_counts_its_own_launch_until_a_snapshot_shows_it():
    """Snapshots arrive late: until one shows the run the scheduler launched, it counts the run's
    reservation itself (and the GPU's post-launch grace), so the next job is not booked there."""
    s = sched(nodes={"n0": 1})
    (launch,) = launches(s.step([Submitted(ticket("a", need_mib=30000.0))], cluster({"n0": [0]}), 1.0).commands)
    stale = cluster({"n0": [0]}, now=1.0)  # the node has not reported "a" yet
    assert not launches(s.step([Submitted(ticket("b", need_mib=30000.0))], stale, 40.0).commands)
    assert s.reservations() == {("n0", 0): 30000.0}
    assert "no GPU with" in s.reason("b", stale)
    shown = ClusterIndex.from_snapshots({"n0": [GpuState("n0", 0, TOTAL, 500.0, resident_jobs=("a",),
                                                         pending_mib=29500.0, last_launch_s=1.0)]})
    assert not launches(s.step([], shown, 41.0).commands) and not s.unshown_launches  # shown: confirmed
    (b,) = launches(s.step([RunEnded("a", launch.attempt)], cluster({"n0": [0]}), 50.0).commands)
    assert b.job_id == "b"


def test_a_late_snapshot_of_a_jobs_earlier_attempt_does_not_pass_for_its_next():
    """A job relaunched after an OOM goes back to the GPU a late snapshot still shows its first
    attempt on, holding the 9000 MiB it peaked at. The second attempt reserves more than that:
    until a snapshot shows the second attempt, the scheduler counts all of its reservation (a
    30,000 MiB job does not fit beside it) and keeps it unconfirmed."""
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("a", need_mib=8000.0))], cluster({"n0": [0]}), 1.0)
    s.step([RunEnded("a", 1, Failure("oom", "CUDA out of memory"), 1, 9000.0)], None, 2.0)

    def late(attempt: int) -> ClusterIndex:
        return ClusterIndex.from_snapshots({"n0": [GpuState("n0", 0, TOTAL, 9000.0, resident_jobs=("a",),
                                                            resident_attempts=(attempt,), last_launch_s=1.0)]})

    (again,) = launches(s.step([], late(1), 60.0).commands)
    assert again.attempt == 2
    assert not launches(s.step([Submitted(ticket("b", need_mib=30000.0))], late(1), 200.0).commands)
    assert set(s.unshown_launches) == {"a"} and s.reservations() == {("n0", 0): again.placements[0].reserved_mib}
    s.step([], late(2), 201.0)
    assert not s.unshown_launches


def test_a_settled_run_books_what_it_settled_at_and_never_more():
    s = sched(nodes={"n0": 1})
    s.step([Submitted(ticket("a", need_mib=20000.0))], cluster({"n0": [0]}), 1.0)
    s.step([RunSettled("a", 1, 8240.0)], None, 20.0)
    assert s.reservations() == {("n0", 0): 8240.0}
    s.step([RunSettled("a", 1, 30000.0), RunSettled("a", 0, 1.0)], None, 21.0)  # never raised; an old run's: nothing
    assert s.reservations() == {("n0", 0): 8240.0}
    assert event_from_record(to_record(RunSettled("a", 1, 8240.0, "n0"))) == RunSettled("a", 1, 8240.0, "n0")


def test_a_gang_declined_by_one_node_has_its_started_ranks_stopped_there_only():
    s = sched(nodes={"n0": 1, "n1": 1, "n2": 1})
    (launch,) = s.step([Submitted(ticket("g", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0], "n2": [0]}),
                       1.0).commands
    first, second = (p.node for p in launch.placements)
    commands = s.step([LaunchDeclined("g", 1, f"{second}: no room", started=(first,))], None, 1.5).commands
    (stop,) = commands
    assert isinstance(stop, Stop) and stop.nodes == (first,) and stop.attempt == 1 and "no room" in stop.reason
    # placed again as attempt 1 while its first rank still exits, that rank's node would take it for the new run's
    assert s.jobs["g"].record.state is JobState.RUNNING
    assert not launches(s.step([], cluster({"n0": [0], "n1": [0], "n2": [0]}), 1.7).commands)
    assert s.reservations() == {(first, 0): 4000.0}  # only the rank that started holds its GPU
    s.step([RunEnded("g", 1, Failure("killed", "SIGTERM"), -15, node=first)], None, 1.8)
    assert s.jobs["g"].record.state is JobState.QUEUED and s.jobs["g"].record.attempts == 0
    assert "declined: " in s.jobs["g"].record.reason and s.jobs["g"].other_failures == 0
    # a node that declined before any rank started: nothing to stop
    (again,) = launches(s.step([], cluster({"n0": [0], "n1": [0], "n2": [0]}), 2.0).commands)
    assert s.step([LaunchDeclined("g", again.attempt, "no room")], None, 2.5).commands == []
    # the node of the rank that started is lost: nothing of the run is left, the attempt is taken back
    (third,) = launches(s.step([], cluster({"n0": [0], "n1": [0], "n2": [0]}), 3.0).commands)
    started = third.placements[0].node
    s.step([LaunchDeclined("g", third.attempt, "no room", started=(started,))], None, 3.5)
    s.step([NodeLost(started)], None, 4.0)
    assert s.jobs["g"].record.state is JobState.QUEUED and s.jobs["g"].record.attempts == third.attempt - 1


def test_stops_and_checkpoint_signals_name_every_node_of_the_run():
    s = sched(nodes={"n0": 1, "n1": 1})
    (launch,) = s.step([Submitted(ticket("g", gpus=2, gpus_per_node=1))], cluster({"n0": [0], "n1": [0]}),
                       1.0).commands
    (signal,) = s.step([CheckpointRequested("g")], None, 2.0).commands
    assert isinstance(signal, SignalCheckpoint) and set(signal.nodes) == {"n0", "n1"}
    (stop,) = s.step([CancelRequested("g")], None, 3.0).commands
    assert stop.nodes == tuple(p.node for p in launch.placements)


def test_a_launch_resumes_after_a_checkpoint_or_a_lost_run_only():
    s = sched(nodes={"n0": 1, "n1": 1})
    (first,) = s.step([Submitted(ticket("a"))], cluster({"n0": [0], "n1": [0]}), 1.0).commands
    assert not first.resume
    s.step([RunEnded("a", 1, Failure("oom", "oom"), 1, 3000.0)], None, 2.0)
    (after_oom,) = launches(s.step([], cluster({"n0": [0], "n1": [0]}), 3.0).commands)
    assert not after_oom.resume  # an OOM crash left no checkpoint behind
    node = after_oom.placements[0].node
    s.step([NodeLost(node)], None, 4.0)
    other = "n1" if node == "n0" else "n0"
    (after_loss,) = launches(s.step([], cluster({other: [0]}), 5.0).commands)
    assert after_loss.resume
    s2 = sched()
    s2.step([Submitted(ticket("b"))], cluster({"n0": [0, 0]}), 1.0)
    s2.step([RunEnded("b", 1, Failure("checkpoint_requeue", "saved"), 3)], None, 2.0)
    (resumed,) = launches(s2.step([], cluster({"n0": [0, 0]}), 3.0).commands)
    assert resumed.resume


def test_after_a_rebuild_nothing_is_placed_until_every_node_has_answered_or_is_lost():
    log = [(NodeJoined("n0", (TOTAL,)), 0.0), (NodeJoined("n1", (TOTAL,)), 0.0), (Submitted(ticket("a")), 1.0),
           (Submitted(ticket("b")), 1.0), (CancelRequested("b"), 1.5)]
    s = Scheduler(preset("magm"))
    assert s.rebuild(log) == []  # b was cancelled while queued: no stop owed
    assert s.step([], cluster({"n0": [0]}), 2.0).commands == []
    s.heard_from(["n0"])
    assert s.step([], cluster({"n0": [0]}), 3.0).commands == []  # n1 may still run a launch of a
    (launch,) = s.step([NodeLost("n1")], cluster({"n0": [0]}), 4.0).commands
    assert launch.job_id == "a"
    fresh = Scheduler(preset("magm"))
    assert fresh.rebuild([]) == []
    fresh.apply([NodeJoined("n0", (TOTAL,)), Submitted(ticket("c"))], 0.0)
    assert launches(fresh.step([], cluster({"n0": [0]}), 1.0).commands)  # no log: nothing to wait for


def test_a_rebuild_owes_the_stop_of_a_run_whose_cancel_was_logged():
    s = sched()
    (launch,) = s.step([Submitted(ticket("a"))], cluster({"n0": [0, 0]}), 1.0).commands
    log = [(NodeJoined("n0", (TOTAL, TOTAL)), 0.0), (Submitted(ticket("a")), 1.0),
           (RunStarted("a", 1, launch.placements), 1.2), (CancelRequested("a"), 2.0)]
    (owed,) = Scheduler(preset("magm")).rebuild(log)
    assert (owed.job_id, owed.attempt, owed.nodes) == ("a", 1, ("n0",))
