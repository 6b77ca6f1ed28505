"""Fixed time slots: the defaults, written once, and the slot a job's ticket carries.

A job with a slot yields its GPUs after ``length_s``: ``grace_s`` before that it receives the
checkpoint signal (it saves and exits with the requeue code), and a run still there at the
slot's end is stopped, killed ``kill_after_s`` after its SIGTERM. ``extends``: when nobody waits
at the slot's end, the run gets another slot instead of a preemption (the cluster's fairness
slot; a job's own slot is hard unless it says so).

The defaults live here, not in ``events`` or ``spec``, so that the ticket, the job spec and both
shells read one value (and ``tickets`` can import it without an import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SLOT_GRACE_S", "SLOT_KILL_AFTER_S", "Slot"]

SLOT_GRACE_S = 600.0  # checkpoint signal this long before the slot ends: time to save a checkpoint
SLOT_KILL_AFTER_S = 30.0  # SIGKILL this long after the slot's SIGTERM


@dataclass(frozen=True, slots=True)
class Slot:
    length_s: float
    grace_s: float = SLOT_GRACE_S
    kill_after_s: float = SLOT_KILL_AFTER_S
    extends: bool = False
