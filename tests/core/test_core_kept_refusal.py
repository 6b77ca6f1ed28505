"""The nodes that refused a head last cycle by their kept rooms alone are skipped the next cycle
(``CycleView``'s ``KeptRefusal``) only while their refusal rests on what it did: the same request,
the same kept rooms, the clock within their grace; a node that changed, or that is new among the
candidates, is walked; a shell that builds snapshots on demand walks every node. Each test shows
a plan recalling the refusals, then one that must not, placing the job as the plain walk over the
nodes does. (Random clusters and queues planned twice on the same index, the recall at work, are
``test_core_plan_equivalence``'s.)
"""

from __future__ import annotations

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.gpu import GpuState, Risk
from hier_sched.core.placement import PlacementConfig
from hier_sched.core.queueing import QueueConfig, QueuedJob, plan_cycle

TOTAL = 40536.0
NOW = 10_000.0
CFG, QCFG = PlacementConfig(policy="magm"), QueueConfig(strict_fifo=False)


CALM, BUSY = Risk(0.2, 0.1, 0.1), Risk(0.95, 0.9, 0.9)  # BUSY: the utilization gate closes the GPU


def _gpu(node: str, i: int, risk: Risk = CALM, **kw) -> GpuState:
    """A GPU with one resident and 25,000 MiB free."""
    return GpuState(node, i, TOTAL, TOTAL - 25000.0, resident_jobs=("x",), risk=risk, **kw)


class Shell:
    """Node -> its GPUs, the snapshots counted as the index asks for them."""

    def __init__(self, nodes: dict[str, list[GpuState]], built_on_demand: bool = False):
        self.nodes, self.asked = nodes, []
        self.index = ClusterIndex([(n, len(g)) for n, g in nodes.items()], self.snapshot,
                                  built_on_demand=built_on_demand)
        for name, gpus in nodes.items():
            self.index.update(name, gpus)

    def snapshot(self, node: str) -> list[GpuState]:
        self.asked.append(node)
        return list(self.nodes[node])

    def plan(self, jobs: list[QueuedJob], now_s: float = NOW):
        self.asked.clear()
        return plan_cycle(jobs, self.index, CFG, QCFG, now_s)


def _blocked(n_nodes: int = 4, built_on_demand: bool = False) -> tuple[Shell, list[QueuedJob]]:
    """Nodes of two GPUs with room for the head's memory, one of them closed by the utilization
    gate; a head of two GPUs: every node is a candidate (the index sees memory) and refuses it."""
    shell = Shell({f"n{i}": [_gpu(f"n{i}", 0), _gpu(f"n{i}", 1, BUSY)] for i in range(n_nodes)}, built_on_demand)
    return shell, [QueuedJob("head", 0.0, gpus=2, need_mib=20000.0)]


def test_the_same_head_on_the_same_kept_rooms_is_refused_without_walking_its_candidates():
    shell, jobs = _blocked()
    first = shell.plan(jobs)
    assert first.head == "head" and sorted(shell.asked) == ["n0", "n1", "n2", "n3"]
    again = shell.plan(jobs)
    assert again.head == "head" and again.waiting["head"] == first.waiting["head"]
    assert len(shell.asked) == 1  # only the node whose refusal is put in words


def test_a_node_that_changed_is_walked_alone():
    shell, jobs = _blocked()
    shell.plan(jobs)
    shell.nodes["n2"] = [_gpu("n2", 0, BUSY), _gpu("n2", 1, BUSY)]  # other snapshots, still no room
    shell.index.update("n2", shell.nodes["n2"])
    assert shell.plan(jobs).head == "head" and shell.asked == ["n2", "n3"]  # (n3: the words)
    assert shell.plan(jobs).head == "head" and shell.asked == ["n3"]  # n2's room kept from the walk


def test_a_node_that_changed_is_walked_and_takes_the_head():
    shell, jobs = _blocked()
    shell.plan(jobs)
    shell.nodes["n2"] = [_gpu("n2", 0), _gpu("n2", 1)]
    shell.index.update("n2", shell.nodes["n2"])
    assert [p.node for _, ps in shell.plan(jobs).placements for p in ps] == ["n2"]


def test_another_request_of_the_same_job_is_walked():
    shell, jobs = _blocked()
    shell.plan(jobs)
    one_gpu = [QueuedJob("head", 0.0, gpus=1, need_mib=20000.0)]
    assert [q.job_id for q, _ in shell.plan(one_gpu).placements] == ["head"]


def test_a_node_newly_among_the_candidates_is_walked():
    """A node whose room grows enough to rank among the candidates changes them."""
    nodes = {f"n{i}": [_gpu(f"n{i}", 0, BUSY), _gpu(f"n{i}", 1, BUSY)] for i in range(3)}
    nodes["n3"] = [GpuState("n3", g, TOTAL, TOTAL - 100.0, resident_jobs=("y",)) for g in range(2)]
    shell = Shell(nodes)
    jobs = [QueuedJob("head", 0.0, gpus=1, need_mib=20000.0)]
    assert shell.plan(jobs).head == "head" and "n3" not in shell.asked
    assert shell.plan(jobs).head == "head" and len(shell.asked) == 1  # (recalled)
    # less room than the others' (it ranks last), but room enough, and open
    shell.nodes["n3"][0] = GpuState("n3", 0, TOTAL, TOTAL - 23500.0, resident_jobs=("y",))
    shell.index.update_gpu("n3", 0, 23500.0)  # (the shell's cheap update: the row moves)
    assert [p.node for _, ps in shell.plan(jobs).placements for p in ps] == ["n3"]


def test_a_refusal_is_not_recalled_once_a_gpu_of_its_rooms_left_its_grace():
    shell, jobs = _blocked()
    shell.nodes["n1"] = [_gpu("n1", 0), _gpu("n1", 1, last_launch_s=NOW - 10)]
    shell.index.update("n1", shell.nodes["n1"])
    assert shell.plan(jobs).head == "head"  # n1's GPU 1 is in its post-launch grace
    assert shell.plan(jobs, NOW + 5).head == "head" and len(shell.asked) == 1  # (recalled)
    assert [p.node for _, ps in shell.plan(jobs, NOW + CFG.launch_grace_s).placements for p in ps] == ["n1"]


def test_a_shell_that_builds_snapshots_on_demand_walks_every_node():
    """The simulator says a node changed when it builds its snapshots (a monitoring window moved):
    each node is asked for them in the walk's order, and a change there sends the head to it."""
    shell, jobs = _blocked(built_on_demand=True)
    shell.plan(jobs)
    assert shell.plan(jobs).head == "head" and shell.asked == ["n0", "n1", "n2", "n3"]

    def window_moved(node: str) -> list[GpuState]:
        if node == "n2" and shell.nodes["n2"][1].risk is BUSY:
            shell.nodes["n2"] = [_gpu("n2", 0), _gpu("n2", 1)]
            shell.index.changed("n2")  # (as ``SimGpu.flush`` reports it)
        return Shell.snapshot(shell, node)

    shell.index._snapshot = window_moved
    assert [p.node for _, ps in shell.plan(jobs).placements for p in ps] == ["n2"]
