"""``load_trace``: one entry point for every trace name or file.

Names are ``<source>:<trace>``: ``carma:<trace>``, ``gavel:<name>``, ``openb:<variant>``,
``synthetic:philly?jobs=N&gpus=G&seed=S`` and the tenant traces ``philly-vc:<vc>,...?...`` and
``helios-vc:<vc>,...?...`` (``traces.tenants``); anything else is taken as a path to a user's CSV /
JSON / JSONL file (``traces.user_files``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from traces.carma import CARMA_TRACES, load_carma
from traces.gavel import gavel_traces, load_gavel
from traces.helios_vc import HELIOS_VC_TEMPLATE, load_helios_vc
from traces.openb import OPENB_TRACES, load_openb
from traces.philly_vc import PHILLY_VC_TEMPLATE, load_philly_vc
from traces.schema import Trace, TraceError
from traces.synthetic import SYNTHETIC_TEMPLATE, load_synthetic
from traces.user_files import USER_SUFFIXES, load_user_file

__all__ = ["load_trace", "known_traces"]

_SOURCES: dict[str, Callable[[str, int], Trace]] = {
    "carma": lambda name, seed: load_carma(name),
    "gavel": lambda name, seed: load_gavel(name),
    "openb": lambda name, seed: load_openb(name),
    "synthetic": lambda rest, seed: load_synthetic(rest, seed=seed),
    "philly-vc": lambda rest, seed: load_philly_vc(rest, seed=seed),
    "helios-vc": lambda rest, seed: load_helios_vc(rest, seed=seed),
}


def known_traces() -> list[str]:
    """Every trace name ``load_trace`` accepts (the synthetic and tenant ones as their templates)."""
    try:
        gavel = [f"gavel:{name}" for name in gavel_traces()]
    except TraceError:  # shared data missing: still name the source
        gavel = ["gavel:<name>"]
    return [
        *(f"carma:{name}" for name in CARMA_TRACES),
        *gavel,
        *(f"openb:{name}" for name in OPENB_TRACES),
        SYNTHETIC_TEMPLATE,
        PHILLY_VC_TEMPLATE,
        HELIOS_VC_TEMPLATE,
    ]


def load_trace(name_or_path: str, *, seed: int = 0) -> Trace:
    """Load a named trace or a user's trace file. ``seed`` matters only for synthetic traces and
    ``helios-vc`` (a ``seed=`` in the query wins). Raises ``TraceError`` with the known names."""
    source, sep, rest = name_or_path.partition(":")
    if sep and source in _SOURCES:
        return _SOURCES[source](rest, seed)
    path = Path(name_or_path)
    if path.suffix.lower() in USER_SUFFIXES or path.is_file():
        return load_user_file(path)
    raise TraceError(
        f"unknown trace {name_or_path!r}; known: {', '.join(known_traces())}, "
        f"or a path to a {'/'.join(s.lstrip('.').upper() for s in USER_SUFFIXES)} trace file"
    )
