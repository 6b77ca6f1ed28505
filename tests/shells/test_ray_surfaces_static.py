"""What Ray's views show of the scheduler's actors, checked on the classes (no cluster): polled
methods record no task events, so Ray's task list keeps the jobs; each actor has a Repr."""

from __future__ import annotations

import pytest

from global_queue.actor import GlobalQueue
from node_actor.actor import NodeActor

POLLED = {NodeActor: ("exchange", "summary", "address", "gpu_totals", "gpu_types", "read_log"),
          GlobalQueue: ("status", "states", "history", "result", "read_log", "cluster", "settings", "observe_nodes")}
AUDITED = {NodeActor: ("stop", "signal_checkpoint", "shutdown"),  # (launch orders ride on exchange)
           GlobalQueue: ("submit", "cancel", "checkpoint", "drain", "stop")}


@pytest.mark.parametrize("actor", [NodeActor, GlobalQueue], ids=lambda a: a.__ray_actor_class__.__name__)
def test_polled_methods_record_no_task_events_and_the_rest_do(actor):
    cls = actor.__ray_actor_class__
    assert all(getattr(cls, m).__ray_enable_task_events__ is False for m in POLLED[actor])
    assert not any(hasattr(getattr(cls, m), "__ray_enable_task_events__") for m in AUDITED[actor])


def test_each_actor_describes_itself():
    node = object.__new__(NodeActor.__ray_actor_class__)
    node._label = "node0: 2x A100-40GB emulated, sharing mps, policy magm"
    assert repr(node) == "NodeActor(node0: 2x A100-40GB emulated, sharing mps, policy magm)"
    queue = object.__new__(GlobalQueue.__ray_actor_class__)
    queue._label = "2 node(s)"
    assert repr(queue) == "GlobalQueue(2 node(s))"


def test_command_drivers_use_a_namespace_ray_keeps_off_its_job_lists():
    from ray._raylet import RAY_INTERNAL_NAMESPACE_PREFIX

    from hier_sched.front.connection import COMMAND_NAMESPACE

    assert COMMAND_NAMESPACE.startswith(RAY_INTERNAL_NAMESPACE_PREFIX)
