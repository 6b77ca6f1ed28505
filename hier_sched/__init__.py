"""hier_sched: collocation-aware, cluster-scale scheduling of deep-learning training jobs on Ray.

``import hier_sched as hs`` stays light (no Ray, no torch): the names below load on first use.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "submit": "hier_sched.front.client",
    "submit_many": "hier_sched.front.client",
    "BatchRefused": "hier_sched.front.client",
    "wait": "hier_sched.front.client",
    "JobHandle": "hier_sched.front.client",
    "JobFailed": "hier_sched.front.client",
    "JobCancelled": "hier_sched.front.client",
    "JobSpec": "hier_sched.core.spec",
    "SpecError": "hier_sched.core.spec",
    "load_spec": "hier_sched.common.spec_files",
    "parse_spec": "hier_sched.core.spec",
    # inside a job: the checkpoint-signal protocol of fixed time slots
    **dict.fromkeys(
        ["install_checkpoint_handler", "checkpoint_requested", "resuming", "checkpoint_dir", "exit_for_requeue",
         "atomic_write", "CheckpointDirError", "REQUEUE_EXIT_CODE", "RESUME_ENV", "CHECKPOINT_DIR_ENV"],
        "hier_sched.common.checkpointing",
    ),
    "TrainingCheckpoint": "hier_sched.common.torch_checkpoint",
    # inside a job: its memory is steady, the rest of its reservation goes back
    "memory_settled": "hier_sched.common.settling",
    # inside a job: how far it is, for `hier-sched top`
    "report_progress": "hier_sched.common.progress",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hier_sched' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
