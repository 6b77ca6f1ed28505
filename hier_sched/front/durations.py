"""How long, as users read it: wall-clock time, and beside it the emulated time on an emulated
cluster.

The scheduler's own clock runs at ``wall / time_scale``: an emulated cluster compresses time
(``--time-scale 0.01``: 100 emulated seconds pass in each wall second), so that a trace's hours
take minutes. What ``status`` and ``top`` show is the wall clock a user waits by; where the
scale is not 1 the emulated time follows in brackets (``28s (47m)``), which is the time the
jobs themselves, their durations and the scheduler's limits count in. The status objects carry
wall-clock times (``global_queue.service``); the scale comes with the cluster's settings.
"""

from __future__ import annotations

__all__ = ["duration", "span", "emulated", "clocks_note"]


def duration(seconds: float | None) -> str:
    """Compact, at most 5 characters: 45s, 12m, 3h05, 2d04, >99d."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 100:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}"
    if s < 100 * 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}"
    return ">99d"


def emulated(time_scale: float) -> bool:
    """Whether the cluster's clock differs from the wall clock (and times show both)."""
    return time_scale != 1.0


def span(wall_s: float | None, time_scale: float = 1.0) -> str:
    """``wall_s`` wall seconds: ``28s``, or ``28s (47m)`` where the cluster's time is emulated."""
    if wall_s is None:
        return "-"
    if not emulated(time_scale):
        return duration(wall_s)
    return f"{duration(wall_s)} ({duration(wall_s / time_scale)})"


def clocks_note(time_scale: float) -> str:
    """What a bracketed time means, for a title or a caption; empty on a real-time cluster."""
    if not emulated(time_scale):
        return ""
    return "times: wall clock (emulated)"
