"""What the queue asks of a cluster autoscaler: the GPUs of every node's runs and of every job
that waits, as bundles shaped like the nodes they need.

An autoscaler's resource request (Ray's ``request_resources``) is a floor for the whole cluster,
packed onto the nodes' *total* resources, and each request replaces the last. So the request is
always the union: one bundle per node for the GPUs its runs hold (else the nodes that run work
would already meet the floor, and the autoscaler would add nothing for the jobs that wait), and
one bundle per node a waiting job needs at once (a gang's ranks are separate bundles, so they
land on separate nodes all together). A waiting job asks for whole GPUs: on nodes that do not
exist yet nobody knows what it could share. A job restricted to some GPU types (``gpu_types``)
says which: each bundle comes with the types it may land on (none: any), which the shell turns
into the autoscaler's label selectors, so a job that needs an H100 brings in an H100 node, not
whichever type is cheapest. Jobs no node type could ever hold were refused at submit
(``node_types``), so every bundle fits some node type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

__all__ = ["autoscaler_demand", "nodes_to_release", "GPU_RESOURCE", "Bundle"]

GPU_RESOURCE = "GPU"

Bundle = tuple[dict[str, float], tuple[str, ...]]  # (resources, the GPU types it may land on; (): any)


def autoscaler_demand(waiting: Iterable[tuple[int, int, tuple[str, ...]]],
                      busy_gpus: Mapping[str, int]) -> list[Bundle]:
    """Bundles for ``waiting`` jobs' shapes ((nodes, GPUs per node, the GPU types allowed),
    ``SchedulerQueries.waiting_shapes``) and the GPUs in use on each node (``busy_gpus``, node ->
    count; wherever they are, they are). Sorted, so an unchanged demand gives an equal list and
    the caller asks the autoscaler only when it changed."""
    bundles: list[Bundle] = [({GPU_RESOURCE: float(count)}, ()) for count in busy_gpus.values() if count > 0]
    for nodes, gpus, types in waiting:
        bundles += [({GPU_RESOURCE: float(gpus)}, tuple(types))] * nodes
    return sorted(bundles, key=lambda b: (-b[0][GPU_RESOURCE], b[1]))


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
