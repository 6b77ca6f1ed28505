"""Batch estimates for a GPUMemNet-schema table (``hier-sched estimate-table``).

Input rows need only the feature columns; label columns (``Max GPU Memory (MiB)``, ``Avg *``,
``Status``) are ignored when present. MLP and CNN rows go through the ML regressor. Transformer rows
in GPUMemNet's transformer schema (``Seq Length``, ``Embedding Size``, ``Num Layers`` ...) go through
the encoder's closed form (``transformer_rows``); transformer rows in the MLP/CNN schema through the
accounting formula. No SMACT prediction for transformers (no utilization data to learn from).

A missing column fails the whole table. A row with an empty layer list and no parameters
(cnn_partial.csv has 70) is a process without a network: it is estimated as the process baseline of
the labels' set-up (``LABEL_BASELINE_MIB``), with that in its ``method``. A bad row (NaN, an empty
layer list that claims parameters, absurd values: batch size > 2^20, a layer with >= 10^12
elements, totals that disagree with the layer list) gets no prediction, its error in ``method``,
and is reported; ``strict`` fails instead. Never a silent 0: every written ``predicted_mib`` is >= 1 MiB.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from estimators.features import feature_matrix
from estimators.gpumemnet_rows import REQUIRED_COLUMNS, description_from_row, table_from_rows
from estimators.formulas import accounting_memory
from estimators.ml import predict_memory, predict_smact
from estimators.transformer_rows import estimate_row as transformer_row_estimate
from estimators.transformer_rows import is_transformer_schema
from estimators.baseline import CONTEXT_RANGE_TOP_MIB
from estimators.types import LABEL_BASELINE_MIB, EstimatorError, MemoryEstimate

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
    row_methods: dict[int, str] = field(default_factory=dict)  # rows estimated otherwise than ``method``


def estimate_rows(kind: str, rows: list[Mapping[str, object]], *, strict: bool = False) -> TableResult:
    if kind not in KINDS:
        raise EstimatorError(f"--kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if not rows:
        raise EstimatorError("the table has no rows")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise EstimatorError(f"missing column(s): {', '.join(map(repr, missing))}")
    if kind == "transformer" and is_transformer_schema(rows[0]):
        return _row_by_row(rows, strict, transformer_row_estimate, "transformer-formula")
    if kind == "transformer":
        return _row_by_row(rows, strict, lambda row, where: accounting_memory(description_from_row(row, where)),
                           "accounting")
    out = {name: np.full(len(rows), np.nan) for name in ("point", "low", "high", "smact")}
    empty = [i for i, row in enumerate(rows) if _is_empty_model(row)]
    parsed = table_from_rows([r for i, r in enumerate(rows) if i not in set(empty)] if empty else rows, strict=strict)
    keep = [i for i in range(len(rows)) if i not in set(empty)]  # parsed indexes -> input rows
    errors = {keep[i]: message for i, message in parsed.errors.items()}
    # A network without layers (cnn_partial.csv has 70: its generator failed) still runs a process:
    # it holds the process baseline of the labels' set-up (measured 1,451-1,467 MiB for such rows).
    out["point"][empty], out["low"][empty], out["high"][empty] = LABEL_BASELINE_MIB, LABEL_BASELINE_MIB, \
        max(CONTEXT_RANGE_TOP_MIB, LABEL_BASELINE_MIB)
    row_methods = {i: "process baseline only (empty layer list)" for i in empty}
    if len(parsed.rows):
        x = feature_matrix(parsed.layers)
        index = [keep[i] for i in parsed.rows]
        out["point"][index], out["low"][index], out["high"][index] = predict_memory(kind, x)
        out["smact"][index] = predict_smact(kind, x)
    elif not empty:
        _require_some(parsed.rows, errors)
    return TableResult(out["point"], out["smact"], out["low"], out["high"], f"ml-{kind}", errors, row_methods)


def _is_empty_model(row: Mapping[str, object]) -> bool:
    """An empty layer list (``[]``) with no parameters: a model that is only a process."""
    layers = str(row.get("Activations-Params") or "").strip()
    params = str(row.get("Total Parameters") or "0").strip()
    return layers == "[]" and params in ("0", "0.0")


def _row_by_row(rows: list[Mapping[str, object]], strict: bool,
                estimate: Callable[[Mapping[str, object], str], MemoryEstimate], method: str) -> TableResult:
    """Transformer kinds: one closed-form estimate per row (no ML model, no SMACT prediction)."""
    out = {name: np.full(len(rows), np.nan) for name in ("point", "low", "high")}
    errors: dict[int, str] = {}
    for i, row in enumerate(rows):
        try:
            est = estimate(row, f"row {i}")
        except EstimatorError as exc:
            if strict:
                raise
            errors[i] = str(exc)
            continue
        out["point"][i], out["low"][i], out["high"][i] = est.peak_mib, est.low_mib, est.high_mib
    _require_some([i for i in range(len(rows)) if i not in errors], errors)
    return TableResult(out["point"], None, out["low"], out["high"], method, errors)


def _require_some(good: object, errors: dict[int, str]) -> None:
    if not len(good):  # type: ignore[arg-type]
        raise EstimatorError(f"no row could be estimated; first problem: {next(iter(errors.values()))}")


def _column(values: np.ndarray | None, fmt: str, n: int) -> list[str]:
    """Formatted cells of one output column ("" where there is no estimate), in one pass."""
    if values is None:
        return [""] * n
    return [fmt % v if v == v else "" for v in values.tolist()]  # v != v: NaN


def estimate_csv(kind: str, input_path: Path, output_path: Path, *, strict: bool = False) -> TableResult:
    """Read ``input_path``, write one output row per input row."""
    try:
        with Path(input_path).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise EstimatorError(f"cannot read {input_path}: {exc.strerror or exc}") from None
    result = estimate_rows(kind, rows, strict=strict)
    n = len(rows)
    methods = [result.method] * n
    for i, method in result.row_methods.items():
        methods[i] = method
    for i, message in result.errors.items():
        methods[i] = f"error: {message}"
    with Path(output_path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(OUTPUT_COLUMNS)
        writer.writerows(zip(range(n), _column(result.predicted_mib, "%.1f", n),
                             _column(result.predicted_smact, "%.4f", n), _column(result.low_mib, "%.1f", n),
                             _column(result.high_mib, "%.1f", n), methods))
    return result
