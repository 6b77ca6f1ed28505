"""Load-time benchmark of every trace source: ``hier-sched bench traces [NAME ...]``.

Each name is timed in a fresh interpreter ("cold": parsing the shared files included, what a
replay command pays on top of ``import traces``), then a second time in the same process ("warm":
the parsed tables are cached in-process). Figures go to
BENCHMARKS.md (Traces); they are never asserted by tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator

DEFAULT_NAMES = (
    "carma:philly_mix-90-tasks",
    "gavel:11cb48",
    "openb:default",
    "openb:gpushare100",
    "synthetic:philly?jobs=10000&gpus=250",
    "synthetic:philly?jobs=100000&gpus=2500",
    "synthetic:philly?jobs=1000000&gpus=25000",
)


def measure(name: str) -> dict[str, float | int | str]:
    """Load ``name`` twice in this process: cold if nothing loaded it here before, then warm."""
    from traces import load_trace

    started = time.perf_counter()
    cold_trace = load_trace(name)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    warm_trace = load_trace(name)
    warm = time.perf_counter() - started
    assert warm_trace.jobs == cold_trace.jobs
    return {"name": name, "jobs": len(cold_trace.jobs), "cold_s": round(cold, 3), "warm_s": round(warm, 3)}


_IMPORT_TIME = "import time; t = time.perf_counter(); import traces; print(time.perf_counter() - t)"
_MEASURE_IN_A_FRESH_PROCESS = ("import json, sys; from hier_sched.front.bench.traces import measure; "
                               "print(json.dumps(measure(sys.argv[1])))")


def import_seconds() -> float:
    """``import traces`` in a fresh interpreter (not in the figures of ``load_times``)."""
    imported = subprocess.run([sys.executable, "-c", _IMPORT_TIME], check=True, capture_output=True, text=True)
    return float(imported.stdout)


def load_times(names: Iterable[str]) -> Iterator[dict[str, float | int | str]]:
    """``measure`` of each name, each in its own interpreter, as soon as it is measured."""
    for name in names:
        out = subprocess.run([sys.executable, "-c", _MEASURE_IN_A_FRESH_PROCESS, name],
                             check=True, capture_output=True, text=True).stdout
        yield json.loads(out)
