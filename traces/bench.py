"""Load-time benchmark of every trace source: ``python -m traces.bench [NAME ...]``.

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

DEFAULT_NAMES = (
    "carma:philly_mix-90-tasks",
    "gavel:11cb48",
    "openb:default",
    "openb:gpushare100",
    "synthetic:philly?jobs=10000&gpus=250",
    "synthetic:philly?jobs=100000&gpus=2500",
    "synthetic:philly?jobs=1000000&gpus=25000",
)


def _measure(name: str) -> dict[str, float | int | str]:
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


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(_measure(argv[1])))
        return
    imported = subprocess.run([sys.executable, "-c", _IMPORT_TIME], check=True, capture_output=True, text=True)
    print(f"import traces: {float(imported.stdout):.3f} s (not in the figures below)")
    print(f"{'trace':45} {'jobs':>9} {'cold s':>8} {'warm s':>8}")
    for name in argv or DEFAULT_NAMES:
        out = subprocess.run([sys.executable, "-m", "traces.bench", "--one", name],
                             check=True, capture_output=True, text=True).stdout
        row = json.loads(out)
        print(f"{row['name']:45} {row['jobs']:>9,} {row['cold_s']:>8.3f} {row['warm_s']:>8.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
