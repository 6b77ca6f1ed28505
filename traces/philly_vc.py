"""``philly-vc:<vc>,<vc>,...?start=DAY&days=D&scale=S&jobs=N``: Philly's teams, job by job.

Gavel's Philly-derived traces are one file per Philly virtual cluster (VC), named by the VC's id;
each is read by ``traces.gavel`` (durations, memory and utilization as documented there).
``tenants/philly_vc_nodes.csv`` gives the node count of 11 of those VCs (8 GPUs each): their
quotas. Merged (``traces.tenants``), they are a multi-tenant trace: each VC's own arrivals, job
sizes and durations, and the VCs' real quota structure (8 to 64 nodes).

* **Time.** Every Gavel file starts its VC's clock at 0 (its first job); the VCs are aligned there.
  The files do not say whether their first jobs were submitted at the same hour.
* **Why only the quotas shrink.** Gavel kept at most 2,000 jobs per VC, over one to four months of
  arrivals, so a file carries 4-21 % of its VC's GPU capacity in work (in its busiest weeks up to
  30 %). Every job in the window is kept and ``scale`` shrinks the quotas. At 1/8, collocation
  absorbs the load (nobody's p95 wait is above zero); at the default 1/16 (176 GPUs) the VCs offer
  0.8-4.6 times their quota in solo GPU-time, in bursts, so some queue while others idle -- what
  quotas, borrowing and reclaim are for -- and the three-way comparison replays in ~20 s.
* **Default window:** days 7-21 (weeks 1-2). Week 0 is nearly empty (three VCs have under ten jobs
  there) and after week 5 most files have ended; in weeks 1-2 ten VCs submit and one (11cb48)
  is idle: its quota is there to lend.
* **Cluster:** V100-16GB 8-GPU nodes, as ``gavel:`` hints (Gavel's Philly cluster spec).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from types import MappingProxyType

from traces._paths import cached_per_data_dir, data_file
from traces.gavel import GAVEL_CLUSTER, load_gavel
from traces.schema import Trace, TraceError
from traces.tenants import NODE_GPUS, in_window, parse_tenant_query, scaled_quota, tenant_trace

__all__ = ["PHILLY_VC_TEMPLATE", "philly_vc_nodes", "load_philly_vc"]

PHILLY_VC_TEMPLATE = "philly-vc:<vc>,<vc>,...?start=DAY&days=D&scale=S&jobs=N"
_DEFAULTS = {"start": 7, "days": 14, "scale": 0.0625}
_NODES_FILE = ("tenants", "philly_vc_nodes.csv")


@cached_per_data_dir
def philly_vc_nodes() -> Mapping[str, int]:
    """Philly VC id -> its node count, in the file's order."""
    path = data_file(*_NODES_FILE)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    try:
        return MappingProxyType({row["vc"]: int(row["node num"]) for row in rows})
    except (KeyError, ValueError) as exc:
        raise TraceError(f"{path}: expected columns 'vc' and 'node num' (integer) ({exc})") from None


def load_philly_vc(rest: str, *, seed: int = 0) -> Trace:
    """``rest`` is what follows ``philly-vc:``, e.g. ``all?days=14&scale=0.125``."""
    nodes = philly_vc_nodes()
    query = parse_tenant_query("philly-vc", rest, list(nodes), seed=seed, defaults=_DEFAULTS)
    quotas = {vc: scaled_quota(nodes[vc] * NODE_GPUS, query.scale) for vc in query.tenants}
    per_vc = {vc: in_window(load_gavel(vc).jobs, query) for vc in query.tenants}
    return tenant_trace(
        query, per_vc, quotas, gpu_type=GAVEL_CLUSTER.gpu_type, seeded=False,
        source=f"{data_file(*_NODES_FILE)}; traces/gavel/msr/seed=0/<vc>.trace",
        notes=["jobs: Gavel's per-VC Philly traces as gavel:<vc> reads them (tenant = VC id); "
               f"days {query.start_day:g}-{query.start_day + query.days:g} of each VC's clock"],
    )
