"""Queue order, strict FIFO vs backfill, gangs all-or-nothing, recovery priority and margins."""

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState
from hier_sched.core.job import IllegalTransition, JobRecord, JobState
from hier_sched.core.placement import PlacementConfig
from hier_sched.core.queueing import QueueConfig, QueuedJob, note_blocked_head, plan_cycle
from hier_sched.core.recovery import RecoveryPolicy, decide_after_failure, recovery_requirement

TOTAL = 40536.0
NOW = 500.0


def node(name, *used, jobs=None):
    return [
        GpuState(node=name, index=i, memory_total_mib=TOTAL, memory_used_mib=u,
                 resident_jobs=(() if u == 0 else (f"{name}-r{i}",)) if jobs is None else jobs[i])
        for i, u in enumerate(used)
    ]


def plan(queue, nodes, policy="magm", **q):
    return plan_cycle(queue, ClusterIndex.from_snapshots(nodes), PlacementConfig(policy=policy), QueueConfig(**q), NOW)


def job(jid, t, need=1000.0, **kw):
    return QueuedJob(jid, t, need_mib=need, **kw)


def test_strict_fifo_head_blocks_everyone():
    nodes = {"n0": node("n0", 30000, 0)}
    queue = [job("big", 1, need=20000, gpus=2), job("small", 2, need=100)]
    p = plan(queue, nodes, strict_fifo=True)
    assert p.placements == [] and p.waiting["small"] == ("behind the head of the queue",)


def test_backfill_lets_small_jobs_pass_a_blocked_head():
    nodes = {"n0": node("n0", 30000, 0)}
    queue = [job("big", 1, need=20000, gpus=2), job("small", 2, need=100)]
    p = plan(queue, nodes, strict_fifo=False)
    assert [q.job_id for q, _ in p.placements] == ["small"]


def test_a_head_that_waited_too_long_gets_gpus_held_while_backfilling_goes_on_elsewhere():
    nodes = {"n0": node("n0", 30000, 0), "n1": node("n1", 35000, 35000)}
    head = job("big", 1, need=20000, gpus=2, waiting_since_s=NOW - 4000)
    p = plan([head, job("small", 2, need=100)], nodes, strict_fifo=False, head_wait_limit_s=3600)
    assert p.holds == {"big": (("n0", (0, 1)),)}  # n0 is closest to fitting two 20 GB slots
    assert [(q.job_id, ps[0].node) for q, ps in p.placements] == [("small", "n1")]
    assert "holding n0 GPU 0,1" in p.waiting["big"][-1]


def test_no_hold_before_the_limit_and_backfill_may_use_any_gpu():
    nodes = {"n0": node("n0", 30000, 0)}
    head = job("big", 1, need=20000, gpus=2, waiting_since_s=NOW - 100)
    p = plan([head, job("small", 2, need=100)], nodes, strict_fifo=False, head_wait_limit_s=3600)
    assert p.holds == {} and [q.job_id for q, _ in p.placements] == ["small"]


def test_a_hold_is_sticky_and_remembered_by_the_owner():
    nodes = {"n0": node("n0", 30000, 0), "n1": node("n1", 35000, 35000)}
    head = job("big", 1, need=20000, gpus=2, waiting_since_s=NOW - 4000, held=(("n1", (0, 1)),))
    small = job("small", 2, need=100)
    p = plan([head, small], nodes, strict_fifo=False, head_wait_limit_s=3600)
    assert p.holds == {"big": (("n1", (0, 1)),)}
    assert [(q.job_id, ps[0].node) for q, ps in p.placements] == [("small", "n0")]
    head.held = ()
    assert note_blocked_head(head, p, NOW)  # the hold changed
    assert head.held == (("n1", (0, 1)),)
    assert not note_blocked_head(head, p, NOW)  # the same hold: nothing to log


def test_a_hold_on_a_node_drained_or_lost_since_moves_to_a_node_that_takes_work():
    nodes = {"n0": node("n0", 30000, 0), "n1": node("n1", 35000, 35000)}
    for gone in ("drained", "lost"):
        index = ClusterIndex.from_snapshots(nodes)
        index.close(["n1"]) if gone == "drained" else index.remove("n1")
        head = job("big", 1, need=20000, gpus=2, waiting_since_s=NOW - 4000, held=(("n1", (0, 1)),))
        p = plan_cycle([head], index, PlacementConfig(policy="magm"),
                       QueueConfig(strict_fifo=False, head_wait_limit_s=3600), NOW)
        assert p.holds == {"big": (("n0", (0, 1)),)}, gone


def test_order_recovery_then_priority_then_submit_time():
    nodes = {"n0": node("n0", 0)}
    queue = [job("old", 1), job("vip", 5, priority=3), job("crashed", 9, oom_count=1, observed_peak_mib=100)]
    p = plan(queue, nodes)
    assert p.placements[0][0].job_id == "crashed"
    p = plan(queue[:2], nodes)
    assert p.placements[0][0].job_id == "vip"


def test_one_cycle_places_several_jobs_respecting_grace():
    nodes = {"n0": node("n0", 0, 0)}
    p = plan([job("a", 1), job("b", 2), job("c", 3)], nodes, strict_fifo=False)
    placed = {q.job_id: ps[0].gpus for q, ps in p.placements}
    assert placed == {"a": (0,), "b": (1,)}  # c: both GPUs just got a job (post-launch grace)
    assert "grace" in " ".join(p.waiting["c"])


@pytest.mark.parametrize("strict_fifo", [True, False])
def test_a_cycle_starts_at_most_its_limit_and_says_so_to_the_rest(strict_fifo):
    nodes = {"n0": node("n0", 0, 0, 0, 0)}
    queue = [job(j, i) for i, j in enumerate("abcd", 1)]
    p = plan(queue, nodes, strict_fifo=strict_fifo, starts_per_cycle=2)
    assert [q.job_id for q, _ in p.placements] == ["a", "b"] and p.head is None
    assert "started its 2 jobs" in p.waiting["c"][0] and "started its 2 jobs" in p.waiting["d"][0]
    assert len(plan(queue, nodes, strict_fifo=strict_fifo).placements) == 4  # no limit


def test_backfilling_stops_at_the_limit_too():
    nodes = {"n0": node("n0", 30000, 0, 0)}
    queue = [job("big", 1, need=20000, gpus=3), job("s1", 2), job("s2", 3), job("s3", 4)]
    p = plan(queue, nodes, strict_fifo=False, starts_per_cycle=1)
    assert [q.job_id for q, _ in p.placements] == ["s1"] and p.head == "big"
    assert "started its 1 jobs" in p.waiting["s2"][0]


class _Gate:
    """A team queue gate that refuses one job (``refuses_nobody`` False), or says it refuses
    nobody and must then never be asked."""

    def __init__(self, refuses: str | None):
        self.refuses_nobody = refuses is None
        self.refuses = refuses

    def refusal(self, job, given):
        assert not self.refuses_nobody, "a gate that refuses nobody was asked"
        return "over its queue's quota" if job.job_id == self.refuses else None

    def count_placed(self, job, given):
        pass


def test_the_planner_asks_a_gate_about_every_job_unless_it_refuses_nobody():
    nodes = {"n0": node("n0", 0, 0, 0)}
    queue = [job("a", 1), job("b", 2), job("c", 3)]
    cluster, cfg, qcfg = ClusterIndex.from_snapshots(nodes), PlacementConfig(policy="magm"), QueueConfig()
    gated = plan_cycle(queue, cluster, cfg, qcfg, NOW, quotas=_Gate("a"))
    assert [q.job_id for q, _ in gated.placements] == ["b", "c"]
    assert gated.waiting["a"] == ("over its queue's quota",)
    open_ = plan_cycle(queue, ClusterIndex.from_snapshots(nodes), cfg, qcfg, NOW, quotas=_Gate(None))
    assert [q.job_id for q, _ in open_.placements] == ["a", "b", "c"]


def test_gang_is_all_or_nothing_across_nodes():
    nodes = {"n0": node("n0", 0, 0), "n1": node("n1", 0, 39000), "n2": node("n2", 0, 0)}
    gang = job("gang", 1, need=8000, gpus=4, gpus_per_node=2)
    p = plan([gang], nodes)
    assert len(p.placements) == 1
    placements = p.placements[0][1]
    assert sorted(pl.node for pl in placements) == ["n0", "n2"] and all(len(pl.gpus) == 2 for pl in placements)
    p = plan([job("gang3", 1, need=8000, gpus=6, gpus_per_node=2)], nodes)
    assert p.placements == [] and "gang: 2/3 nodes" in p.waiting["gang3"][0]


def test_magm_prefers_the_node_with_most_free_memory_when_collocating():
    nodes = {"n0": node("n0", 30000), "n1": node("n1", 10000), "n2": node("n2", 20000)}
    p = plan([job("a", 1, need=1000)], nodes)
    assert p.placements[0][1][0].node == "n1"
    p = plan([job("a", 1, need=1000)], nodes, policy="best-fit")
    assert p.placements[0][1][0].node == "n0"


def test_recovery_requirement_escalates_then_asks_for_idle():
    pol = RecoveryPolicy(step_mib=5120, max_steps=2)
    assert recovery_requirement(0, 2000, None, TOTAL, pol) == (None, False)
    assert recovery_requirement(1, 2000, 9000, TOTAL, pol) == (9000 + 5120, False)
    assert recovery_requirement(2, 2000, 9000, TOTAL, pol) == (9000 + 10240, False)
    assert recovery_requirement(3, 2000, 9000, TOTAL, pol) == (None, True)  # steps used up
    assert recovery_requirement(1, 38000, None, TOTAL, pol) == (None, True)  # would exceed the GPU


def test_recovering_job_waits_for_escalated_free_memory():
    nodes = {"n0": node("n0", 30000)}  # usable free ~10k
    crashed = job("liar", 1, need=2000, oom_count=1, observed_peak_mib=6000)
    p = plan([crashed], nodes)
    assert p.placements == [] and "10.9 GiB usable" in p.waiting["liar"][0]
    nodes = {"n0": node("n0", 30000, 0)}
    p = plan([job("liar", 1, need=2000, oom_count=3, observed_peak_mib=6000)], nodes)
    assert p.placements[0][1][0].gpus == (1,) and p.placements[0][1][0].exclusive


def test_decide_after_failure_limits_attempts():
    pol = RecoveryPolicy(max_attempts=3, max_retries_other=1)
    oom = Failure("oom", "CUDA out of memory")
    assert decide_after_failure(oom, attempts=2, oom_count=2, other_failures=0, policy=pol).requeue
    final = decide_after_failure(oom, attempts=3, oom_count=3, other_failures=0, policy=pol)
    assert not final.requeue and "all 3 attempts" in final.reason
    err = Failure("error", "exit code 2")
    assert decide_after_failure(err, attempts=1, oom_count=0, other_failures=1, policy=pol).requeue
    assert not decide_after_failure(err, attempts=2, oom_count=0, other_failures=2, policy=pol).requeue


def test_job_record_transitions_are_checked_and_logged():
    r = JobRecord("j1", "train", submit_time=0.0)
    r.transition(JobState.RUNNING, 5.0)
    r.transition(JobState.QUEUED, 6.0, "OOM")
    r.transition(JobState.RUNNING, 9.0)
    r.transition(JobState.SUCCEEDED, 20.0)
    assert r.attempts == 2 and r.start_time == 5.0 and r.end_time == 20.0 and r.done
    assert [h[2] for h in r.history] == ["running", "queued", "running", "succeeded"]
    with pytest.raises(IllegalTransition):
        r.transition(JobState.RUNNING, 21.0)
    assert r.to_dict()["state"] == "succeeded"


def test_a_hold_picks_the_gpus_expected_to_drain_first():
    # Both nodes are equally full; n1's residents are expected to end sooner.
    nodes = {"n0": node("n0", 30000, 30000), "n1": node("n1", 30000, 30000)}
    head = job("big", 1, need=20000, gpus=2, waiting_since_s=NOW - 4000)
    ends = {"n0-r0": NOW + 900, "n0-r1": NOW + 5000, "n1-r0": NOW + 600, "n1-r1": NOW + 1200}
    p = plan_cycle([head], ClusterIndex.from_snapshots(nodes), PlacementConfig(policy="magm"),
                   QueueConfig(strict_fifo=False, head_wait_limit_s=3600), NOW, expected_end=ends)
    assert p.holds == {"big": (("n1", (0, 1)),)}


def test_runtime_history_learns_the_mean_of_recent_runs():
    from hier_sched.core.runtimes import RuntimeHistory

    h = RuntimeHistory(keep=2)
    h.run_started("j0", "resnet", 100.0)
    assert h.expected("resnet") is None and h.expected_end == {}
    for seconds in (100.0, 300.0, 500.0):
        h.job_succeeded("resnet", seconds, oom_crashes=0)
    h.job_succeeded("resnet", 9000.0, oom_crashes=1)  # started over after an OOM: not its run time
    assert h.expected("resnet") == 400.0  # only the last two clean runs count
    h.run_started("j1", "resnet", 1000.0, executed_before_s=150.0)
    assert h.expected_end == {"j1": 1250.0}
    h.run_ended("j1")
    assert h.expected_end == {}
    with pytest.raises(ValueError, match="positive"):
        h.observe("resnet", 0.0)


def test_gangs_first_puts_multi_gpu_jobs_ahead_of_earlier_single_gpu_jobs():
    nodes = {"n0": node("n0", 0, 0)}
    queue = [job("single", 1, need=30000), job("gang", 2, need=30000, gpus=2)]
    assert [q.job_id for q, _ in plan(queue, nodes, strict_fifo=False).placements] == ["single"]
    p = plan(queue, nodes, strict_fifo=False, gangs_first=True)
    assert [q.job_id for q, _ in p.placements] == ["gang"] and p.head == "single"
