"""The physically meaningful features (what autograd saves, conv inputs recovered from parameter
counts), the vectorised table path, and bad-input handling of estimate-table."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from torch import nn

from estimators.conv_shapes import infer_conv_inputs
from estimators.data import gpumemnet_dir
from estimators.features import FEATURE_NAMES, MIB, Layer, LayerTable, ModelDescription, feature_matrix, features
from estimators.gpumemnet_rows import description_from_row, table_from_rows
from estimators.module_features import description_from_module
from estimators.table import estimate_rows
from estimators.types import EstimatorError


class _DenseBlock(nn.Module):
    """DenseNet-style: every conv reads the concatenation of the image and all earlier outputs
    (a tensor no layer list shows), then a classifier on all channels."""

    def __init__(self, image_channels: int = 3, growth: int = 8, convs: int = 3, classes: int = 10):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(image_channels + i * growth, growth, 3, padding=1) for i in range(convs))
        self.act = nn.GELU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(image_channels + convs * growth, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.cat([x, self.act(conv(x))], dim=1)
        return self.head(self.pool(x).flatten(1))


def _true_conv_inputs(model: nn.Module, shape: tuple[int, ...]) -> list[int]:
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0][0].numel()))
             for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("image_channels", [1, 3])
def test_concatenated_conv_inputs_are_recovered_from_parameter_counts(image_channels):
    model = _DenseBlock(image_channels)
    shape = (image_channels, 12, 12)
    desc = description_from_module(model, batch_size=4, input_shape=shape)
    truth = _true_conv_inputs(model, shape)
    x = dict(zip(FEATURE_NAMES, features(desc)))
    fp32_batch_mib = 4 * 4 / MIB
    assert x["conv_input_mib"] == pytest.approx(sum(truth) * fp32_batch_mib)
    assert x["largest_conv_input_mib"] == pytest.approx(max(truth) * fp32_batch_mib)
    # The image and the two concatenations are tensors the layer list does not show.
    assert x["unlisted_inputs_mib"] >= sum(truth) * fp32_batch_mib
    # The sequential guess (input = the previous layer's output) would be far too small.
    previous_outputs = [l.activations for l in desc.layers if l.name == "GELU"][:-1]
    assert sum(truth[1:]) > 1.5 * sum(previous_outputs)


def test_bias_free_convs_before_batch_norm_are_read_right():
    """torchvision style: conv(bias=False) + BatchNorm; a 1x1 "with bias" reading would claim 9x the channels."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    shape = (3, 10, 10)
    desc = description_from_module(model, batch_size=2, input_shape=shape)
    x = dict(zip(FEATURE_NAMES, features(desc)))
    assert x["conv_input_mib"] == pytest.approx(sum(_true_conv_inputs(model, shape)) * 2 * 4 / MIB)


def test_batch_norm_gives_out_channels_and_neighbours_share_spatial_size():
    # conv(3->16) 8x8, conv(16->16), conv(32->16) (a concatenation), as (out elements, params, known oc)
    convs = [(16 * 64, 16 * (27 + 1), 0), (16 * 64, 16 * (144 + 1), 16), (16 * 64, 16 * (288 + 1), 0)]
    out, params, known = (np.array(c) for c in zip(*convs))
    got = infer_conv_inputs(out, params, known, np.zeros(3, dtype=np.int64))
    assert got.elements.tolist() == [3 * 64, 16 * 64, 32 * 64]
    assert got.spatial.tolist() == [64, 64, 64]
    # A conv whose counts fit no square 3x3/1x1 shape with bias stays unresolved (NaN), not guessed.
    bad = infer_conv_inputs(np.array([1000]), np.array([7]), np.array([0]), np.array([0]))
    assert math.isnan(bad.elements[0])


def test_saved_tensors_follow_what_each_activation_keeps():
    def saved(act: str) -> float:
        layers = (Layer("linear", 100, 1100), Layer(act, 100, 0), Layer("linear", 10, 1010))
        return dict(zip(FEATURE_NAMES, features(ModelDescription(layers, 1))))["saved_mib"]

    # linear saves its input (10 features), ReLU its output (= next linear's input, one tensor);
    # GELU its input (the first linear's output) and the next linear its own input: two tensors.
    assert saved("ReLU") == pytest.approx((10 + 100) * 4 / MIB)
    assert saved("GELU") == pytest.approx((10 + 100 + 100) * 4 / MIB)
    with_dropout = ModelDescription((Layer("linear", 100, 1100), Layer("dropout", 100, 0)), 8)
    assert dict(zip(FEATURE_NAMES, features(with_dropout)))["dropout_mask_mib"] == pytest.approx(8 * 100 / MIB)


@pytest.mark.parametrize(("spelled", "as_class"), [("leaky_relu", "LeakyReLU"), ("swish", "SiLU"), ("Leaky", "LeakyReLU")])
def test_other_spellings_of_an_activation_give_the_same_features(spelled, as_class):
    def vector(act: str) -> list[float]:
        layers = (Layer("conv2d", 4096, 448), Layer(act, 4096, 0), Layer("linear", 10, 650))
        return features(ModelDescription(layers, 4, activation=act))

    assert vector(spelled) == vector(as_class)
    assert vector(spelled) != vector("mystery")  # an unknown name is not silently read as one of them


def _csv_rows(name: str, limit: int) -> list[dict[str, str]]:
    with (gpumemnet_dir() / name).open(newline="") as fh:
        return [r for _, r in zip(range(limit), csv.DictReader(fh))]


@pytest.mark.parametrize("name", ["cnn_partial.csv", "mlp_step1.csv"])
def test_table_path_equals_the_per_row_path(name):
    rows = [r for r in _csv_rows(name, 120) if r["Activations-Params"].strip() != "[]"]
    parsed = table_from_rows(rows)
    assert not parsed.errors and parsed.rows.tolist() == list(range(len(rows)))
    descs = [description_from_row(r) for r in rows]
    together = feature_matrix(LayerTable.from_descriptions(descs))
    np.testing.assert_array_equal(feature_matrix(parsed.layers), together)
    # A model's features do not depend on its neighbours in the table.
    np.testing.assert_array_equal(np.array([features(d) for d in descs]), together)
    assert np.isfinite(together).all()


def test_bad_rows_in_a_table_are_named_and_skipped():
    good = _csv_rows("cnn_partial.csv", 1)[0]
    rows = [
        good,
        dict(good, **{"Activations-Params": "[('conv2d', 5, 3) oops]"}),
        dict(good, **{"Activations-Params": "[('conv2d', 5000000000000, 3)]", "Total Activations": ""}),
        dict(good, **{"Total Parameters": "12"}),
        dict(good, **{"Total Parameters": "lots"}),
        dict(good, **{"Batch Size": "1e9"}),
    ]
    res = estimate_rows("cnn", rows)
    assert res.predicted_mib[0] > 0 and np.isnan(res.predicted_mib[1:]).all()
    assert "not a list like" in res.errors[1]
    assert "absurd" in res.errors[2]
    assert "disagrees" in res.errors[3]
    assert "not a number" in res.errors[4]
    assert "positive integer" in res.errors[5]
    with pytest.raises(EstimatorError, match="row 1"):
        estimate_rows("cnn", rows, strict=True)


def test_label_columns_are_not_needed_for_cnn_tables():
    rows = [{k: v for k, v in r.items() if k in ("Activations-Params", "Batch Size")}
            for r in _csv_rows("cnn_partial.csv", 30) if r["Activations-Params"].strip() != "[]"]
    res = estimate_rows("cnn", rows)
    assert not res.errors and (res.predicted_mib > 0).all() and (res.high_mib >= res.predicted_mib).all()
