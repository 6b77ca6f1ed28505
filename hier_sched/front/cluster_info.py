"""Where a running cluster's endpoints are: what ``hier-sched info`` prints, read from Ray.

Everything comes from the cluster itself (Ray's node table and key-value store, the global
queue), so it is the same from any node and needs no local state.
"""

from __future__ import annotations

from typing import Any

from hier_sched.front.connection import Scheduler

__all__ = ["dashboard_url", "metrics_urls", "cluster_info", "released_nodes"]


def dashboard_url() -> str | None:
    """The Ray dashboard's URL when one runs (the head publishes it in Ray's key-value store)."""
    from ray._private.services import get_webui_url_from_internal_kv  # what ray.init() reports; no public API

    url = get_webui_url_from_internal_kv()
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def metrics_urls() -> list[str]:
    """Each alive node's metrics export endpoint (Prometheus text)."""
    import ray

    return [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            for n in ray.nodes() if n["Alive"] and n.get("MetricsExportPort")]


def released_nodes(active: set[str]) -> list[dict[str, Any]]:
    """GPU nodes an autoscaler added that are still in the cluster without a node actor: the
    scheduler released them (idle) and the autoscaler has not removed them yet."""
    import ray

    from hier_sched.front.autoscaling import GPU_TYPE_LABEL, elastic_node_name

    return [{"name": elastic_node_name(n["NodeID"]), "gpus": int(n["Resources"]["GPU"]),
             "gpu_type": (n.get("Labels") or {}).get(GPU_TYPE_LABEL, "-"), "backend": "-", "state": "released"}
            for n in ray.nodes()
            if n["Alive"] and n["Resources"].get("GPU", 0) > 0 and GPU_TYPE_LABEL in (n.get("Labels") or {})
            and elastic_node_name(n["NodeID"]) not in active]


def cluster_info(scheduler: Scheduler) -> dict[str, Any]:
    """``{"dashboard_url", "metrics_urls", "nodes", "gpus", "policy", "state_dir", ...}``."""
    cluster = scheduler.call_whole("cluster")
    drains = {d["node"]: d for d in cluster.get("drains", ())}
    nodes = [{"name": s["node"], "gpus": s["gpus"], "gpu_type": s["gpu_type"], "backend": s["backend"],
              "state": drains[s["node"]]["state"] if s["node"] in drains else "active"} for s in cluster["nodes"]]
    nodes += [{"name": n, "gpus": 0, "gpu_type": "-", "backend": "-", "state": "not answering"}
              for n in cluster.get("waiting_on", ())]
    nodes += released_nodes({n["name"] for n in nodes})
    return {
        "dashboard_url": dashboard_url(),
        "metrics_urls": metrics_urls(),
        "nodes": nodes,
        "gpus": sum(n["gpus"] for n in nodes),
        "policy": cluster["policy"],
        "state_dir": cluster["state_dir"],
        "ray_address": scheduler.address,
        "time_scale": cluster["time_scale"],
    }
