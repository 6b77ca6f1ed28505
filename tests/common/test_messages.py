"""The queue's and the nodes' messages are plain typed data: each goes through msgpack and back
unchanged (``plain_data``), and a launch spec holds what the node needs of the validated spec."""

from __future__ import annotations

import msgpack
import pytest

from hier_sched.common.messages import EmulatedRun, LaunchOrder, LaunchReply, LaunchSpec, NodeReport, RunOnNode
from hier_sched.common.plain_data import from_plain, to_plain
from hier_sched.core.events import Launch, NodeEvent, RunEnded, RunSettled
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState, Placement, Risk, SharingMode
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.spec import parse_spec


def through_msgpack(value, kind):
    packed = msgpack.packb(to_plain(value, kind), use_bin_type=True)
    return from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False), kind)


GANG = Launch("g-1", 3, (Placement("g-1", "n0", (0, 1), 4000.0, policy="magm", reason="fits"),
                         Placement("g-1", "n1", (2, 3), 4000.0)),
              6000.0, PlacementRequest("g-1", 2, 3500.0, smact=0.3, min_free_mib=5000.0), resume=True)
SPEC = LaunchSpec(("torchrun", "train.py"), None, "/w", "ckpt", {"SEED": "1"},
                  {"pip": ["torch"], "env_vars": {"A": "b"}, "config": {"setup_timeout_seconds": 60}},
                  EmulatedRun(3000.0, 120.0, 0.5, None, 0.2, 10.0))


@pytest.mark.parametrize("message, kind", [
    (LaunchOrder(GANG, 1, SPEC, b"\x80\x05pickled", {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501"}), LaunchOrder),
    (LaunchOrder(Launch("j", 1, (Placement("j", "n0", (0,), 1.0),), None, PlacementRequest("j")), 0,
                 LaunchSpec(entrypoint="pkg.mod:main")), LaunchOrder),
    (LaunchReply(False, "GPU 0: 3000 MiB free, 4000 MiB needed"), LaunchReply),
    (NodeReport("n0", 12.5, [GpuState("n0", 0, 40536.0, 1200.0, uuid="GPU-x", risk=Risk(0.4, 0.3, 0.1), power_w=90.0,
                                      resident_jobs=("a", "b"), multi_gpu_jobs=1, sharing=SharingMode.STREAMS,
                                      last_launch_s=3.0, pending_mib=500.0, resident_attempts=(1, 2))],
                "inc-1", [(4, RunEnded("a", 1, Failure("oom", "out of memory", 1), 1, 3900.0, "n0"), None),
                          (5, RunSettled("b", 2, 2500.0), b"result"),
                          (6, RunEnded("c", 1), None)],
                [RunOnNode("a", 1, Placement("a", "n0", (0,), 4000.0))]), NodeReport),
])
def test_every_message_goes_through_msgpack_and_back_unchanged(message, kind):
    back = through_msgpack(message, kind)
    assert back == message and type(back) is type(message)


def test_the_types_inside_come_back_too_not_just_equal_values():
    report = NodeReport("n0", 0.0, [GpuState("n0", 0, 1.0, 0.0, sharing=SharingMode.STREAMS)], "i",
                        [(1, RunSettled("a", 1, 1.0), None)], [RunOnNode("a", 1, Placement("a", "n0", (0,), 1.0))])
    back = through_msgpack(report, NodeReport)
    assert back.snapshot[0].sharing is SharingMode.STREAMS  # a str enum would also equal its bare value
    assert type(back.events[0]) is tuple and type(back.runs[0].placement.gpus) is tuple


def test_run_events_keep_their_kind_even_when_their_fields_would_fit_another():
    events = [RunSettled("a", 1, 100.0), RunEnded("a", 1)]
    assert [through_msgpack(e, NodeEvent) for e in events] == events
    with pytest.raises(ValueError, match="'Launch' is not one of"):
        from_plain(["Launch", {}], NodeEvent)


def test_a_launch_spec_holds_what_the_node_needs_of_the_validated_spec():
    spec = parse_spec({"name": "x", "command": ["python", "t.py"], "workdir": "/w", "checkpoint_dir": "c",
                       "env": {"K": "v"}, "runtime_env": {"pip": ["numpy"]}, "gpus": 4, "priority": 3,
                       "emulation": {"peak_mib": 100, "duration_s": 5, "smocc": 0.7, "warmup_s": 0}})
    assert LaunchSpec.of(spec) == LaunchSpec(("python", "t.py"), None, "/w", "c", {"K": "v"}, {"pip": ["numpy"]},
                                             EmulatedRun(100.0, 5.0, 0.5, 0.7, None, 0.0))
    assert LaunchSpec.of(parse_spec({"name": "y", "entrypoint": "m:f"})) == LaunchSpec(entrypoint="m:f")
