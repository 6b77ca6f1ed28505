import pickle
from dataclasses import dataclass, field

import pytest

from hier_sched.common.messages import NodeReport, RunOnNode
from hier_sched.core.events import RunEnded
from hier_sched.core.failures import Failure
from hier_sched.core.gpu import GpuState, Placement, Risk, SharingMode
from hier_sched.core.wire import pickled_by_fields


def test_a_node_report_comes_back_equal():
    snapshot = [GpuState("n0", i, 40536.0, 1000.0 * i, "H100-80GB", f"GPU-{i}", Risk(0.3, 0.2, 0.1), 95.0,
                         ("a", "b"), 1, SharingMode.STREAMS, None, 12.5, 2048.0, (1, 2)) for i in range(8)]
    runs = [RunOnNode("a", 1, Placement("a", "n0", (0, 1), 10_000.0, policy="magm", reason="fits"))]
    ended = (3, RunEnded("c", 2, Failure("oom", "out of memory", 137), 1, 5000.0), None)
    report = NodeReport("n0", 7.0, snapshot, "inc", [ended], runs, 4)
    back = pickle.loads(pickle.dumps(report, 5))
    assert back == report
    assert back.snapshot[3].sharing is SharingMode.STREAMS and back.snapshot[3].risk == Risk(0.3, 0.2, 0.1)


def test_a_class_with_a_field_outside_its_constructor_is_refused():
    @dataclass(frozen=True)
    class Derived:
        a: int
        b: int = field(init=False, default=0)

    with pytest.raises(TypeError, match="every field must be an __init__ argument"):
        pickled_by_fields(Derived)
