"""What a job's Ray task asks Ray for (``launch_plan._ray_resources``): its share of ``GPU`` and
its per-GPU MiB, named per node, both capped by what is still unbooked; so ``ray status`` and the
dashboard show the scheduler's reservations, and Ray never keeps a placed job waiting."""

from __future__ import annotations

import re

import pytest

from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.core.events import Launch
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.spec import parse_spec
from node_actor.launch_plan import NodeFacts, plan_launch
from node_actor.launcher import NODE_RESOURCE_PREFIX, RunFiles, gpu_resource

TOTAL = 40000.0


def _resources(tmp_path, gpus, reserved, *, exclusive=False, booked=None):
    placement = Placement("j-1", "node1", tuple(gpus), reserved, exclusive)
    launch = Launch("j-1", 1, (placement,), None, PlacementRequest("j-1", len(gpus), reserved))
    facts = NodeFacts("node1", [f"GPU-{i}" for i in range(4)], [TOTAL] * 4, booked or {}, 5120.0)
    spec = LaunchSpec.of(parse_spec({"name": "x", "command": ["true"]}))
    return plan_launch(LaunchOrder(launch, 0, spec), RunFiles(str(tmp_path), 1), facts).resources


@pytest.mark.parametrize("gpus, reserved, exclusive, booked, expected", [
    ((0,), 10000.0, False, {}, {"GPU": 0.25, "hs_node1_gpu0_mem_mib": 10000.0}),  # its share of one GPU
    ((0, 2), 10000.0, False, {}, {"GPU": 0.5, "hs_node1_gpu0_mem_mib": 10000.0, "hs_node1_gpu2_mem_mib": 10000.0}),
    ((1,), 10000.0, True, {}, {"GPU": 0.25, "hs_node1_gpu1_mem_mib": 10000.0}),  # idle GPUs only: others may join
    ((0,), 10000.0, False, {0: 36000.0}, {"GPU": 0.1, "hs_node1_gpu0_mem_mib": 4000.0}),  # capped by unbooked
    ((0,), 10000.0, False, {0: 30000.0}, {"GPU": 0.25, "hs_node1_gpu0_mem_mib": 10000.0}),  # fills it exactly
    ((0,), 1.0 / 3, False, {}, {}),  # below Ray's units: nothing asked rather than too much
    ((0,), 13333.0, False, {}, {"GPU": 0.3333, "hs_node1_gpu0_mem_mib": 13333.0}),  # rounded down
])
def test_the_task_asks_for_its_reservations_share(tmp_path, gpus, reserved, exclusive, booked, expected):
    assert _resources(tmp_path, gpus, reserved, exclusive=exclusive, booked=booked) == expected


def test_per_gpu_resources_are_never_taken_for_a_node_name():
    """``deploy.ray_nodes`` names nodes by their ``hs_node_<name>`` resource only."""
    assert not gpu_resource("node0", 1).startswith(NODE_RESOURCE_PREFIX)
    assert re.fullmatch(r"hs_node0_gpu1_mem_mib", gpu_resource("node0", 1))
