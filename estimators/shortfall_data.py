"""Rows to fit the trace's shortfall on: GPUMemNet CNN rows rebuilt as modules, traced once.

``hier-sched estimators shortfall-data --out F.jsonl`` appends one JSON line per row (resumable:
rows already in the file are skipped). Rows are taken in a seeded random order, so a run stopped by
its time budget has traced a random sample. Only rows that ran (``Status`` SUCCESSFUL) carry a
label; sequential architectures only (``noise_floor.rebuild_sequential``: residual and dense nets
are counted as not rebuildable and left out).

Each line holds the row's name, family, split, batch, measured peak and the trace's figures
(``trace_estimator.TraceResult``, bytes): everything ``shortfall`` fits on and evaluates with.
"""

from __future__ import annotations

import csv
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from estimators.data import LABEL, family_of, gpumemnet_dir, read_jsonl, split_of
from estimators.noise_floor import rebuild_sequential
from estimators.trace_estimator import TraceFailed, run_trace
from estimators.types import LABEL_GPU

__all__ = ["build_rows", "load_rows"]

_SOURCE_FILE = "cnn_partial.csv"


def load_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a shortfall-data file (an empty list when it does not exist yet)."""
    return read_jsonl(path, "shortfall-data row")


def _labelled_rows(seed: int) -> list[dict[str, str]]:
    with (gpumemnet_dir() / _SOURCE_FILE).open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Status"] == "SUCCESSFUL" and float(r[LABEL]) > 0]
    random.Random(seed).shuffle(rows)
    return rows


def build_rows(out: Path, *, seed: int = 0, time_budget_s: float | None = None, timeout_s: float = 120.0,
               progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Trace every rebuildable labelled CNN row not yet in ``out`` (``outcome`` "traced",
    "not rebuildable" or "failed"), stopping new rows once ``time_budget_s`` has passed."""
    done = {r["filename"] for r in load_rows(out)}
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    for row in _labelled_rows(seed):
        name = row["Filename"]
        if name in done:
            continue
        if time_budget_s is not None and time.monotonic() - start > time_budget_s:
            break
        record: dict[str, Any] = {"filename": name, "family": family_of(name), "split": split_of(name),
                                  "measured_mib": float(row[LABEL])}
        rebuilt = rebuild_sequential(row)
        if rebuilt is None:
            record["outcome"] = "not rebuildable"
        else:
            model, shape, batch = rebuilt
            record["batch"] = batch
            try:
                trace = run_trace(lambda m=model: m, gpu=LABEL_GPU, batch_size=batch, input_shape=shape,
                                  timeout_s=timeout_s)
            except TraceFailed as exc:
                record.update(outcome="failed", reason=exc.reason[:300])
            else:
                record.update(outcome="traced", trace=asdict(trace))
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if progress:
            progress(record)
    return load_rows(out)
