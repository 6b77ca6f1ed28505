"""Run one replay: load the trace, build the cluster, simulate, summarize."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hier_sched.common.collector import long_lived_heap
from hier_sched.core.gpu import SharingMode
from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueSetup
from hier_sched.core.slots import SLOT_GRACE_S
from replay.cluster import REPORT_DELAY_S, ClusterShape
from replay.cluster_spec import shape_of_groups
from replay.engine import Simulator, SlotSettings
from replay.estimates import estimator_for
from replay.metrics import ReplayResult, summarize
import traces
from traces.schema import Trace

__all__ = ["ReplayOptions", "shape_for", "run_replay"]


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    policy: str = "auto"
    estimator: str = "oracle"
    nodes: int | None = None  # None: the trace's own cluster (or 1 x 4 A100-40GB)
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    sharing: str = "mps"
    seed: int = 0
    slot_length_s: float | None = None
    slot_grace_s: float = SLOT_GRACE_S
    window: int = 30
    jitter_s: float = 0.0  # shift each arrival by up to this many seconds (seeded): robustness checks
    report_delay_s: float = REPORT_DELAY_S  # how late node reports reach the planner (replay.world)
    queues: QueueSetup | None = None  # team queues with quotas; a trace job's queue is its user's (``quotas``)
    # A cluster of node groups, (GPU type, nodes, GPUs each) (``cluster_spec``); (): the above
    node_groups: tuple[tuple[str, int, int], ...] = ()
    type_aware: bool = True  # False: type-agnostic placement on a cluster of several GPU types (to compare)


def shape_for(trace: Trace, opts: ReplayOptions) -> ClusterShape:
    sharing = SharingMode(opts.sharing)
    if opts.node_groups:
        if opts.nodes is not None or opts.gpus_per_node is not None or opts.gpu_type is not None:
            raise ValueError("a cluster of node groups (--nodes-spec, --cluster) describes every node: "
                             "leave out --nodes, --gpus-per-node and --gpu-type")
        return shape_of_groups(opts.node_groups, sharing)
    hint = trace.cluster
    if opts.nodes is None and opts.gpus_per_node is None and hint is not None and hint.node_list:
        nodes = tuple((f"node{i:04d}", g, opts.gpu_type or t) for i, (g, t) in enumerate(hint.node_list))
        return ClusterShape(nodes, sharing)
    nodes = opts.nodes or (hint.nodes if hint else 1)
    per_node = opts.gpus_per_node or (hint.gpus_per_node if hint else 4)
    gpu = opts.gpu_type or (hint.gpu_type if hint else "A100-40GB")
    return ClusterShape.uniform(nodes, per_node, gpu, sharing)


def run_replay(
    trace: str | Trace,
    opts: ReplayOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
    record_series: bool | None = None,
    alone_jct: Mapping[str, float] | None = None,
) -> tuple[ReplayResult, Simulator]:
    """``alone_jct``: job id -> its JCT alone on its tenant's quota (``replay.tenant_runs``), for
    the tenants' finish-time fairness in the result."""
    tr = traces.load_trace(trace, seed=opts.seed) if isinstance(trace, str) else trace
    if opts.jitter_s:
        tr = tr.with_jittered_arrivals(opts.jitter_s, opts.seed)
    shape = shape_for(tr, opts)
    config = preset(opts.policy) if opts.type_aware else preset(opts.policy, type_aware=False)
    slots = SlotSettings(opts.slot_length_s, opts.slot_grace_s) if opts.slot_length_s else None
    first_type = shape.nodes[0][2]
    sim = Simulator(
        tr, shape, config, estimator_for(opts.estimator, first_type), slots=slots, window=opts.window,
        record_series=record_series, progress=progress, report_delay_s=opts.report_delay_s,
        queues=opts.queues,
    )
    with long_lived_heap():
        wall = sim.run()
    result = summarize(
        sim, trace_name=tr.name, policy=opts.policy, estimator=opts.estimator, sharing=opts.sharing,
        wall_s=wall, seed=opts.seed, alone_jct=alone_jct,
    )
    return result, sim
