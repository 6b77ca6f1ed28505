"""Reasons people read say one unit per sentence: GiB (``core.units.gib``), never MiB beside it."""

from __future__ import annotations

from hier_sched.core.units import gib


def test_gib_has_one_decimal():
    assert gib(27048) == "26.4 GiB" and gib(512) == "0.5 GiB"
