"""One feature vector for the feature-based estimators, from three kinds of input.

A model is described by its layer list — ``(layer name, output elements per sample, parameters)``,
exactly GPUMemNet's ``Activations-Params`` column — plus the batch size. ``layers_from_row``
reads that column, ``layers_from_module`` (in ``module_features``) records it with forward hooks,
``layers_from_torchsummary`` parses a torchsummary printout; all three end in ``features`` so
the ML models see identical numbers whichever way a job was described.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from estimators.types import EstimatorError

__all__ = [
    "Layer",
    "ModelDescription",
    "FEATURE_NAMES",
    "ACTIVATIONS",
    "layer_family",
    "features",
    "description_from_row",
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
)


def features(desc: ModelDescription) -> list[float]:
    """The feature vector (order: ``FEATURE_NAMES``). Sizes are in MiB so the trees split on
    quantities that mean something physically (bytes the GPU has to hold)."""
    b = desc.batch_size
    scale = desc.bytes_per_element / MIB
    acts = desc.total_activations
    counts = Counter(map(layer_family, (l.name for l in desc.layers)))
    param_mib = desc.total_params * scale
    batch_act_mib = b * acts * scale
    act = desc.activation.lower()
    return [
        float(b),
        math.log2(b),
        param_mib,
        acts * scale,
        batch_act_mib,
        b * desc.max_activations * scale,
        b * desc.layers[0].activations * scale,
        3 * param_mib,  # gradients + Adam's two moments
        batch_act_mib + 2 * param_mib,  # Horus' B*A + P + G
        float(len(desc.layers)),
        *(float(counts[f]) for f in FAMILIES),
        float(ACTIVATIONS.index(act)) if act in ACTIVATIONS else -1.0,
    ]


# --- GPUMemNet CSV rows --------------------------------------------------------------------

_TUPLE = r"\(\s*['\"]([^'\"]*)['\"]\s*,\s*(\d+)\s*,\s*(\d+)\s*\)"
_LAYER_TUPLE = re.compile(_TUPLE)
_UNCAPTURED = _TUPLE.replace("(", "(?:").replace("\\(?:", "\\(")  # same shape, no groups
_LAYER_LIST = re.compile(rf"\[\s*(?:{_UNCAPTURED}\s*,\s*)*(?:{_UNCAPTURED})?\s*\]")


def _parse_layer_list(text: str, where: str) -> tuple[Layer, ...]:
    """Parse ``[('linear', 629, 792540), ...]``. A regex, not ``ast.literal_eval``: 20x faster,
    and batch tables must run at >= 10k rows/s. A tuple the regex did not match means a
    malformed list."""
    body = text.strip()
    if not _LAYER_LIST.fullmatch(body):
        raise EstimatorError(f"{where}: 'Activations-Params' is not a list like [('linear', 629, 792540), ...]"
                             f" (got {body[:60]!r})")
    matches = _LAYER_TUPLE.findall(body)
    if not matches:
        raise EstimatorError(f"{where}: 'Activations-Params' is empty")
    names, acts, params = zip(*matches)
    # tuple.__new__ through _make: a third of the cost of calling Layer(...) per layer.
    return tuple(map(Layer._make, zip(names, map(int, acts), map(int, params))))


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


def description_from_row(row: Mapping[str, object], where: str = "row") -> ModelDescription:
    """A GPUMemNet-schema row -> ``ModelDescription``. The per-layer list is the source of truth;
    ``Total Activations``/``Total Parameters``, when present, must agree with it (a mismatch means
    the row is corrupt, and we say so instead of guessing)."""
    missing = [c for c in REQUIRED_COLUMNS if row.get(c) in (None, "")]
    if missing:
        raise EstimatorError(f"{where}: missing value in column(s) {', '.join(map(repr, missing))}")
    layers = _parse_layer_list(str(row["Activations-Params"]), where)
    batch = _number(row, "Batch Size", where)
    if batch < 1 or batch != int(batch):
        raise EstimatorError(f"{where}: 'Batch Size' must be a positive integer (got {batch})")
    act = str(row.get("Activation Function") or "").strip().lower()
    desc = ModelDescription(layers, int(batch), act if act != "none" else "")
    for column, total in (("Total Activations", desc.total_activations), ("Total Parameters", desc.total_params)):
        if row.get(column) not in (None, ""):
            given = _number(row, column, where)
            if abs(given - total) > max(1.0, 1e-6 * total):
                raise EstimatorError(f"{where}: {column!r} = {given:.0f} disagrees with the layer list ({total})")
    return desc


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
