"""The complete configuration of the core: placement, queue and recovery (``SchedulerConfig``).

Named set-ups of it (the thesis' policies, our ``auto``) are in ``presets``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hier_sched.core.placement import PlacementConfig
from hier_sched.core.queued_job import QueueConfig
from hier_sched.core.recovery import RecoveryPolicy

__all__ = ["SchedulerConfig"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    name: str = "magm"

    @property
    def recovery(self) -> RecoveryPolicy:
        return self.queue.recovery
