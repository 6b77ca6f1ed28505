"""How long a training job takes to reach its peak allocation: the spec's default warm-up.

A training job reaches its peak after its first iterations (model built, optimizer state
created). The spec (``spec.py``) takes it as its default, and the emulated device
(``hier_sched.device.gpu_model.warmup_s``) grows a job's memory over it.
"""

from __future__ import annotations

__all__ = ["WARMUP_S"]

WARMUP_S = 10.0
