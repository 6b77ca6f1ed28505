"""One feature vector for the feature-based estimators, from three kinds of input.

A model is described by its layer list — ``(layer name, output elements per sample, parameters)``,
exactly GPUMemNet's ``Activations-Params`` column — plus the batch size. ``gpumemnet_rows`` reads
that column, ``description_from_module`` (in ``module_features``) records it with forward
hooks, ``layers_from_torchsummary`` parses a torchsummary printout; all three end in ``features``
so the ML models see identical numbers whichever way a job was described.

Features are computed for many models at once (``LayerTable`` -> ``feature_matrix``): tables
(``gpumemnet_rows.table_from_rows``) must run at >= 10^4 rows/s, and one model is a table of one row, so there is
a single implementation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
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
    "canonical_activation",
    "features",
    "feature_matrix",
    "LayerTable",
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


# Other spellings of the same functions: GPUMemNet's generator options and file names say
# "leaky_relu" and "swish" where its CSV columns carry the class names (LeakyReLU, SiLU).
_ACTIVATION_ALIASES = {"leaky_relu": "leakyrelu", "leaky": "leakyrelu", "swish": "silu",
                       "hard_swish": "hardswish", "hard_sigmoid": "hardsigmoid"}


def canonical_activation(name: str) -> str:
    """A name as ``ACTIVATIONS`` spells it when it is an activation function (lower-case otherwise)."""
    key = name.strip().lower().replace(" ", "")
    return _ACTIVATION_ALIASES.get(key, key)


@lru_cache(maxsize=1024)
def layer_family(name: str) -> str:
    """Map a layer name from any source (CSV, module class, torchsummary) to its family."""
    key = canonical_activation(name)
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


@lru_cache(maxsize=256)
def _activation_code(activation: str) -> float:  # cached: called once per row of a table
    act = canonical_activation(activation)
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
        key = canonical_activation(str(name))
        if key in ACTIVATIONS:
            counts[key] = counts.get(key, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else ""
