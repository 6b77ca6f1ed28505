"""Team queues beyond GPU quotas: the configuration file, fair-share order and reclaim, cohorts,
lending limits, memory quotas, priority classes, preemptibility, minimum runtimes and priority
preemption inside a queue — the core's rules, which both shells apply."""

from __future__ import annotations

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    JobTicket, Launch, NodeJoined, QueuesConfigured, Reject, RunEnded, SignalCheckpoint, Submitted, event_from_record,
    to_record,
)
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState
from hier_sched.core.job import JobState
from hier_sched.core.presets import preset
from hier_sched.core.queues_spec import parse_queues
from hier_sched.core.quotas import Charge, PriorityClass, QueueQuota, QueueSetup
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.spec import SpecError

TOTAL = 40536.0


def idle(nodes: int = 2, gpus: int = 2) -> ClusterIndex:
    return ClusterIndex.from_snapshots({f"n{n}": [GpuState(f"n{n}", i, TOTAL, 0.0) for i in range(gpus)]
                                        for n in range(nodes)})


def sched(setup: QueueSetup, nodes: int = 2, gpus: int = 2) -> Scheduler:
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined(f"n{n}", (TOTAL,) * gpus) for n in range(nodes)], 0.0)
    s.apply([QueuesConfigured(setup)], 0.0)
    return s


def big(job_id: str, queue: str | None, **kw) -> JobTicket:
    """A job that fills a GPU (two never share one), which checkpoints."""
    return JobTicket(job_id, job_id, need_mib=30000.0, signature=job_id, queue=queue, **{"checkpoints": True, **kw})


def launched(commands) -> list[str]:
    return [c.job_id for c in commands if isinstance(c, Launch)]


def signalled(commands) -> list[str]:
    return [c.job_id for c in commands if isinstance(c, SignalCheckpoint)]


def requeue(job_id: str, attempt: int = 1) -> RunEnded:
    return RunEnded(job_id, attempt, Failure("checkpoint_requeue", "checkpointed"), 85)


# ------------------------------------------------------------------ the file
FULL = {
    "queues": [
        {"name": "vision", "cohort": "research", "nominal": {"gpus": 4, "memory_mib": 163840},
         "borrowing_limit": {"gpus": 2}, "lending_limit": {"gpus": 1, "memory_mib": 40960}, "weight": 2,
         "reclaimable": False, "priority_preemption": True, "min_runtime_s": 600},
        {"name": "notebooks", "nominal": {"memory_mib": 81920}},
        {"name": "batch"},
    ],
    "priority_classes": [{"name": "production", "value": 100, "preemptible": False}, {"name": "low", "value": -10}],
    "fair_sharing": {"half_life_s": 7200, "reclaim": "nominal"},
}


def test_the_whole_file_is_read_into_one_setup():
    setup = parse_queues(FULL)
    vision, notebooks, batch = setup.queues
    assert vision == QueueQuota("vision", 4, 2, 163840.0, None, 1, 40960.0, "research", 2.0, False, True, 600.0)
    assert notebooks.nominal_gpus is None and notebooks.nominal_mib == 81920.0  # memory only: GPUs not limited
    assert batch == QueueQuota("batch")  # names nothing: nominal 0 GPUs, borrows what is idle
    assert setup.priority_classes == (PriorityClass("production", 100, False), PriorityClass("low", -10))
    assert (setup.half_life_s, setup.reclaim) == (7200.0, "nominal")


def test_each_bad_field_of_the_file_is_named():
    with pytest.raises(SpecError) as bad:
        parse_queues({"queues": [{"name": "a", "nominal": {"gpus": 2}, "borrowing_limit": {"memory_mib": 5}},
                                 {"name": "b", "weight": 0}],
                      "priority_classes": [{"name": "p", "value": 1}, {"name": "p", "value": 2}],
                      "fair_sharing": {"reclaim": "always"}})
    text = str(bad.value)
    assert "borrowing_limit.memory_mib limits a currency the nominal quota does not name (add nominal.memory_mib)" in text
    assert "queues.1.weight: input should be greater than 0" in text
    assert "priority_classes: priority class 'p' is defined twice" in text
    assert "fair_sharing.reclaim: input should be 'fair_share' or 'nominal'" in text


def test_a_configuration_survives_its_log_record_and_version_1_records_still_read():
    event = QueuesConfigured(parse_queues(FULL))
    assert event_from_record(to_record(event)) == event
    old = {"type": "QueuesConfigured", "queues": [{"name": "a", "nominal_gpus": 2, "borrowing_limit_gpus": None}]}
    assert event_from_record(old) == QueuesConfigured(QueueSetup((QueueQuota("a", 2),)))


# ------------------------------------------------------------------ order and fair share
def test_a_queue_that_used_more_lately_waits_behind_one_that_did_not():
    s = sched(QueueSetup((QueueQuota("a", 0), QueueQuota("b", 0)), half_life_s=3600.0), nodes=1)
    s.step([Submitted(big("a1", "a")), Submitted(big("a2", "a"))], idle(1), 0.0)
    s.step([Submitted(big(f"a{i}", "a")) for i in (3, 4)] + [Submitted(big("b1", "b"))], idle(1), 1000.0)
    # a held both GPUs for 1,000 s; b held nothing: when a GPU frees, b1 goes before a3, though a3 came first
    out = s.step([RunEnded("a1", 1)], idle(1), 2000.0).commands
    assert launched(out) == ["b1"]


def test_a_queue_below_its_fair_share_reclaims_beyond_its_nominal_quota():
    queues = (QueueQuota("a", 1), QueueQuota("b", 1))
    for mode, taken in (("fair_share", ["a4", "a3"]), ("nominal", ["a4"])):
        s = sched(QueueSetup(queues, reclaim=mode))
        assert launched(s.step([Submitted(big(f"a{i}", "a")) for i in range(1, 5)], idle(), 1.0).commands) == \
            ["a1", "a2", "a3", "a4"]
        out = s.step([Submitted(big("b1", "b")), Submitted(big("b2", "b"))], idle(), 2.0).commands
        # the 2 GPUs nobody is guaranteed split 1:1: b's fair share is 2, its nominal quota 1
        assert signalled(out) == taken, mode


def test_a_closed_cohort_borrows_only_what_its_members_lend():
    setup = QueueSetup((QueueQuota("x1", 1, cohort="x"), QueueQuota("x2", 2, cohort="x", lending_limit_gpus=1),
                        QueueQuota("open", 0)))
    s = sched(setup)
    out = s.step([Submitted(big(f"j{i}", "x1")) for i in (1, 2, 3)] + [Submitted(big("o1", "open"))], idle(), 1.0)
    # queue x1 borrows the 1 GPU x2 lends, not the second it keeps; o1 takes the GPU no queue is guaranteed
    assert sorted(launched(out.commands)) == ["j1", "j2", "o1"]
    assert s.reason("j3") == "waiting: queue x1 would borrow 2 GPUs beyond its quota; cohort x has no more to lend"


def test_memory_quotas_count_what_runs_reserve():
    s = sched(QueueSetup((QueueQuota("nb", None, nominal_mib=61440.0, borrowing_limit_mib=0.0),)))
    out = s.step([Submitted(big(f"n{i}", "nb")) for i in (1, 2, 3)], idle(), 1.0).commands
    assert len(launched(out)) == 2  # 2 x 30,000 MiB fit in 60 GiB, a third does not
    assert s.reason("n3").startswith("waiting: queue nb over quota: 58.6/60.0 GiB, borrowing limit reached")


# ------------------------------------------------------------------ priority classes and preemptibility
CLASSES = (PriorityClass("prod", 100, preemptible=False), PriorityClass("low", -5))


def test_a_priority_class_sets_the_priority_and_an_unknown_one_is_rejected():
    s = sched(QueueSetup((QueueQuota("a", 4),), CLASSES), nodes=1, gpus=1)
    s.step([Submitted(big("first", "a"))], idle(1, 1), 1.0)
    s.step([Submitted(big("lo", "a", priority_class="low")), Submitted(big("hi", "a", priority_class="prod")),
            Submitted(big("plain", "a"))], idle(1, 1), 2.0)
    out = s.step([RunEnded("first", 1)], idle(1, 1), 3.0).commands
    assert launched(out) == ["hi"]
    (reject,) = s.step([Submitted(big("x", "a", priority_class="gold"))], None, 4.0).commands
    assert isinstance(reject, Reject)
    assert reject.reason == "priority_class: unknown priority class 'gold'; known: low, prod"
    plain = Scheduler(preset("magm"))
    (reject,) = plain.step([Submitted(big("y", None, priority_class="prod"))], None, 1.0).commands
    assert reject.reason == "priority_class: no priority classes are configured (hier-sched queues apply)"


def test_runs_that_may_not_be_preempted_are_left_alone():
    queues = (QueueQuota("a", 1), QueueQuota("b", 3))
    s = sched(QueueSetup(queues, CLASSES))
    s.step([Submitted(big("a1", "a")), Submitted(big("a2", "a", preemptible=False)),
            Submitted(big("a3", "a", priority_class="prod")), Submitted(big("a4", "a"))], idle(), 1.0)
    out = s.step([Submitted(big(f"b{i}", "b")) for i in (1, 2, 3)], idle(), 2.0).commands
    # b is owed 3 GPUs; only a4 and a1 may be preempted (a2 says no, a3's class says no): b1, b2 are
    # served job by job, and b3 waits for a run to end
    assert signalled(out) == ["a4", "a1"]


def test_a_queue_that_is_not_reclaimable_keeps_what_it_borrows():
    s = sched(QueueSetup((QueueQuota("a", 2, reclaimable=False), QueueQuota("b", 2))))
    s.step([Submitted(big(f"a{i}", "a")) for i in range(1, 5)], idle(), 1.0)
    assert signalled(s.step([Submitted(big("b1", "b"))], idle(), 2.0).commands) == []


def test_no_run_is_preempted_before_its_queues_minimum_runtime():
    s = sched(QueueSetup((QueueQuota("a", 2, min_runtime_s=600.0), QueueQuota("b", 2))))
    s.step([Submitted(big(f"a{i}", "a")) for i in range(1, 5)], idle(), 0.0)
    result = s.step([Submitted(big("b1", "b"))], idle(), 100.0)
    assert signalled(result.commands) == [] and result.plan_at_s == 600.0  # planned again when a4 is old enough
    assert signalled(s.step([], idle(), 600.0).commands) == ["a4"]


def test_a_queue_may_let_its_jobs_preempt_its_own_lower_priorities():
    for on, expected in ((True, ["a2"]), (False, [])):
        s = sched(QueueSetup((QueueQuota("a", 2, 0, priority_preemption=on),)), nodes=1)
        s.step([Submitted(big("a1", "a", priority=1)), Submitted(big("a2", "a"))], idle(1), 1.0)
        out = s.step([Submitted(big("urgent", "a", priority=5))], idle(1), 2.0).commands
        assert signalled(out) == expected
        if on:
            assert "job urgent of priority 5 preempts lower priorities in queue a" in s.jobs["a2"].record.reason
            assert launched(s.step([requeue("a2")], idle(1), 3.0).commands) == ["urgent"]
            assert s.jobs["a2"].record.state is JobState.QUEUED


# ------------------------------------------------------------------ reclaim where the job fits
def test_a_reclaim_frees_a_whole_node_for_a_job_that_needs_one():
    s = sched(QueueSetup((QueueQuota("a", 2), QueueQuota("b", 2))))
    s.step([Submitted(big("a1", "a", priority=5)), Submitted(big("a3", "a", priority=-1))], idle(), 1.0)  # node0
    s.step([Submitted(big("a2", "a")), Submitted(big("a4", "a"))], idle(), 2.0)  # node1
    out = s.step([Submitted(big("pair", "b", gpus=2))], idle(), 3.0).commands
    # by rank a3 (lowest priority, node0) and a4 (newest, node1) would go, one on each node: the
    # pair would fit on neither; a's fair share lets it lose 2, so the reclaim takes node1's two
    assert sorted(signalled(out)) == ["a2", "a4"]
    assert launched(s.step([requeue("a2"), requeue("a4")], idle(), 4.0).commands) == ["pair"]


def test_nothing_is_preempted_for_a_job_that_would_not_fit_anyway():
    s = sched(QueueSetup((QueueQuota("a", 2), QueueQuota("b", 2))))
    s.step([Submitted(big(f"a{i}", "a")) for i in range(1, 5)], idle(), 1.0)
    # a gang of 2 nodes x 2 GPUs needs every GPU, but a keeps its fair share of 2: no reclaim can
    # make room, so no run is preempted (and none again and again)
    out = s.step([Submitted(big("wide", "b", gpus=4, gpus_per_node=2))], idle(), 2.0).commands
    assert signalled(out) == [] and signalled(s.step([], idle(), 3.0).commands) == []


def test_the_cycle_order_lists_the_rest_of_the_queue_only_when_read_that_far():
    from hier_sched.core.cycle_order import cycle_order
    from hier_sched.core.team_queues import by_queue, entitlements

    s = sched(QueueSetup((QueueQuota("a", 0), QueueQuota("b", 0))), nodes=1, gpus=1)
    s.step([Submitted(big(f"a{i}", "a")) for i in range(4)] + [Submitted(big(f"b{i}", "b")) for i in range(4)],
           None, 1.0)
    book = s.teams.book
    order = cycle_order(s.job_queue.order, by_queue(s.job_queue.order), book, entitlements(book), turns=3)
    assert [q.job_id for q in order[:3]] == ["a0", "b0", "a1"]  # the queues take turns
    assert order._all is None  # nothing past the turns was read yet
    assert len(order) == 8 and [q.job_id for q in order[3:]] == ["a2", "a3", "b1", "b2", "b3"]  # then queue order
    assert [q.job_id for q in order] == ["a0", "b0", "a1", "a2", "a3", "b1", "b2", "b3"] and order[-1].job_id == "b3"


def test_what_a_queue_is_owed_is_worked_out_when_first_asked_from_the_picture_the_cycle_started_with():
    from hier_sched.core.team_queues import entitlements

    s = sched(QueueSetup((QueueQuota("a", 1), QueueQuota("b", 1))), nodes=1, gpus=2)
    s.step([Submitted(big("a0", "a")), Submitted(big("a1", "a"))], None, 1.0)
    book = s.teams.book
    owed = entitlements(book)
    assert owed._owed is None  # not worked out yet: most cycles never ask
    expected = book.fair_shares(book.demand())
    book.enqueued("late", "b", Charge(1, 1000.0))  # the book moves on (a job placed or queued this cycle)
    assert owed.owed == expected and owed.owed is owed.owed  # as the cycle began, worked out once


def test_with_one_team_queue_waiting_the_cycle_order_is_the_queue_order():
    s = sched(QueueSetup((QueueQuota("a", 0), QueueQuota("b", 0))), nodes=1, gpus=1)
    s.step([Submitted(big(f"a{i}", "a")) for i in range(3)], None, 1.0)
    order = s.job_queue.order
    assert s.teams.cycle_order(order, turns=1) is order  # nothing to take turns with: no tiers worked out
