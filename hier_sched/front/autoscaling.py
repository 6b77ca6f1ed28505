"""``hier-sched up --emulated --autoscale MIN:MAX``: a local cluster whose GPU workers Ray's own
autoscaler adds and removes.

The head (no GPUs) runs Ray's autoscaler (v2) with Ray's fake multi-node provider, which starts
each worker as a real raylet on this machine, as a cloud provider would start a VM: the same
autoscaler, demand path and idle-node removal a KubeRay or cluster-launcher cluster runs, with
one node type of ``--gpus-per-node`` emulated GPUs. Nothing here scales anything: the queue asks
(``node_watcher``), Ray's autoscaler decides.

Ray starts the workers from its autoscaler process on the head, so they belong to the head's
``ray start`` session and ``down`` ends them with it (``local_cluster.stop_local_ray``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["WORKER_TYPE", "GPU_TYPE_LABEL", "autoscaling_config", "autoscaling_env", "elastic_node_name",
           "worker_node_types", "write_autoscaling_config"]

WORKER_TYPE = "gpu-worker"  # the node type's name, also in the queue's reasons
GPU_TYPE_LABEL = "hier-sched/gpu-type"  # a node label: the emulated GPU type of the node's GPUs
_FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
_HEAD_NODE_ID = "f" * 51 + "00000"  # the fake provider's head: its node ids are fff...<5 digits>
_HEAD_TYPE = "ray.head.default"


def elastic_node_name(node_id: str) -> str:
    """The scheduler's name of a node an autoscaler added: from its Ray node id, so stable while
    the node lives and never reused (a position would be)."""
    return f"n-{node_id[-12:]}"


def worker_node_types(config: Any) -> list[dict[str, Any]]:
    """The node types the autoscaler may add, as the queue's admission counts them
    (``core.node_types``)."""
    from hier_sched.core.node_types import NodeType

    kind, gpus = config.node_specs[0]
    return [NodeType(WORKER_TYPE, kind, gpus, max_count=config.autoscale[1]).to_record()]


def autoscaling_config(config: Any, gcs_address: str) -> dict[str, Any]:
    """The autoscaler's cluster config (the cluster launcher's YAML schema) for ``config``."""
    low, high = config.autoscale
    kind, gpus = config.node_specs[0]
    empty_lists = ("cluster_synced_files", "rsync_exclude", "rsync_filter", "initialization_commands",
                   "setup_commands", "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
                   "worker_start_ray_commands")
    return {
        "cluster_name": "hier-sched-local",
        "max_workers": high,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": config.idle_timeout_s / 60.0,
        "provider": {"type": "external", "module": _FAKE_PROVIDER, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True, "launch_multiple": True,
                     "head_node_id": _HEAD_NODE_ID, "gcs_address": gcs_address},
        "auth": {},
        "head_node_type": _HEAD_TYPE,
        "available_node_types": {
            _HEAD_TYPE: {"resources": {"CPU": config.cpus_per_node}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {"resources": {"CPU": config.cpus_per_node, "GPU": gpus},
                          "labels": {GPU_TYPE_LABEL: kind}, "node_config": {},
                          "min_workers": low, "max_workers": high},
        },
        "file_mounts": {},
        "file_mounts_sync_continuously": False,
        **{key: [] for key in empty_lists},
    }


def write_autoscaling_config(config: Any, gcs_address: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "autoscaling.json"
    path.write_text(json.dumps(autoscaling_config(config, gcs_address), indent=1))
    return path


def autoscaling_env(update_interval_s: int = 1) -> dict[str, str]:
    """The head's environment for the fake provider and autoscaler v2 (which reads idle nodes
    from the raylets and drains them before it removes them); every few seconds, not Ray's
    default 5 s, so that a local demo shows it."""
    return {"RAY_FAKE_CLUSTER": "1", "RAY_enable_autoscaler_v2": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": str(update_interval_s),
            "RAY_CLOUD_INSTANCE_ID": _HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": _HEAD_NODE_ID}
