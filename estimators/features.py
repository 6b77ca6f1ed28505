"""One feature vector for the feature-based estimators, from three kinds of input.

A model is described by its layer list — ``(layer name, output elements per sample, parameters)``,
exactly GPUMemNet's ``Activations-Params`` column — plus the batch size. ``description_from_row``
reads that column, ``description_from_module`` (in ``module_features``) records it with forward
hooks, ``layers_from_torchsummary`` parses a torchsummary printout; all three end in ``features``
so the ML models see identical numbers whichever way a job was described.

Features are computed for many models at once (``LayerTable`` -> ``feature_matrix``): tables
(``table_from_rows``) must run at >= 10^4 rows/s, and one model is a table of one row, so there is
a single implementation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from estimators.conv_shapes import infer_conv_inputs
from estimators.types import EstimatorError

__all__ = [
    "Layer",
    "ModelDescription",
    "FEATURE_NAMES",
    "ACTIVATIONS",
    "layer_family",
    "features",
    "feature_matrix",
    "LayerTable",
    "description_from_row",
    "table_from_rows",
    "ParsedTable",
    "layers_from_torchsummary",
    "MIB",
]

MIB = 2**20
FP32_BYTES = 4

# Activation functions seen in the GPUMemNet data (in this order: the index is a feature).
ACTIVATIONS = (
    "relu", "gelu", "elu", "selu", "silu", "mish", "tanh", "sigmoid", "softplus",
    "prelu", "leakyrelu", "identity", "relu6", "hardswish", "hardsigmoid",
)
_FAMILY_BY_NAME = {
    "linear": "linear",
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "convtranspose2d": "conv",
    "batchnorm1d": "norm", "batchnorm2d": "norm", "batchnorm3d": "norm", "batch_normalization": "norm",
    "layernorm": "norm", "groupnorm": "norm", "rmsnorm": "norm",
    "dropout": "dropout", "dropout1d": "dropout", "dropout2d": "dropout",
    "softmax": "softmax", "logsoftmax": "softmax",
    "adaptive_avg_pool2d": "pool", "adaptiveavgpool2d": "pool", "maxpool2d": "pool", "avgpool2d": "pool",
    "adaptivemaxpool2d": "pool", "max_pool2d": "pool", "avg_pool2d": "pool",
    "embedding": "embedding",
    "multiheadattention": "attention",
    "flatten": "reshape", "identity_reshape": "reshape",
}
FAMILIES = ("linear", "conv", "norm", "dropout", "activation", "pool", "softmax", "embedding", "attention")


@lru_cache(maxsize=1024)
def layer_family(name: str) -> str:
    """Map a layer name from any source (CSV, module class, torchsummary) to its family."""
    key = name.strip().lower().replace(" ", "")
    if key in ACTIVATIONS:
        return "activation"
    return _FAMILY_BY_NAME.get(key, "other")


class Layer(NamedTuple):
    """A tuple, not a dataclass: tables build ~10^5 of them per second."""

    name: str
    activations: int  # output elements per sample
    params: int


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """What the feature-based estimators know about a job."""

    layers: tuple[Layer, ...]
    batch_size: int
    activation: str = ""  # the model's dominant activation function, lower-case ("" unknown)
    bytes_per_element: int = FP32_BYTES
    # Totals, computed once (tables featurise ~10^4 descriptions per second).
    total_params: int = field(init=False)
    total_activations: int = field(init=False)
    max_activations: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise EstimatorError("model description has no layers")
        if self.batch_size < 1:
            raise EstimatorError(f"batch_size must be >= 1 (got {self.batch_size})")
        _, acts, params = zip(*self.layers)
        if min(acts) < 0 or min(params) < 0:
            bad = next(l for l in self.layers if l.activations < 0 or l.params < 0)
            raise EstimatorError(f"layer {bad.name!r}: negative activations/params ({bad})")
        object.__setattr__(self, "total_params", sum(params))
        object.__setattr__(self, "total_activations", sum(acts))
        object.__setattr__(self, "max_activations", max(acts))


# What autograd keeps alive for backward, per layer family (PyTorch's derivative formulas):
# conv/linear/norm/pooling save their input; ReLU/Tanh/Sigmoid and softmax their output; GELU,
# ELU/SELU, SiLU, Mish, Softplus, PReLU, LeakyReLU their input; dropout a 1-byte mask; an
# embedding only its (integer) indices, which we ignore.
_SAVES_OUTPUT = frozenset({"relu", "tanh", "sigmoid", "softmax", "logsoftmax"})
_SAVES_NOTHING = frozenset({"identity", "flatten", "identity_reshape"})
_SAVES_INPUT_FAMILIES = frozenset({"linear", "conv", "norm", "pool", "activation", "attention"})
_SAVES_IN, _SAVES_OUT, _ADAPTIVE_POOL = 1, 2, 4
_FLAG_BITS = 3
_FAMILY_INDEX = {f: i for i, f in enumerate(FAMILIES)}
_OTHER = len(FAMILIES)


@lru_cache(maxsize=1024)
def _layer_code(name: str) -> int:
    """``family index << 3 | autograd flags`` of a layer name, one small int per layer so the
    table path classifies 10^5 layers with one ``np.fromiter``."""
    family = layer_family(name)
    key = name.strip().lower().replace(" ", "")
    flags = 0
    if key in _SAVES_OUTPUT:
        flags |= _SAVES_OUT
    elif family in _SAVES_INPUT_FAMILIES and key not in _SAVES_NOTHING:
        flags |= _SAVES_IN
    if family == "pool" and key.startswith("adaptive"):
        flags |= _ADAPTIVE_POOL  # pooled to 1x1: its output count is its channel count
    return _FAMILY_INDEX.get(family, _OTHER) << _FLAG_BITS | flags


FEATURE_NAMES = (
    "batch_size",
    "log2_batch",
    "param_mib",
    "act_mib_per_sample",
    "batch_act_mib",
    "max_layer_batch_act_mib",
    "first_layer_batch_act_mib",
    "optimizer_state_mib",
    "horus_core_mib",
    "layers",
    *(f"n_{f}" for f in FAMILIES),
    "activation_code",
    # What backward needs (see _layer_code), for the whole batch:
    "saved_mib",  # every tensor autograd keeps, including the ones the layer list does not show
    "unlisted_inputs_mib",  # of which: the input batch and concatenations (DenseNet-style blocks)
    "dropout_mask_mib",
    "conv_input_mib",
    "largest_conv_input_mib",  # the biggest single conv: its input, output (cuDNN workspace scales with them)
    "largest_conv_output_mib",
    "largest_layer_param_mib",
    *(f"{f}_batch_act_mib" for f in ("conv", "norm", "activation", "dropout", "linear")),
    "saved_plus_training_state_mib",  # saved + weights, gradients, Adam's two moments
)
_SUMMED_FAMILIES = tuple(_FAMILY_INDEX[f] for f in ("conv", "norm", "activation", "dropout", "linear"))


@dataclass(frozen=True, slots=True)
class LayerTable:
    """Many models' layer lists flattened into per-layer arrays: features for a whole table are
    computed with numpy (>= 10^4 rows/s), and one model is just a table of one row."""

    codes: np.ndarray  # _layer_code per layer
    activations: np.ndarray  # int64, output elements per sample
    params: np.ndarray  # int64
    starts: np.ndarray  # model i owns layers starts[i]:starts[i+1] (never empty)
    batch_size: np.ndarray  # float per model
    activation_code: np.ndarray  # float per model, index in ACTIVATIONS or -1
    bytes_per_element: np.ndarray  # float per model

    @classmethod
    def from_descriptions(cls, descs: Sequence[ModelDescription]) -> LayerTable:
        counts = [len(d.layers) for d in descs]
        names, acts, params = zip(*(layer for d in descs for layer in d.layers))
        return cls.build(names, acts, params, counts, [d.batch_size for d in descs],
                         [d.activation for d in descs], [d.bytes_per_element for d in descs])

    @classmethod
    def build(cls, names: Sequence[str], acts: Sequence[int], params: Sequence[int], counts: Sequence[int],
              batch: Sequence[float], activations: Sequence[str], bytes_per_element: Sequence[float]) -> LayerTable:
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        code_of = {name: _layer_code(name) for name in set(names)}  # a dict lookup per layer, not a call
        return cls(np.fromiter(map(code_of.__getitem__, names), dtype=np.int16, count=len(names)),
                   np.asarray(acts, dtype=np.int64), np.asarray(params, dtype=np.int64), starts,
                   np.asarray(batch, dtype=float), np.array([_activation_code(a) for a in activations], dtype=float),
                   np.asarray(bytes_per_element, dtype=float))


def _activation_code(activation: str) -> float:
    act = activation.lower()
    return float(ACTIVATIONS.index(act)) if act in ACTIVATIONS else -1.0


def _layer_inputs(t: LayerTable, family: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """Input elements per sample of every layer. Default: the previous layer's output (the first
    layer's input is unknown: NaN). Linear layers: exact from their parameters (in*out + out).
    Convs and adaptive pools: from ``conv_shapes`` (concatenated inputs of dense blocks)."""
    acts = t.activations.astype(float)
    inputs = np.empty_like(acts)
    inputs[1:] = acts[:-1]
    inputs[t.starts[:-1]] = np.nan
    linear = (family == _FAMILY_INDEX["linear"]) & (t.activations > 0)
    fan_in = np.where(linear, t.params // np.maximum(t.activations, 1) - 1, 0)
    exact = linear & (fan_in > 0) & (t.params == (fan_in + 1) * t.activations)
    inputs[exact] = fan_in[exact]
    conv = np.flatnonzero(family == _FAMILY_INDEX["conv"])
    if conv.size:
        _conv_and_pool_inputs(t, conv, family, flags, inputs)
    return inputs


def _conv_and_pool_inputs(t: LayerTable, conv: np.ndarray, family: np.ndarray, flags: np.ndarray,
                          inputs: np.ndarray) -> None:
    last = len(family) - 1
    norm_next = (family[np.minimum(conv + 1, last)] == _FAMILY_INDEX["norm"]) & (conv < last)
    model_of = np.searchsorted(t.starts, conv, side="right") - 1
    norm_next &= conv + 1 < t.starts[model_of + 1]
    known_oc = np.where(norm_next, t.params[np.minimum(conv + 1, last)] // 2, 0)
    solved = infer_conv_inputs(t.activations[conv], t.params[conv], known_oc, model_of)
    resolved = ~np.isnan(solved.elements)
    inputs[conv[resolved]] = solved.elements[resolved]
    # An adaptive pool reads every channel of the last conv block (a concatenation in dense
    # nets): channels (its output count) x that block's spatial size.
    pools = np.flatnonzero(flags & _ADAPTIVE_POOL)
    before = np.searchsorted(conv, pools) - 1
    ok = before >= 0
    pools, before = pools[ok], before[ok]
    ok = (model_of[before] == np.searchsorted(t.starts, pools, side="right") - 1) & (solved.spatial[before] > 0)
    inputs[pools[ok]] = t.activations[pools[ok]] * solved.spatial[before[ok]]


def feature_matrix(t: LayerTable) -> np.ndarray:
    """The feature matrix (rows: models, columns: ``FEATURE_NAMES``). Sizes are in MiB so the
    trees split on quantities that mean something physically (bytes the GPU has to hold)."""
    n = len(t.starts) - 1
    first = t.starts[:-1]
    family, flags = t.codes >> _FLAG_BITS, t.codes & ((1 << _FLAG_BITS) - 1)
    acts, params = t.activations.astype(float), t.params.astype(float)
    inputs = _layer_inputs(t, family, flags)

    def per_model(values: np.ndarray, op: np.ufunc = np.add) -> np.ndarray:
        return op.reduceat(values, first)

    saves_in = (flags & _SAVES_IN) > 0
    # A listed tensor (a layer output) is kept if its layer saves its output or the next layer
    # saves its input and that input is this very output; other saved inputs are unlisted tensors.
    consumes_previous = np.zeros(len(acts), dtype=bool)
    consumes_previous[:-1] = saves_in[1:] & (inputs[1:] == acts[:-1])
    consumes_previous[t.starts[1:] - 1] = False
    kept = ((flags & _SAVES_OUT) > 0) | consumes_previous
    known_inputs = np.where(np.isnan(inputs), acts, inputs)  # unknown (a model's first layer): its own size
    unlisted = saves_in & (inputs != np.r_[np.nan, acts[:-1]])
    unlisted[first] = saves_in[first]  # a model's input is never the previous model's last output
    unlisted_elems = per_model(np.where(unlisted, known_inputs, 0.0))
    is_conv = family == _FAMILY_INDEX["conv"]
    is_dropout = family == _FAMILY_INDEX["dropout"]
    family_sums = np.stack([per_model(np.where(family == f, acts, 0.0)) for f in _SUMMED_FAMILIES], axis=1)
    counts = np.bincount(np.repeat(np.arange(n), np.diff(t.starts)) * (_OTHER + 1) + family,
                         minlength=n * (_OTHER + 1)).reshape(n, _OTHER + 1)[:, :_OTHER]

    b, bpe = t.batch_size, t.bytes_per_element
    scale = bpe / MIB
    total_acts, total_params = per_model(acts), per_model(params)
    param_mib = total_params * scale
    batch_act_mib = b * total_acts * scale
    mask_mib = b * per_model(np.where(is_dropout, acts, 0.0)) / MIB  # torch.bool: 1 byte per element
    saved_mib = b * (per_model(np.where(kept, acts, 0.0)) + unlisted_elems) * scale + mask_mib
    max_layer_mib = b * per_model(acts, np.maximum) * scale
    return np.column_stack([
        b, np.log2(b), param_mib, total_acts * scale, batch_act_mib, max_layer_mib, b * acts[first] * scale,
        3 * param_mib,  # gradients + Adam's two moments
        batch_act_mib + 2 * param_mib,  # Horus' B*A + P + G
        np.diff(t.starts).astype(float), counts.astype(float), t.activation_code,
        saved_mib, b * unlisted_elems * scale, mask_mib,
        b * per_model(np.where(is_conv, known_inputs, 0.0)) * scale,
        b * per_model(np.where(is_conv, known_inputs, 0.0), np.maximum) * scale,
        b * per_model(np.where(is_conv, acts, 0.0), np.maximum) * scale,
        per_model(params, np.maximum) * scale,
        b[:, None] * family_sums * scale[:, None],
        saved_mib + 4 * param_mib,
    ])


def features(desc: ModelDescription) -> list[float]:
    """One model's feature vector (order: ``FEATURE_NAMES``); the same code as a whole table."""
    return feature_matrix(LayerTable.from_descriptions([desc]))[0].tolist()


# --- GPUMemNet CSV rows --------------------------------------------------------------------

MAX_LAYER_COUNT = 10**12  # elements per sample (4 TB in fp32): a corrupt cell, not a layer
_PUNCTUATION = str.maketrans("", "", "[]()'\" \t\r\n")


def _layer_tuples(text: str, where: str) -> tuple[list[str], list[str], list[str]]:
    """Parse ``[('linear', 629, 792540), ...]`` into names, activations, params (as strings).
    Dropping the punctuation and splitting on commas, not ``ast.literal_eval`` nor a regex: 20x
    and 1.5x faster, and batch tables must run at >= 10k rows/s. The structure is still checked:
    one ``(`` and ``)`` per triple, whole numbers where numbers belong."""
    body = text.strip()
    tokens = body.translate(_PUNCTUATION).split(",")
    names, acts, params = tokens[0::3], tokens[1::3], tokens[2::3]
    if tokens == [""] and body[:1] == "[":
        raise EstimatorError(f"{where}: 'Activations-Params' is empty")
    if not (body[:1] == "[" and body[-1:] == "]" and len(tokens) % 3 == 0
            and body.count("(") == len(names) == body.count(")")
            and "".join(acts).isdigit() and "".join(params).isdigit()):
        raise EstimatorError(f"{where}: 'Activations-Params' is not a list like [('linear', 629, 792540), ...]"
                             f" (got {body[:60]!r})")
    return names, acts, params


def _absurd_layers(where: str) -> str:
    return (f"{where}: 'Activations-Params' has a layer with >= {MAX_LAYER_COUNT:.0e} activations or parameters"
            " per sample (absurd: a corrupt cell?)")


def _number(row: Mapping[str, object], column: str, where: str) -> float:
    value = row.get(column)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise EstimatorError(f"{where}: column {column!r} is not a number ({value!r})") from None
    if not math.isfinite(number):
        raise EstimatorError(f"{where}: column {column!r} is NaN/inf")
    return number


REQUIRED_COLUMNS = ("Activations-Params", "Batch Size")
TOTAL_COLUMNS = ("Total Activations", "Total Parameters")
MAX_BATCH_SIZE = 1 << 20  # beyond this a "batch size" is a corrupt cell, not a training job


def _row_fields(row: Mapping[str, object], where: str) -> tuple[tuple[list[str], list[str], list[str]], int, str]:
    """The layer (names, activations, params), batch size and activation function of a GPUMemNet-schema row."""
    missing = [c for c in REQUIRED_COLUMNS if row.get(c) in (None, "")]
    if missing:
        raise EstimatorError(f"{where}: missing value in column(s) {', '.join(map(repr, missing))}")
    layers = _layer_tuples(str(row["Activations-Params"]), where)
    batch = _number(row, "Batch Size", where)
    if batch < 1 or batch != int(batch) or batch > MAX_BATCH_SIZE:
        raise EstimatorError(f"{where}: 'Batch Size' must be a positive integer <= {MAX_BATCH_SIZE} (got {batch})")
    return layers, int(batch), _activation_name(row.get("Activation Function"))


def _given_totals(row: Mapping[str, object], where: str) -> tuple[float, float]:
    """``Total Activations``/``Total Parameters`` when present (NaN when absent)."""
    return tuple(_number(row, c, where) if row.get(c) not in (None, "") else math.nan  # type: ignore[return-value]
                 for c in TOTAL_COLUMNS)


def _parse_totals(raw: list[tuple[object, object]], kept: list[int], rows: Sequence[Mapping[str, object]],
                  strict: bool, errors: dict[int, str]) -> np.ndarray:
    """The optional total columns of the kept rows, parsed in one numpy call (NaN: absent or
    unparsable, the latter reported as that row's error). A cell holding "nan" counts as absent."""
    try:
        totals = np.fromstring(" ".join([str(cell or "nan") for pair in raw for cell in pair]), sep=" ")
        if totals.size == 2 * len(raw):
            return totals.reshape(-1, 2)
    except ValueError:
        pass
    # Some cell is not one number: find and report it row by row.
    totals = np.full((len(raw), 2), np.nan)
    for j, i in enumerate(kept):
        try:
            totals[j] = _given_totals(rows[i], f"row {i}")
        except EstimatorError as exc:
            if strict:
                raise
            errors[i] = str(exc)
    return totals


def _total_mismatch(where: str, given: float, total: float, column: str) -> str | None:
    if math.isnan(given) or abs(given - total) <= max(1.0, 1e-6 * total):
        return None
    return f"{where}: {column!r} = {given:.0f} disagrees with the layer list ({total:.0f})"


def description_from_row(row: Mapping[str, object], where: str = "row") -> ModelDescription:
    """A GPUMemNet-schema row -> ``ModelDescription``. The per-layer list is the source of truth;
    ``Total Activations``/``Total Parameters``, when present, must agree with it (a mismatch means
    the row is corrupt, and we say so instead of guessing)."""
    (names, acts, params), batch, act = _row_fields(row, where)
    acts_int, params_int = list(map(int, acts)), list(map(int, params))
    if max(acts_int) >= MAX_LAYER_COUNT or max(params_int) >= MAX_LAYER_COUNT:
        raise EstimatorError(_absurd_layers(where))
    # tuple.__new__ through _make: a third of the cost of calling Layer(...) per layer.
    desc = ModelDescription(tuple(map(Layer._make, zip(names, acts_int, params_int))), batch, act)
    for given, total, column in zip(_given_totals(row, where), (desc.total_activations, desc.total_params),
                                    TOTAL_COLUMNS):
        if problem := _total_mismatch(where, given, total, column):
            raise EstimatorError(problem)
    return desc


@dataclass(frozen=True, slots=True)
class ParsedTable:
    """A GPUMemNet-schema table as one ``LayerTable``: ``rows[i]`` is the input row of model i;
    unusable rows are in ``errors`` (input row -> message)."""

    layers: LayerTable | None  # None when no row was usable
    rows: np.ndarray
    errors: dict[int, str]


@dataclass(slots=True)
class _Columns:
    """Accumulates parsed rows before one concatenation into a ``LayerTable``."""

    names: list[str] = field(default_factory=list)
    acts: list[np.ndarray] = field(default_factory=list)  # int64 chunks, concatenated once
    params: list[np.ndarray] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    activations: list[str] = field(default_factory=list)
    given: list[tuple[object, object]] = field(default_factory=list)  # raw total-column cells
    kept: list[int] = field(default_factory=list)  # input row of each parsed model


def _activation_name(cell: object) -> str:
    act = str(cell or "").strip().lower()
    return act if act != "none" else ""


def _collect_clean_rows(rows: Sequence[Mapping[str, object]], cols: _Columns) -> list[int]:
    """Parse, in bulk, every row that passes cheap checks (a bracketed list with balanced
    parentheses, a whole batch size in range): one translate/split over the joined column instead
    of one per row. Returns the other rows, for the careful per-row path that names the problem."""
    texts = [str(row.get("Activations-Params") or "").strip() for row in rows]
    try:
        batch = np.array([row.get("Batch Size") or "nan" for row in rows], dtype=float)
    except (TypeError, ValueError):
        return list(range(len(rows)))
    opens = [t.count("(") for t in texts]
    ok = (batch >= 1) & (batch <= MAX_BATCH_SIZE) & (batch == np.floor(batch)) & np.array(
        [n > 0 and t[:1] == "[" and t[-1:] == "]" and t.count(")") == n for t, n in zip(texts, opens)], dtype=bool)
    clean = np.flatnonzero(ok).tolist()
    tokens = ",".join(texts[i] for i in clean).translate(_PUNCTUATION).split(",")
    names = tokens[0::3]
    try:  # one C parse per column; it rejects any token that is not a whole number
        acts, params = (np.fromstring(" ".join(tokens[k::3]), dtype=np.int64, sep=" ") for k in (1, 2))
    except ValueError:
        return list(range(len(rows)))  # some row only looked clean: let the careful path find it
    if not (len(tokens) == 3 * sum(opens[i] for i in clean) and acts.size == params.size == len(names)
            and (acts.size == 0 or min(acts.min(), params.min()) >= 0)):
        return list(range(len(rows)))
    cols.names += names
    cols.acts.append(acts)
    cols.params.append(params)
    cols.counts += [opens[i] for i in clean]
    cols.batches += batch[clean].tolist()
    cols.activations += [_activation_name(rows[i].get("Activation Function")) for i in clean]
    cols.given += [(rows[i].get(TOTAL_COLUMNS[0]), rows[i].get(TOTAL_COLUMNS[1])) for i in clean]
    cols.kept += clean
    return np.flatnonzero(~ok).tolist()


def table_from_rows(rows: Sequence[Mapping[str, object]], *, strict: bool = False) -> ParsedTable:
    """Parse every row straight into flat arrays (no per-layer Python objects): the batch path of
    ``estimate-table``. Same checks and messages as ``description_from_row``; ``strict`` raises
    on the first bad row instead of reporting it."""
    cols = _Columns()
    errors: dict[int, str] = {}
    for i in _collect_clean_rows(rows, cols):
        row = rows[i]
        try:
            (row_names, row_acts, row_params), batch, act = _row_fields(row, f"row {i}")
        except EstimatorError as exc:
            if strict:
                raise
            errors[i] = str(exc)
            continue
        cols.names += row_names
        cols.acts.append(np.array(row_acts, dtype=np.int64))  # digits only: checked by _layer_tuples
        cols.params.append(np.array(row_params, dtype=np.int64))
        cols.counts.append(len(row_names))
        cols.batches.append(batch)
        cols.activations.append(act)
        cols.given.append((row.get(TOTAL_COLUMNS[0]), row.get(TOTAL_COLUMNS[1])))
        cols.kept.append(i)
    names, counts, batches, activations, given, kept = (cols.names, cols.counts, cols.batches, cols.activations,
                                                         cols.given, cols.kept)
    if not kept:
        return ParsedTable(None, np.zeros(0, dtype=np.int64), errors)
    act_arr, param_arr = np.concatenate(cols.acts), np.concatenate(cols.params)
    starts = np.r_[0, np.cumsum(counts)][:-1]
    sums = np.column_stack([np.add.reduceat(act_arr, starts), np.add.reduceat(param_arr, starts)])
    given_arr = _parse_totals(given, kept, rows, strict, errors)
    with np.errstate(invalid="ignore"):
        off = np.abs(given_arr - sums) > np.maximum(1.0, 1e-6 * sums)  # NaN (absent) compares False
    absurd = np.maximum.reduceat(np.maximum(act_arr, param_arr), starts) >= MAX_LAYER_COUNT
    good = np.array([i not in errors for i in kept])
    for j in np.flatnonzero(off.any(axis=1) | absurd):
        problems = [_absurd_layers(f"row {kept[j]}")] if absurd[j] else []
        problems += [p for c, column in enumerate(TOTAL_COLUMNS)
                     if (p := _total_mismatch(f"row {kept[j]}", given_arr[j, c], float(sums[j, c]), column))]
        if strict:
            raise EstimatorError(problems[0])
        errors[kept[j]], good[j] = problems[0], False
    if not good.all():
        layer_keep = np.repeat(good, counts)
        names = [n for n, k in zip(names, layer_keep) if k]
        act_arr, param_arr = act_arr[layer_keep], param_arr[layer_keep]
        counts, batches, activations = ([v for v, k in zip(seq, good) if k] for seq in (counts, batches, activations))
    if not good.any():
        return ParsedTable(None, np.zeros(0, dtype=np.int64), errors)
    table = LayerTable.build(names, act_arr, param_arr, counts, batches, activations, [FP32_BYTES] * len(counts))
    return ParsedTable(table, np.asarray(kept, dtype=np.int64)[good], errors)


# --- torchsummary text ----------------------------------------------------------------------

_SUMMARY_LINE = re.compile(r"^\s*([A-Za-z_][\w]*)-\d+\s+\[([-\d,\s]+)\]\s+([\d,]+)\s*$")


def layers_from_torchsummary(text: str) -> tuple[tuple[Layer, ...], str]:
    """Parse ``torchsummary.summary`` output: one line per leaf layer, ``Name-idx [-1, C, H, W] params``.
    Returns the layers and the dominant activation function found."""
    layers: list[Layer] = []
    for line in text.splitlines():
        m = _SUMMARY_LINE.match(line)
        if not m:
            continue
        dims = [int(d) for d in m.group(2).replace(" ", "").split(",") if d]
        per_sample = math.prod(d for d in dims[1:] if d > 0) if len(dims) > 1 else max(dims[0], 1)
        layers.append(Layer(m.group(1), per_sample, int(m.group(3).replace(",", ""))))
    if not layers:
        raise EstimatorError("torchsummary text: no layer lines like 'Conv2d-1  [-1, 64, 112, 112]  9,408'")
    return tuple(layers), dominant_activation(l.name for l in layers)


def dominant_activation(names: Sequence[str] | object) -> str:
    """The most frequent activation-function name among layer names ("" if none)."""
    counts: dict[str, int] = {}
    for name in names:  # type: ignore[union-attr]
        key = str(name).lower()
        if key in ACTIVATIONS:
            counts[key] = counts.get(key, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else ""
