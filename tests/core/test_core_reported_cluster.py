"""The live queue's one ClusterIndex (``ReportedCluster``): updated per node whose snapshot changed."""

from hier_sched.core.gpu import GpuState
from hier_sched.core.reported_cluster import ReportedCluster


def gpus(node: str, used: float, count: int = 2) -> list[GpuState]:
    return [GpuState(node, i, 40000.0, used) for i in range(count)]


def test_a_kept_index_learns_only_the_nodes_whose_snapshot_changed():
    reported = ReportedCluster()
    first = reported.refresh({"n0": gpus("n0", 0.0), "n1": gpus("n1", 0.0)})
    assert reported.rebuilt == 1 and first.free[0, 0] == first.free[1, 0] == 40000.0
    same = reported.refresh({"n0": gpus("n0", 0.0), "n1": gpus("n1", 10000.0)})
    assert same is first and reported.rebuilt == 1 and reported.updated == 1  # n1 only
    assert same.free[1, 0] == 30000.0 and same.free[0, 0] == 40000.0
    assert same.gpus("n1")[0].memory_used_mib == 10000.0  # its snapshots are the new ones
    reported.refresh({"n0": gpus("n0", 0.0), "n1": gpus("n1", 10000.0)})
    assert reported.updated == 1  # nothing changed: nothing updated


def test_a_change_of_the_nodes_builds_a_new_index():
    reported = ReportedCluster()
    first = reported.refresh({"n0": gpus("n0", 0.0), "n1": gpus("n1", 0.0)})
    lost = reported.refresh({"n0": gpus("n0", 0.0)})  # n1 lost
    assert lost is not first and lost.names == ["n0"] and reported.rebuilt == 2
    grown = reported.refresh({"n0": gpus("n0", 0.0, count=4)})  # n0 came back with more GPUs
    assert grown is not lost and grown.free.shape == (1, 4) and reported.rebuilt == 3
    assert reported.refresh({}) is None
