"""``up --autoscale``'s set-up without starting Ray: the node type Ray's autoscaler is given, what the
queue's admission counts on, and the refused combinations."""

from __future__ import annotations

import pytest

from hier_sched.core.demand import autoscaler_demand, nodes_to_release
from hier_sched.front.autoscaling import GPU_TYPE_LABEL, WORKER_TYPE, autoscaling_config, worker_node_types
from hier_sched.front.local_cluster import ClusterConfig


def elastic(**fields) -> ClusterConfig:
    return ClusterConfig(node_specs=(("H100-80GB", 2),), autoscale=(0, 3), idle_timeout_s=20, **fields)


def test_the_autoscaler_gets_one_worker_type_of_the_gpus_asked_for_and_a_gpu_less_head():
    config = autoscaling_config(elastic(), "127.0.0.1:6379")
    head, worker = (config["available_node_types"][k] for k in (config["head_node_type"], WORKER_TYPE))
    assert "GPU" not in head["resources"] and head["max_workers"] == 0
    assert worker["resources"]["GPU"] == 2 and worker["labels"] == {GPU_TYPE_LABEL: "H100-80GB"}
    assert (worker["min_workers"], worker["max_workers"], config["max_workers"]) == (0, 3, 3)
    assert config["idle_timeout_minutes"] == pytest.approx(20 / 60)
    assert config["provider"]["gcs_address"] == "127.0.0.1:6379"
    assert worker_node_types(elastic()) == [{"name": WORKER_TYPE, "gpu_type": "H100-80GB", "gpus": 2, "max_count": 3}]


@pytest.mark.parametrize("fields, message", [
    ({"autoscale": (2, 1)}, "0 <= MIN <= MAX"),
    ({"autoscale": (0, 0)}, "MAX >= 1"),
    ({"autoscale": (0, 2), "address": "10.0.0.1:6379"}, "not with --address"),
    ({"autoscale": (0, 2), "backend": "nvml"}, "real-GPU backend"),
    ({"autoscale": (0, 2), "idle_timeout_s": 0}, "--idle-timeout-s must be > 0"),
])
def test_bad_autoscale_settings_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        ClusterConfig(**{"node_specs": (("A100-40GB", 2),), **fields})


def test_demand_is_the_union_of_what_runs_and_what_waits_shaped_like_nodes():
    assert autoscaler_demand([(2, 2, ()), (1, 1, ())], {"a": 2, "b": 0}) == [({"GPU": 2.0}, ())] * 3 + [({"GPU": 1.0}, ())]
    assert autoscaler_demand([], {}) == []


def test_a_job_restricted_to_gpu_types_asks_for_nodes_of_those_types_by_their_label():
    from hier_sched.core.events import JobTicket, Submitted
    from hier_sched.core.presets import preset
    from hier_sched.core.scheduler import Scheduler
    from hier_sched.front.node_watcher import type_selector

    s = Scheduler(preset("auto"))
    nodes = {f"{kind}#{k}": kind for kind in ("A100-40GB", "H100-80GB", "H100-NVL") for k in range(2)}
    s.allow_autoscaled({n: (90000.0,) * 2 for n in nodes}, nodes)  # (each type's GPU size aside)
    s.apply([Submitted(JobTicket("any", "any", gpus=2, need_mib=4000.0)),
             Submitted(JobTicket("h100", "h100", gpus=4, gpus_per_node=2, need_mib=4000.0, gpu_types=("H100*",)))], 0.0)
    demand = autoscaler_demand(s.waiting_shapes(), {})
    assert demand == [({"GPU": 2.0}, ()), ({"GPU": 2.0}, ("H100-80GB", "H100-NVL")),
                      ({"GPU": 2.0}, ("H100-80GB", "H100-NVL"))]
    assert [type_selector(list(t)) for _, t in demand] == [{}] + [{"hier-sched/gpu-type": "in(H100-80GB,H100-NVL)"}] * 2
    assert type_selector(["A100-40GB"]) == {"hier-sched/gpu-type": "A100-40GB"}


def test_a_node_is_released_after_its_idle_wait_and_only_while_nothing_waits():
    idle: dict[str, float] = {}
    assert nodes_to_release(idle, ["a", "b"], ["b"], 0.0, 5.0, jobs_wait=False) == []
    assert nodes_to_release(idle, ["a", "b"], [], 5.0, 5.0, jobs_wait=True) == []  # b idle since 5.0 now
    assert nodes_to_release(idle, ["a", "b"], [], 6.0, 5.0, jobs_wait=False) == ["a"]
    assert nodes_to_release(idle, ["a", "b"], ["a"], 11.0, 5.0, jobs_wait=False) == ["b"]  # a busy again
