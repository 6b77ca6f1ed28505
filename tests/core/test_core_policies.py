"""Placement policies, each registered once (core.policies): names, aliases and what they decide."""

from __future__ import annotations

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState, Risk
from hier_sched.core.placement import PlacementConfig, PlacementRequest, place_on_node
from hier_sched.core.policies import ALIASES, POLICIES, Policy, policy, register
from hier_sched.core.presets import PRESET_NAMES, preset
from hier_sched.core.queueing import QueueConfig, QueuedJob, plan_cycle

TOTAL = 40536.0


def gpu(node, i, used, smact=0.3):
    return GpuState(node=node, index=i, memory_total_mib=TOTAL, memory_used_mib=used, risk=Risk(smact, 0.1, 0.1),
                    resident_jobs=(f"{node}-j{i}",) if used else ())


def test_every_alias_resolves_to_its_registered_policy_everywhere():
    for alias, name in ALIASES.items():
        assert policy(alias) is POLICIES[name]
        assert PlacementConfig(policy=alias).policy == name and PlacementConfig(policy=alias).rules is POLICIES[name]
        assert preset(alias).name == name
    assert PRESET_NAMES == ("auto", *POLICIES)


def test_a_hand_built_config_with_an_alias_behaves_like_the_policy_it_names():
    # Round-robin has no memory gate: a GPU without room for the estimate still takes the job.
    # "rr" must do the same on a node (placement) and when the planner picks nodes (cluster view).
    nodes = {"n0": [gpu("n0", 0, 39000), gpu("n0", 1, 38000)], "n1": [gpu("n1", 0, 30000), gpu("n1", 1, 37000)]}
    req = PlacementRequest("a", need_mib=20000)
    for name in ("rr", "round-robin"):
        cfg = PlacementConfig(policy=name)
        assert place_on_node(req, nodes["n0"], cfg, 1000.0).gpus == (0,), name
        assert ClusterIndex.from_snapshots(nodes).candidates(req, cfg) == ["n1", "n0"], name
        plan = plan_cycle([QueuedJob("a", 0.0, need_mib=20000)], ClusterIndex.from_snapshots(nodes), cfg,
                          QueueConfig(), 1000.0)
        assert [(q.job_id, p[0].node) for q, p in plan.placements] == [("a", "n1")], name
    magm = PlacementConfig(policy="worst-fit")
    assert not place_on_node(req, nodes["n0"], magm, 1000.0).placed  # the memory gate holds


def test_node_order_and_gpu_ranking_come_from_the_policy():
    nodes = {"n0": [gpu("n0", 0, 10000)], "n1": [gpu("n1", 0, 30000)], "n2": [gpu("n2", 0, 20000)]}
    req = PlacementRequest("a", need_mib=1000)
    order = {name: ClusterIndex.from_snapshots(nodes).candidates(req, PlacementConfig(policy=name))
             for name in ("first-fit", "best-fit", "magm")}
    assert order == {"first-fit": ["n0", "n1", "n2"], "best-fit": ["n1", "n2", "n0"], "magm": ["n0", "n2", "n1"]}
    lug = [gpu("n0", 0, 5000, smact=0.6), gpu("n0", 1, 20000, smact=0.1)]
    assert place_on_node(req, lug, PlacementConfig(policy="lug"), 1000.0).gpus == (1,)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered: rr"):
        register(Policy("spin", ("rr",)))
    assert "spin" not in POLICIES
