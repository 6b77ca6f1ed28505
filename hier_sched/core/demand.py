"""What the queue asks of a cluster autoscaler: the GPUs of every node's runs and of every job
that waits, as bundles shaped like the nodes they need.

An autoscaler's resource request (Ray's ``request_resources``) is a floor for the whole cluster,
packed onto the nodes' *total* resources, and each request replaces the last. So the request is
always the union: one bundle per node for the GPUs its runs hold (else the nodes that run work
would already meet the floor, and the autoscaler would add nothing for the jobs that wait), and
one bundle per node a waiting job needs at once (a gang's ranks are separate bundles, so they
land on separate nodes all together). A waiting job asks for whole GPUs: on nodes that do not
exist yet nobody knows what it could share. Jobs no node type could ever hold were refused at
submit (``node_types``), so every bundle fits some node type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

__all__ = ["autoscaler_demand", "nodes_to_release", "GPU_RESOURCE"]

GPU_RESOURCE = "GPU"


def autoscaler_demand(waiting: Iterable[tuple[int, int]], busy_gpus: Mapping[str, int]) -> list[dict[str, float]]:
    """Bundles for ``waiting`` jobs' shapes ((nodes, GPUs per node), ``JobView.shape``) and the
    GPUs in use on each node (``busy_gpus``, node -> count). Sorted, so an unchanged demand gives
    an equal list and the caller asks the autoscaler only when it changed."""
    bundles = [{GPU_RESOURCE: float(count)} for count in busy_gpus.values() if count > 0]
    for nodes, gpus in waiting:
        bundles += [{GPU_RESOURCE: float(gpus)}] * nodes
    return sorted(bundles, key=lambda b: -b[GPU_RESOURCE])


def nodes_to_release(idle_since: MutableMapping[str, float], nodes: Iterable[str], busy: Iterable[str], now: float,
                     after_s: float, jobs_wait: bool) -> list[str]:
    """The nodes to hand back to the autoscaler: idle (no run) for ``after_s`` while no job waits.

    Ray counts a node with any live worker process, an actor's too, as busy, so a node actor would
    keep its idle node forever: the queue releases such a node, its actor ends, and the
    autoscaler removes the node after its own idle timeout (or the node comes back into use when
    a job waits before then). ``idle_since`` (node -> since when it has been idle) is kept here,
    across calls; the short wait spares the churn between one job's end and the next submit."""
    busy = set(busy)
    nodes = list(nodes)
    for node in list(idle_since):
        if node in busy or node not in nodes:
            del idle_since[node]
    for node in nodes:
        if node not in busy:
            idle_since.setdefault(node, now)
    if jobs_wait:
        return []
    return [node for node, since in idle_since.items() if now - since >= after_s]
