"""How people read memory sizes: reasons and messages say GiB with one decimal, one unit per
sentence (JSON fields and metrics stay in MiB)."""

from __future__ import annotations

__all__ = ["gib"]


def gib(mib: float) -> str:
    """``27048`` -> ``"26.4 GiB"``."""
    return f"{mib / 1024:.1f} GiB"
