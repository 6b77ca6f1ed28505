"""Named scheduler set-ups: the thesis' policies as published, and our default ``auto``.

A preset is the complete configuration of the core (placement + queue + recovery), so the
simulator and the live actors given the same name make the same decisions.
"""

from __future__ import annotations

from dataclasses import replace

from hier_sched.core.placement import PlacementConfig
from hier_sched.core.policies import POLICIES, policy
from hier_sched.core.queued_job import QueueConfig
from hier_sched.core.scheduler_config import SchedulerConfig

__all__ = ["SchedulerConfig", "preset", "PRESET_NAMES"]


PRESET_NAMES = ("auto", *POLICIES)


def preset(name: str, **placement_overrides) -> SchedulerConfig:
    """The configuration behind ``--policy NAME``.

    Thesis policies keep the thesis' strict FIFO queue, its gates (SMACT 0.80 / SMOCC 0.45 /
    DRAMA 0.40; 2048 MiB margin with an estimate, 5120 MiB without), exclusive-first, and MPS
    without per-job memory limits.
    ``auto`` adds what the thesis lacked: LUG placement (least interference; the thesis' best
    policy without an estimate) with the same gates, GPUs that host a multi-GPU job offered last
    (its slowest GPU paces the whole job), multi-GPU jobs first in line among equal priorities,
    backfilling behind a blocked head — once the head has waited two hours, the GPUs expected to
    drain first are held for it while backfilling goes on elsewhere —, an MPS memory limit per job
    (a job over its estimate fails itself, not its neighbours) and, shared by every
    preset, stepwise OOM recovery instead of the thesis' single exclusive retry. These choices
    were measured on the four thesis traces (BENCHMARKS.md: total time moves by a few per cent
    either way with the limit), so treat them as a default to revisit on your own traces with
    ``hier-sched replay --compare`` and ``hier-sched bench robustness``.
    """
    if name == "auto":
        key = name
        placement = PlacementConfig(policy="lug", spare_multi_gpu_jobs=True)
        queue = QueueConfig(strict_fifo=False, head_wait_limit_s=2 * 3600.0, gangs_first=True)
    else:
        try:
            key = policy(name).name
        except ValueError:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(PRESET_NAMES)}") from None
        placement = PlacementConfig(policy=key, mps_memory_limit=False)
        queue = QueueConfig(strict_fifo=True)
    if placement_overrides:
        placement = replace(placement, **placement_overrides)
    return SchedulerConfig(placement, queue, key)
