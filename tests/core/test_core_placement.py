"""Every decision rule and gate of the placement core."""

import pytest

from hier_sched.core.gpu import GpuState, Risk, SharingMode
from hier_sched.core.placement import PlacementConfig, PlacementRequest, UtilGate, node_room, place_on_node
from hier_sched.core.policies import policy

TOTAL = 40536.0


def gpu(i, used=0.0, jobs=(), smact=0.0, smocc=0.0, drama=0.0, launched=None, sharing=SharingMode.MPS, pending=0.0):
    return GpuState(
        node="n0", index=i, memory_total_mib=TOTAL, memory_used_mib=used, risk=Risk(smact, smocc, drama),
        resident_jobs=tuple(jobs), last_launch_s=launched, sharing=sharing, pending_mib=pending,
    )


def busy(i, used, smact=0.3, **kw):
    return gpu(i, used=used, jobs=(f"j{i}",), smact=smact, **kw)


NOW = 1000.0


def place(req, gpus, **cfg):
    return place_on_node(req, gpus, PlacementConfig(**cfg), NOW)


def test_exclusive_first_takes_the_first_idle_gpu_for_every_policy():
    gpus = [busy(0, 10000), gpu(1), gpu(2)]
    for name in ("magm", "lug", "first-fit", "best-fit", "round-robin", "exclusive"):
        v = place(PlacementRequest("a", need_mib=1000), gpus, policy=name)
        assert v.gpus == (1,) and v.exclusive, name


def test_exclusive_policy_waits_when_no_gpu_is_idle():
    v = place(PlacementRequest("a", need_mib=100), [busy(0, 1000), busy(1, 1000)], policy="exclusive")
    assert not v.placed
    assert "idle" in v.reasons[0]


def test_magm_picks_most_free_memory_and_best_fit_the_least():
    gpus = [busy(0, 20000), busy(1, 5000), busy(2, 12000)]
    assert place(PlacementRequest("a", need_mib=4000), gpus, policy="magm").gpus == (1,)
    assert place(PlacementRequest("a", need_mib=4000), gpus, policy="best-fit").gpus == (0,)
    assert place(PlacementRequest("a", need_mib=4000), gpus, policy="first-fit").gpus == (0,)


def test_lug_picks_lowest_smact_risk():
    gpus = [busy(0, 5000, smact=0.6), busy(1, 20000, smact=0.1), busy(2, 1000, smact=0.4)]
    assert place(PlacementRequest("a", need_mib=4000), gpus, policy="lug").gpus == (1,)


def test_memory_gate_uses_estimate_plus_margin_and_free_reserve():
    # free = 40536 - used; usable = free - 512; needs estimate + 2048
    need = 10000.0
    used_ok = TOTAL - (need + 2048 + 512)
    assert place(PlacementRequest("a", need_mib=need), [busy(0, used_ok)]).gpus == (0,)
    v = place(PlacementRequest("a", need_mib=need), [busy(0, used_ok + 1)])
    assert not v.placed and v.reasons[1] == "gpu0: 11.8 GiB usable < 11.8 GiB needed"


def test_no_estimate_needs_fixed_5120():
    used_ok = TOTAL - 5120 - 512
    assert place(PlacementRequest("a"), [busy(0, used_ok)]).placed
    assert not place(PlacementRequest("a"), [busy(0, used_ok + 1)]).placed


def test_margins_are_configurable():
    used = TOTAL - 1000 - 100 - 512
    assert not place(PlacementRequest("a", need_mib=1000), [busy(0, used)]).placed
    assert place(PlacementRequest("a", need_mib=1000), [busy(0, used)], margin_mib=100).placed


def test_pending_reservations_count_as_used():
    assert not place(PlacementRequest("a", need_mib=10000), [busy(0, 10000, pending=20000)]).placed


@pytest.mark.parametrize(
    "smact,smocc,drama,blocked",
    [(0.85, 0.5, 0.1, True), (0.85, 0.1, 0.45, True), (0.85, 0.1, 0.1, False), (0.79, 0.9, 0.9, False)],
)
def test_utilization_gate_thesis_rule(smact, smocc, drama, blocked):
    assert UtilGate().blocks(Risk(smact, smocc, drama)) is blocked
    v = place(PlacementRequest("a", need_mib=100), [busy(0, 1000, smact=smact, smocc=smocc, drama=drama)])
    assert v.placed is not blocked


def test_utilization_gate_thresholds_are_parameters():
    g = [busy(0, 1000, smact=0.55, smocc=0.25)]
    assert place(PlacementRequest("a", need_mib=100), g).placed
    assert not place(PlacementRequest("a", need_mib=100), g, util_gate=UtilGate(0.5, 0.2, 0.4)).placed


def test_round_robin_ignores_gates_and_cycles():
    gpus = [busy(0, 39000, smact=0.95, smocc=0.9), busy(1, 39000), busy(2, 39000)]
    cfg = PlacementConfig(policy="round-robin")
    v1 = place_on_node(PlacementRequest("a", need_mib=5000), gpus, cfg, NOW, rr_cursor=0)
    v2 = place_on_node(PlacementRequest("b", need_mib=5000), gpus, cfg, NOW, rr_cursor=v1.next_rr_cursor)
    assert v1.gpus == (0,) and v2.gpus == (1,)


def test_post_launch_grace_hides_a_gpu_for_30_s():
    g = [busy(0, 1000, launched=NOW - 10)]
    v = place(PlacementRequest("a", need_mib=100), g)
    assert not v.placed and any("grace" in r for r in v.reasons)
    assert place(PlacementRequest("a", need_mib=100), [busy(0, 1000, launched=NOW - 30)]).placed
    assert place(PlacementRequest("a", need_mib=100), g, launch_grace_s=5).placed


def test_a_nodes_room_holds_until_the_first_of_its_gpus_in_grace_leaves_it():
    cfg = PlacementConfig(launch_grace_s=30.0)
    room = node_room([busy(0, 1000, launched=NOW - 10), busy(1, 1000, launched=NOW - 25), gpu(2)], cfg, NOW)
    assert room.idle == 1 and len(room.open_free) == 1  # the two GPUs in grace are left out
    assert room.holds_at(NOW + 4.9, cfg)
    assert not room.holds_at(NOW + 5.0, cfg)  # GPU 1 (launched 25 s ago) leaves its grace: more room
    assert not room.holds_at(NOW - 1.0, cfg)  # measured later than that
    assert node_room([gpu(0), busy(1, 1000)], cfg, NOW).holds_at(NOW + 1e6, cfg)  # none in grace: until a change


def test_multi_gpu_job_takes_k_gpus_that_all_pass():
    gpus = [busy(0, 30000), busy(1, 1000), busy(2, 2000), busy(3, 3000)]
    v = place(PlacementRequest("a", gpus=2, need_mib=8000), gpus, policy="magm")
    assert v.gpus == (1, 2)
    v = place(PlacementRequest("a", gpus=4, need_mib=8000), gpus)
    assert not v.placed and "3/4" in v.reasons[0]


def test_exclusive_request_overrides_policy():
    gpus = [busy(0, 100), gpu(1)]
    assert place(PlacementRequest("a", need_mib=100, exclusive=True), gpus, exclusive_first=False).gpus == (1,)
    assert not place(PlacementRequest("a", need_mib=100, exclusive=True), [busy(0, 100)]).placed


def test_without_exclusive_first_collocation_may_beat_idle():
    gpus = [busy(0, 1000), gpu(1)]
    v = place(PlacementRequest("a", need_mib=1000), gpus, policy="best-fit", exclusive_first=False)
    assert v.gpus == (0,) and not v.exclusive


def test_recovery_min_free_replaces_margin_and_gates_round_robin_too():
    g = [busy(0, TOTAL - 15000)]  # usable free 14488
    assert place(PlacementRequest("a", need_mib=2000, min_free_mib=14000), g).placed
    assert not place(PlacementRequest("a", need_mib=2000, min_free_mib=15000), g).placed
    assert not place(PlacementRequest("a", need_mib=2000, min_free_mib=15000), g, policy="round-robin").placed


@pytest.mark.parametrize("mode", [SharingMode.MIG, SharingMode.NONE])
def test_mig_and_none_never_collocate(mode):
    v = place(PlacementRequest("a", need_mib=10), [busy(0, 100, sharing=mode)])
    assert not v.placed and mode.value in v.reasons[1]


def test_max_jobs_per_gpu():
    g = [gpu(0, used=100, jobs=("a", "b"))]
    assert not place(PlacementRequest("c", need_mib=10), g, max_jobs_per_gpu=2).placed


def test_smact_budget_uses_utilization_estimate():
    g = [busy(0, 100, smact=0.6)]
    assert place(PlacementRequest("a", need_mib=10, smact=0.5), g).placed
    assert not place(PlacementRequest("a", need_mib=10, smact=0.5), g, smact_budget=0.75).placed
    assert place(PlacementRequest("a", need_mib=10, smact=None), g, smact_budget=0.75).placed


def test_unknown_policy_and_bad_config_are_named():
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        policy("fastest")
    with pytest.raises(ValueError, match="margin_mib"):
        PlacementConfig(margin_mib=-1)
    assert policy("worst-fit").name == "magm" and policy("rr").name == "round-robin"


def test_with_job_keeps_every_other_field():
    g = GpuState(node="n", index=3, memory_total_mib=10.0, memory_used_mib=2.0, gpu_type="T4", uuid="u",
                 risk=Risk(0.1, 0.2, 0.3), power_w=9.0, resident_jobs=("a",), multi_gpu_jobs=1,
                 sharing=SharingMode.STREAMS, mig_profile="1g.5gb", last_launch_s=1.0, pending_mib=4.0)
    h = g.with_job("b", 3.0, 7.0)
    assert h.resident_jobs == ("a", "b") and h.pending_mib == 7.0 and h.last_launch_s == 7.0
    for name in ("node", "index", "memory_total_mib", "memory_used_mib", "gpu_type", "uuid", "risk", "power_w",
                 "multi_gpu_jobs", "sharing", "mig_profile"):
        assert getattr(h, name) == getattr(g, name), name
