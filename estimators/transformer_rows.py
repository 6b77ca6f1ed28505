"""GPUMemNet's transformer-schema rows -> estimates (``hier-sched estimate-table --kind transformer``).

GPUMemNet's transformer data describe classifiers built as ``Embedding(vocab, E)`` ->
``TransformerEncoder`` of ``L`` post-norm layers (``E`` wide, ``F`` feed-forward, ``heads``) ->
``Linear(E, classes)``, trained with Adam in fp32 on ``B`` sequences of ``S`` tokens. The table
says so in explicit columns (``Seq Length``, ``Embedding Size``, ``Num Layers``, ``Num Heads``)
and in the layer list, whose parameter counts give the vocabulary (embedding), the feed-forward
width (first FFN linear: E x F + F) and the classes (last linear). Its activation counts and
totals follow another convention (whole-batch shapes, MHA parameters left out), so they are not
read: the shape is, and ``transformer_encoder_memory`` turns it into MiB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from estimators.encoder_memory import TransformerShape, transformer_encoder_memory
from estimators.gpumemnet_rows import MAX_BATCH_SIZE, layer_tuples
from estimators.types import EstimatorError, MemoryEstimate

__all__ = ["TRANSFORMER_COLUMNS", "is_transformer_schema", "shape_from_row", "estimate_row"]

TRANSFORMER_COLUMNS = ("Batch Size", "Seq Length", "Embedding Size", "Num Layers", "Activations-Params")


def is_transformer_schema(columns: object) -> bool:
    return all(c in columns for c in TRANSFORMER_COLUMNS)  # type: ignore[operator]


def _whole(row: Mapping[str, object], column: str, where: str, low: int = 1, high: int = MAX_BATCH_SIZE) -> int:
    value = row.get(column)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise EstimatorError(f"{where}: column {column!r} is not a number ({value!r})") from None
    if not (math.isfinite(number) and number == int(number) and low <= number <= high):
        raise EstimatorError(f"{where}: column {column!r} must be a whole number in {low}..{high} (got {value!r})")
    return int(number)


def shape_from_row(row: Mapping[str, object], where: str = "row") -> TransformerShape:
    """Read the shape; a layer list that does not fit the described encoder is an error."""
    embed = _whole(row, "Embedding Size", where, high=1 << 16)
    names, _, params = layer_tuples(str(row.get("Activations-Params") or ""), where)
    counts = [int(p) for p in params]
    kinds = [n.strip().lower() for n in names]
    embedding = [p for k, p in zip(kinds, counts) if k == "embedding"]
    linears = [p for k, p in zip(kinds, counts) if k == "linear"]
    if not embedding or not linears or embedding[0] % embed:
        raise EstimatorError(f"{where}: 'Activations-Params' has no Embedding({embed} wide) and Linear layers")
    widths = [_other_width(p, embed, where) for p in linears]
    if linears[-1] % (embed + 1):
        raise EstimatorError(f"{where}: the last Linear layer is not a classifier on {embed} features")
    return TransformerShape(
        batch=_whole(row, "Batch Size", where), seq=_whole(row, "Seq Length", where, high=1 << 20),
        embed=embed, layers=_whole(row, "Num Layers", where, high=1024),
        heads=_whole(row, "Num Heads", where, high=1024) if row.get("Num Heads") not in (None, "") else 1,
        ff=max(widths[:-1] or [embed]), vocab=embedding[0] // embed, classes=linears[-1] // (embed + 1),
    )


def _other_width(params: int, embed: int, where: str) -> int:
    """The width on the other side of a Linear with ``embed`` features on one side (with bias):
    E -> n has E*n + n parameters, n -> E has n*E + E."""
    if params % (embed + 1) == 0:
        return params // (embed + 1)
    if params % embed == 0 and params > embed:
        return params // embed - 1
    raise EstimatorError(f"{where}: a Linear layer with {params} parameters has no side of {embed} features")


def estimate_row(row: Mapping[str, object], where: str = "row", gpu: str = "A100-40GB") -> MemoryEstimate:
    return transformer_encoder_memory(shape_from_row(row, where), gpu=gpu)
