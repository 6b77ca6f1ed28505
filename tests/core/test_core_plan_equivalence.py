"""The planner's shortcuts change nothing: ``plan_cycle`` against a plain reference model.

``plan_cycle`` keeps its cost to what a cycle decides (a pre-sorted queue, a loop that stops at
the backfill depth, node rooms learnt once per cycle and memoised across cycles, refusal words
formatted on demand, failed shapes kept per kind). ``reference_plan`` below is the same rule
written the plain way — sort the queue, look at every job, ask every candidate node with
``place_on_node``, keep every failed shape — and on random clusters, queues and configurations
both must place the same jobs on the same GPUs, hold the same GPUs, leave the same head, and
give every waiting job the same words. The Scheduler's own sorted queue is checked against
``queue_order`` through a random event history.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.cycle_view import CycleView
from hier_sched.core.events import JobTicket, LaunchDeclined, NodeJoined, RunEnded, Submitted, CancelRequested
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState, Placement, Risk, SharingMode
from hier_sched.core.placement import PlacementConfig, memory_requirement, place_on_node
from hier_sched.core.policies import POLICIES
from hier_sched.core.queueing import (
    QueueConfig, QueuedJob, _gpus_to_hold, held_reason, placement_request, plan_cycle, queue_order,
)
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.scheduler_config import SchedulerConfig
from hier_sched.core.units import gib

EXAMPLES = int(os.environ.get("HIER_SCHED_FUZZ_EXAMPLES", "0")) or None  # see tests/system/test_fuzz_inputs.py
TOTAL = 40536.0


def reference_plan(queue, cluster, cfg, qcfg, now_s, rr_cursor=0, expected_end=None):
    """The rule of ``plan_cycle``, without its shortcuts: (placements, waiting, holds, head, cursor)."""
    view = CycleView(cluster)
    placements, waiting, holds, head, head_since = [], {}, {}, None, None
    looked_past_head, failed = 0, []
    for job in queue_order(queue, qcfg.gangs_first):
        if head_since is not None:
            if qcfg.strict_fifo:
                waiting[job.job_id] = ("behind the head of the queue",)
                continue
            looked_past_head += 1
            if looked_past_head > qcfg.backfill_depth:
                waiting[job.job_id] = ("beyond the backfill depth",)
                continue
        req = placement_request(job, cluster.gpu_total_mib, qcfg)
        need_free, _ = memory_requirement(req, cfg)
        shape = (job.nodes, req.gpus, need_free, req.exclusive)
        if any(s[0] <= shape[0] and s[1] <= shape[1] and s[2] <= shape[2] and (s[3] or not shape[3]) for s in failed):
            waiting[job.job_id] = ("a smaller job of the same kind could not start this cycle",)
        else:
            chosen, reasons, rr_cursor = _reference_place(job, req, view, cfg, now_s, rr_cursor, qcfg)
            if chosen:
                for p in chosen:
                    view.reserve(p, now_s)
                placements.append((job.job_id, tuple((p.node, p.gpus, p.reserved_mib, p.reason) for p in chosen)))
                continue
            failed.append(shape)
            waiting[job.job_id] = reasons
        if head_since is None:
            head = job.job_id
            head_since = job.waiting_since_s if job.waiting_since_s is not None else now_s
            if not qcfg.strict_fifo and now_s - head_since >= qcfg.head_wait_limit_s:
                hold = job.held or _gpus_to_hold(job, view, expected_end or {})
                view.hold(hold, job.job_id, now_s)
                holds[job.job_id] = hold
                waiting[job.job_id] += (held_reason(hold),)
    return placements, waiting, holds, head, rr_cursor


def _reference_place(job, req, view, cfg, now_s, cursor, qcfg):
    chosen, start = [], cursor
    need_free, _ = memory_requirement(req, cfg)
    wanted = "idle GPU(s)" if req.exclusive else f"GPU(s) with {gib(need_free)} usable"
    last = (f"no node has {req.gpus} {wanted}",)
    for name in view.cluster.candidates(req, cfg, limit=qcfg.nodes_tried):
        verdict = place_on_node(req, view.gpus(name), cfg, now_s, cursor)
        if not verdict.placed:
            last = (f"{name}: " + "; ".join(verdict.reasons),)
            continue
        cursor = verdict.next_rr_cursor
        chosen.append(Placement(job.job_id, name, verdict.gpus, verdict.reserved_mib, verdict.exclusive, cfg.policy,
                                verdict.reasons[0]))
        if len(chosen) == job.nodes:
            return tuple(chosen), (), cursor
    if chosen:
        return (), (f"gang: {len(chosen)}/{job.nodes} nodes available",) + last, start
    return (), last, start


NOW = 10_000.0
# Memory on a coarse grid, so that exact fits (free memory == estimate + margin + reserve) are common.
NEEDS = (1000.0, 5000.0, 9000.0, 17000.0, 25000.0)
USED = tuple(TOTAL - 512.0 - 2048.0 - n for n in NEEDS) + (0.0, 20000.0, TOTAL - 100)


@st.composite
def clusters(draw, most_nodes=6):
    sharing = draw(st.sampled_from([SharingMode.MPS, SharingMode.MPS, SharingMode.STREAMS, SharingMode.NONE]))
    nodes = {}
    for n in range(draw(st.integers(1, most_nodes))):
        gpus = []
        for i in range(draw(st.integers(1, 4))):
            residents = tuple(f"r{n}.{i}.{k}" for k in range(draw(st.integers(0, 3))))
            used = draw(st.one_of(st.sampled_from(USED), st.sampled_from(USED), st.floats(0, TOTAL))) if residents else 0.0
            risk = Risk(*(draw(st.floats(0, 1)) for _ in range(3))) if residents else Risk()
            launched = draw(st.one_of(st.none(), st.floats(NOW - 100, NOW)))
            gpus.append(GpuState(f"n{n}", i, TOTAL, used, risk=risk, resident_jobs=residents,
                                 multi_gpu_jobs=draw(st.integers(0, 1)), sharing=sharing, last_launch_s=launched,
                                 pending_mib=draw(st.sampled_from([0.0, 0.0, 4000.0]))))
        nodes[f"n{n}"] = gpus
    index = ClusterIndex.from_snapshots(nodes)
    index.sharing = sharing
    return index


@st.composite
def queues(draw):
    jobs = []
    for j in range(draw(st.integers(0, 30))):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8]))
        per_node = draw(st.one_of(st.none(), st.sampled_from([d for d in (1, 2, 4) if gpus % d == 0 and d < gpus] or [None])))
        oom = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
        jobs.append(QueuedJob(
            f"j{j}", draw(st.floats(0, NOW)), gpus=gpus, gpus_per_node=per_node,
            need_mib=draw(st.one_of(st.none(), st.sampled_from(NEEDS), st.sampled_from(NEEDS), st.floats(100, 45000))), smact=draw(st.one_of(st.none(), st.floats(0, 1))),
            priority=draw(st.sampled_from([0, 0, 1])), seq=j, oom_count=oom,
            observed_peak_mib=draw(st.floats(100, 45000)) if oom else None, exclusive=draw(st.booleans()) and j % 5 == 0,
            waiting_since_s=draw(st.one_of(st.none(), st.floats(0, NOW))),
        ))
    return jobs


configs = st.builds(
    lambda policy, budget, spare, first: PlacementConfig(policy=policy, smact_budget=budget, spare_multi_gpu_jobs=spare,
                                                         exclusive_first=first),
    st.sampled_from(sorted(POLICIES)), st.sampled_from([None, 1.2]), st.booleans(), st.booleans(),
)
queue_configs = st.builds(
    QueueConfig, strict_fifo=st.booleans(), head_wait_limit_s=st.sampled_from([0.0, 3600.0, 1e9]),
    backfill_depth=st.integers(0, 8), nodes_tried=st.integers(1, 6), gangs_first=st.booleans(),
)


def _as_reference(plan):
    placements = [(q.job_id, tuple((p.node, p.gpus, p.reserved_mib, p.reason) for p in ps)) for q, ps in plan.placements]
    return placements, dict(plan.waiting.items()), plan.holds, plan.head, plan.rr_cursor


@settings(max_examples=EXAMPLES or 150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), queues(), configs, queue_configs, st.integers(0, 7))
def test_plan_cycle_matches_the_reference_model(cluster, queue, cfg, qcfg, rr_cursor):
    expected = reference_plan(queue, cluster, cfg, qcfg, NOW, rr_cursor, {})
    assert _as_reference(plan_cycle(queue, cluster, cfg, qcfg, NOW, rr_cursor=rr_cursor)) == expected
    ordered = queue_order(queue, qcfg.gangs_first)  # as a queue owner passes it; the rooms memoised just now
    assert _as_reference(plan_cycle(ordered, cluster, cfg, qcfg, NOW, rr_cursor=rr_cursor, ordered=True)) == expected


# Wider clusters, deeper backfilling and more candidates per job than ``queue_configs``.
wide_queue_configs = st.builds(
    QueueConfig, strict_fifo=st.booleans(), head_wait_limit_s=st.sampled_from([0.0, 1e9]),
    backfill_depth=st.integers(0, 30), nodes_tried=st.integers(1, 40), gangs_first=st.booleans(),
)


@settings(max_examples=EXAMPLES or 60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(most_nodes=40), queues(), configs, wide_queue_configs, st.sampled_from([0.0, 10.0, 29.0, 31.0, 95.0]))
def test_rooms_kept_from_an_earlier_cycle_are_used_only_while_they_hold(cluster, queue, cfg, qcfg, later):
    """A cycle at ``NOW`` keeps the rooms it measured; a cycle ``later`` on the same snapshots
    (GPUs leave their post-launch grace meanwhile) places as the reference model does then."""
    plan_cycle(queue, cluster, cfg, qcfg, NOW)
    expected = reference_plan(queue, cluster, cfg, qcfg, NOW + later, 0, {})
    assert _as_reference(plan_cycle(queue, cluster, cfg, qcfg, NOW + later)) == expected


def test_a_memoised_room_is_not_used_once_a_gpu_left_its_grace():
    """Same snapshot objects, later clock: a GPU out of its post-launch grace is offered again."""
    gpus = [GpuState("n0", 0, TOTAL, 0.0, last_launch_s=NOW - 10)]
    cluster = ClusterIndex.from_snapshots({"n0": gpus})
    cfg, qcfg = PlacementConfig(policy="magm"), QueueConfig()
    first = plan_cycle([QueuedJob("a", 0.0, need_mib=1000.0)], cluster, cfg, qcfg, NOW)
    assert first.placements == [] and "grace" in first.waiting["a"][0]
    later = plan_cycle([QueuedJob("a", 0.0, need_mib=1000.0)], cluster, cfg, qcfg, NOW + 60)
    assert [q.job_id for q, _ in later.placements] == ["a"]


def test_a_memoised_room_is_not_used_once_the_shell_says_the_node_changed():
    """The index keeps a node's room until the shell reports new snapshots for it, whatever the
    objects: ``update`` from a shell that gathers reports, ``changed`` from one that builds them."""
    full = [GpuState("n0", 0, TOTAL, TOTAL - 100, resident_jobs=("x",))]
    empty = [GpuState("n0", 0, TOTAL, 0.0)]
    shown = {"n0": full}
    cluster = ClusterIndex([("n0", 1)], lambda n: list(shown[n]))
    cluster.update("n0", full)
    cfg, qcfg = PlacementConfig(policy="magm"), QueueConfig()
    job = QueuedJob("a", 0.0, need_mib=1000.0)
    assert plan_cycle([job], cluster, cfg, qcfg, NOW).placements == []
    shown["n0"] = empty
    cluster.update_gpu("n0", 0, TOTAL, idle_delta=1)
    assert [q.job_id for q, _ in plan_cycle([job], cluster, cfg, qcfg, NOW).placements] == ["a"]
    shown["n0"] = full
    cluster.update("n0", full)
    assert plan_cycle([job], cluster, cfg, qcfg, NOW).placements == []
    busy = [GpuState("n0", 0, TOTAL, 1000.0, resident_jobs=("x",), risk=Risk(0.95, 0.9, 0.9))]  # utilization gate
    shown["n0"] = busy
    cluster.update("n0", busy)
    assert plan_cycle([job], cluster, cfg, qcfg, NOW).placements == []
    shown["n0"] = [GpuState("n0", 0, TOTAL, 1000.0, resident_jobs=("x",), risk=Risk(0.3, 0.1, 0.1))]  # same memory
    cluster.changed("n0")
    assert [q.job_id for q, _ in plan_cycle([job], cluster, cfg, qcfg, NOW).placements] == ["a"]


def test_wait_reasons_cover_every_job_not_started_even_those_not_looked_at():
    gpus = {"n0": [GpuState("n0", 0, TOTAL, TOTAL - 100, resident_jobs=("x",))]}
    queue = [QueuedJob(f"j{i}", float(i), need_mib=1000.0, seq=i) for i in range(50)]
    plan = plan_cycle(queue, ClusterIndex.from_snapshots(gpus), PlacementConfig(), QueueConfig(strict_fifo=False,
                                                                                             backfill_depth=3), NOW)
    assert set(plan.waiting) == {j.job_id for j in queue} and len(plan.waiting) == 50
    assert plan.waiting["j2"] == ("a smaller job of the same kind could not start this cycle",)
    assert plan.waiting.get("j40") == ("beyond the backfill depth",) and plan.waiting.get("other") is None


_EVENTS = st.lists(st.tuples(st.sampled_from(["submit", "plan", "oom", "checkpoint", "finish", "decline", "cancel"]),
                             st.integers(0, 40), st.integers(1, 4), st.sampled_from([0, 0, 1]), st.floats(500, 30000)),
                   max_size=60)


@settings(max_examples=EXAMPLES or 200, deadline=None)
@given(_EVENTS, st.booleans(), st.booleans())
def test_the_schedulers_sorted_queue_is_the_queue_order(events, gangs_first, strict_fifo):
    """Submissions, launches, OOM requeues (to the front), checkpoint requeues (to the back),
    declines and cancels: the queue the Scheduler keeps sorted is always ``queue_order``, and
    the last plan's wait reasons (which read that queue for the jobs it did not look at) stay
    what they were when it was made."""
    config = SchedulerConfig(queue=QueueConfig(strict_fifo=strict_fifo, gangs_first=gangs_first, backfill_depth=2))
    sched = Scheduler(config)
    sched.apply([NodeJoined(f"n{i}", (TOTAL,) * 4) for i in range(2)], 0.0)
    nodes = {f"n{i}": [GpuState(f"n{i}", g, TOTAL, 0.0) for g in range(4)] for i in range(2)}
    # a queue longer than one cycle places (8 GPUs), so that plans leave jobs they did not look at
    sched.step([Submitted(JobTicket(f"j{k}", "w", gpus=1 + k % 4, need_mib=1000.0)) for k in range(0, 40, 3)], None, 0.0)
    now = 0.0
    reasons = {}
    for kind, k, gpus, priority, need in events:
        now += 10.0
        job_id = f"j{k}"
        job = sched.jobs.get(job_id)
        running = job is not None and job.record.state.value in ("running", "checkpointing")
        if kind == "submit":
            sched.step([Submitted(JobTicket(job_id, "w", gpus=gpus, need_mib=need, priority=priority))], None, now)
        elif kind == "plan":
            sched.step([], ClusterIndex.from_snapshots(nodes), now)
            reasons = dict(sched.job_queue.waiting.items())
            assert set(reasons) == set(sched.job_queue)
        elif running and kind in ("oom", "checkpoint", "finish"):
            failure = {"oom": Failure("oom", "boom"), "checkpoint": Failure("checkpoint_requeue", "ckpt"),
                       "finish": None}[kind]
            sched.step([RunEnded(job_id, job.record.attempts, failure, 1 if failure else 0)], None, now)
        elif running and kind == "decline":
            sched.step([LaunchDeclined(job_id, job.record.attempts, "no room")], None, now)
        elif kind == "cancel":
            sched.step([CancelRequested(job_id)], None, now)
        assert list(sched.job_queue.order) == queue_order(sched.job_queue.values(), gangs_first)
        assert dict(sched.job_queue.waiting.items()) == reasons and len(sched.job_queue.waiting) == len(reasons)
        assert all(sched.job_queue.waiting.get(job_id) == why for job_id, why in reasons.items())


@st.composite
def requests(draw):
    from hier_sched.core.placement import PlacementRequest

    need = draw(st.one_of(st.none(), st.sampled_from(NEEDS), st.floats(100, 45000)))
    min_free = draw(st.one_of(st.none(), st.none(), st.sampled_from([n + 2048.0 for n in NEEDS])))
    return PlacementRequest("x", draw(st.integers(1, 4)), need, draw(st.one_of(st.none(), st.floats(0, 1))),
                            exclusive=draw(st.booleans()), min_free_mib=min_free)


@settings(max_examples=EXAMPLES or 300, deadline=None)
@given(clusters(), requests(), configs, st.one_of(st.none(), st.integers(1, 4)))
def test_candidate_nodes_are_the_nodes_that_may_fit_in_policy_order(cluster, req, cfg, limit):
    """``ClusterIndex.candidates`` (ranked once per update, cut by bisection) against the rule
    written plainly: the nodes with ``req.gpus`` idle GPUs or ``req.gpus`` GPUs with the free
    memory asked for, sorted by (idle first, room, position)."""
    need_free = memory_requirement(req, cfg)[0] + cfg.free_reserve_mib
    exclusive = req.exclusive or cfg.policy == "exclusive"
    gated = cfg.policy != "round-robin" or req.min_free_mib is not None
    width = max(len(cluster.gpus(name)) for name in cluster.names)  # a job wider than every node: the widest's GPU
    expected = []
    for pos, name in enumerate(cluster.names):
        gpus = cluster.gpus(name)
        free = sorted((g.memory_free_mib for g in gpus), reverse=True) + [float("-inf")] * (width - len(gpus))
        kth = free[min(req.gpus, width) - 1]
        can_idle = sum(g.idle for g in gpus) >= req.gpus
        if not (can_idle or (not exclusive and (kth >= need_free if gated else kth > float("-inf")))):
            continue
        room = 0.0 if exclusive or cfg.policy == "first-fit" else kth if cfg.policy == "best-fit" else -kth
        expected.append(((cfg.exclusive_first or exclusive) and not can_idle, room, pos, name))
    expected = [name for *_, name in sorted(expected)][:limit]
    assert cluster.candidates(req, cfg, limit) == expected


@settings(max_examples=EXAMPLES or 300, deadline=None)
@given(clusters(), requests(), configs)
def test_a_node_room_never_rules_out_a_node_that_would_take_the_job(cluster, req, cfg):
    """``NodeRoom.may_fit`` is a bound: whenever ``place_on_node`` places a job on a node, the
    node's room says it may fit. The room ``assess_node`` finds with a refusal is the node's room."""
    from hier_sched.core.placement import assess_node, node_room
    from hier_sched.core.policies import policy

    pol = policy(cfg.policy)
    need_free, _ = memory_requirement(req, cfg)
    gated = need_free if pol.memory_gate or req.min_free_mib is not None else None
    collocate = pol.collocates and not req.exclusive
    for name in cluster.names:
        gpus = cluster.gpus(name)
        room = node_room(gpus, cfg, NOW)
        verdict, assessed = assess_node(req, gpus, cfg, NOW)
        assert verdict == place_on_node(req, gpus, cfg, NOW, explain=False)
        if verdict.placed:
            assert room.may_fit(req.gpus, gated, collocate)
        else:
            assert assessed == room


def test_kth_free_memory_stays_exact_while_rows_are_updated_a_few_at_a_time():
    """The index re-sorts only the rows updated since (large clusters) or every row (small
    clusters, many updates): either way each node's k-th freest GPU is the plain sort's."""
    import numpy as np

    rng = np.random.default_rng(0)
    for nodes, per_cycle in ((300, 3), (300, 60), (40, 3)):
        index = ClusterIndex([(f"n{i}", 4 if i % 3 else 8) for i in range(nodes)], lambda n: [])
        for _ in range(5):
            for row in rng.choice(nodes, per_cycle, replace=False).tolist():
                width = 4 if row % 3 else 8
                index.update_gpu(f"n{row}", int(rng.integers(width)), float(rng.uniform(0, TOTAL)))
            for k in range(1, 9):
                expected = [sorted(r, reverse=True)[k - 1] if k <= len(r) else -np.inf
                            for r in (index.free[i][index.free[i] > -np.inf].tolist() for i in range(nodes))]
                assert index._kth(k).tolist() == expected


def test_the_leading_candidates_carried_over_changes_are_those_ranked_afresh():
    """The planner's first candidates (``_leaders``), kept across updates and carried over the rows
    that changed, against the same index ranked from nothing, through GPU updates, idle changes,
    lost and closed nodes, on one GPU type and on two. Half the changes hit the rows leading now,
    as placements do, so that the rows kept run out and the ones behind them come forward."""
    import copy

    import numpy as np

    rng = np.random.default_rng(1)
    for nodes, per_change, typed in ((400, 3, False), (400, 40, False), (60, 5, True), (400, 2, True)):
        types = ["A100-40GB" if i % 4 else "H100-80GB" for i in range(nodes)] if typed else None
        index = ClusterIndex([(f"n{i}", 8) for i in range(nodes)], lambda n: [], gpu_types=types)
        closed: set[str] = set()
        leading: list[int] = []
        for cycle in range(80):
            rows = rng.choice(nodes, per_change, replace=False).tolist()
            rows += rng.choice(leading, min(per_change, len(leading)), replace=False).tolist() if leading else []
            for row in rows:
                what, free = rng.random(), float(rng.choice([0, 5000, 10000, 40000]))  # coarse: many ties
                if what < 0.03:
                    index.remove(f"n{row}")
                elif what < 0.06:
                    closed ^= {f"n{row}"}
                    index.close(closed)
                elif what < 0.5:  # the whole node
                    for gpu in range(8):
                        index.update_gpu(f"n{row}", gpu, free, idle_delta=0 if gpu else int(rng.integers(-1, 2)))
                else:
                    index.update_gpu(f"n{row}", int(rng.integers(8)), free, idle_delta=int(rng.integers(-1, 2)))
            afresh = copy.deepcopy(index)
            afresh._tops.clear()
            leading = []
            for k, limit in ((1, 2), (1, 8), (2, 2), (8, 8)):
                for gpu_type in ([None] if not typed else ["A100-40GB", "H100-80GB"]):
                    afresh._rankings.clear()
                    expected = afresh._leaders(k, limit, gpu_type)
                    afresh._tops.clear()
                    assert index._leaders(k, limit, gpu_type) == expected, (cycle, k, limit, gpu_type)
                    leading += expected[0] + expected[1]


def test_a_room_measured_with_an_assumed_run_goes_with_the_run():
    """A launch the node has not shown yet is counted on its GPUs (``assume``), and the room a
    cycle measures then is kept; once that run is forgotten (declined, or ended unshown), the node
    is offered as its snapshots show it again, not as the kept room remembered it."""
    gpus = [GpuState("n0", 0, TOTAL, 0.0)]
    cluster = ClusterIndex.from_snapshots({"n0": gpus})
    cfg, qcfg = PlacementConfig(policy="magm"), QueueConfig()
    cluster.assume(Placement("b", "n0", (0,), 1000.0, False, "magm", ""), 1, NOW - 10)  # (its GPU in grace)
    job = QueuedJob("a", 0.0, need_mib=5000.0)
    assert plan_cycle([job], cluster, cfg, qcfg, NOW).placements == []
    cluster.forget_assumed(set())
    assert [q.job_id for q, _ in plan_cycle([job], cluster, cfg, qcfg, NOW).placements] == ["a"]
