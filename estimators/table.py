"""Batch estimates for a GPUMemNet-schema table (``hier-sched estimate-table``).

Input rows need only the feature columns; label columns (``Max GPU Memory (MiB)``, ``Avg *``,
``Status``) are ignored when present. MLP and CNN rows go through the ML regressor; transformer rows
through the accounting formula (there is no transformer training data), with no SMACT prediction.

A missing column fails the whole table. A bad row (NaN, empty layer list — cnn_partial.csv has 70
such rows) gets no prediction, its error in ``method``, and is reported; ``strict`` fails instead.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from estimators.features import REQUIRED_COLUMNS, ModelDescription, description_from_row, features
from estimators.formulas import accounting_memory
from estimators.ml import predict_memory, predict_smact
from estimators.types import EstimatorError

__all__ = ["KINDS", "TableResult", "estimate_rows", "estimate_csv", "OUTPUT_COLUMNS"]

KINDS = ("mlp", "cnn", "transformer")
OUTPUT_COLUMNS = ("row", "predicted_mib", "predicted_smact", "low_mib", "high_mib", "method")


@dataclass(frozen=True, slots=True)
class TableResult:
    """Per input row; rows listed in ``errors`` hold NaN predictions."""

    predicted_mib: np.ndarray
    predicted_smact: np.ndarray | None
    low_mib: np.ndarray
    high_mib: np.ndarray
    method: str
    errors: dict[int, str]


def _descriptions(rows: Iterable[Mapping[str, object]], strict: bool) -> tuple[dict[int, ModelDescription], dict[int, str]]:
    good, errors = {}, {}
    for i, row in enumerate(rows):
        try:
            good[i] = description_from_row(row, f"row {i}")
        except EstimatorError as exc:
            if strict:
                raise
            errors[i] = str(exc)
    return good, errors


def estimate_rows(kind: str, rows: list[Mapping[str, object]], *, strict: bool = False) -> TableResult:
    if kind not in KINDS:
        raise EstimatorError(f"--kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if not rows:
        raise EstimatorError("the table has no rows")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise EstimatorError(f"missing column(s): {', '.join(map(repr, missing))}")
    good, errors = _descriptions(rows, strict)
    if not good:
        raise EstimatorError(f"no row could be estimated; first problem: {next(iter(errors.values()))}")
    index = np.fromiter(good, dtype=int)
    out = {name: np.full(len(rows), np.nan) for name in ("point", "low", "high", "smact")}
    if kind == "transformer":
        ests = [accounting_memory(d) for d in good.values()]
        out["point"][index], out["low"][index], out["high"][index] = zip(*((e.peak_mib, e.low_mib, e.high_mib) for e in ests))
        return TableResult(out["point"], None, out["low"], out["high"], "accounting", errors)
    x = np.array([features(d) for d in good.values()], dtype=float)
    out["point"][index], out["low"][index], out["high"][index] = predict_memory(kind, x)
    out["smact"][index] = predict_smact(kind, x)
    return TableResult(out["point"], out["smact"], out["low"], out["high"], f"ml-{kind}", errors)


def _cell(value: float, fmt: str) -> str:
    return "" if np.isnan(value) else format(value, fmt)


def estimate_csv(kind: str, input_path: Path, output_path: Path, *, strict: bool = False) -> TableResult:
    """Read ``input_path``, write one output row per input row."""
    try:
        with Path(input_path).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise EstimatorError(f"cannot read {input_path}: {exc.strerror or exc}") from None
    result = estimate_rows(kind, rows, strict=strict)
    with Path(output_path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(OUTPUT_COLUMNS)
        for i in range(len(rows)):
            smact = "" if result.predicted_smact is None else _cell(result.predicted_smact[i], ".4f")
            writer.writerow([i, _cell(result.predicted_mib[i], ".1f"), smact, _cell(result.low_mib[i], ".1f"),
                             _cell(result.high_mib[i], ".1f"),
                             f"error: {result.errors[i]}" if i in result.errors else result.method])
    return result
