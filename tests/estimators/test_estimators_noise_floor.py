"""The noise-floor analysis: its trade-off arithmetic and the rebuild of GPUMemNet's sequential CNNs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from estimators.ml import UNDER_TOLERANCE
from estimators.noise_floor import UNDER_TARGET, factor_tradeoff, rebuild_sequential

NAME = ("input_channels:3_num_classes:10_depth:2_arch:uniform_base_filters:8_batch:4_input_size:16_act:relu_"
        "dropout:0.25_dropout:True_batchnorm:True.out")


def _row(layers: str, name: str = NAME) -> dict[str, str]:
    return {"Filename": name, "Activations-Params": layers}


def test_factor_meets_the_under_target_exactly_where_it_says() -> None:
    ratios = np.random.default_rng(0).lognormal(0.0, 0.1, 20_000)  # truth / prediction
    plain, factor, at_factor = factor_tradeoff(ratios)
    under = np.mean(factor < UNDER_TOLERANCE * ratios)  # prediction x factor < 0.95 x truth
    assert under == pytest.approx(UNDER_TARGET, abs=0.002)
    assert plain == pytest.approx(0.1 * 0.6745, rel=0.05)  # median |lognormal - 1| ~ sigma x z(0.75)
    assert at_factor > plain  # raising every estimate costs accuracy


def test_no_spread_needs_no_more_than_the_tolerance() -> None:
    plain, factor, at_factor = factor_tradeoff(np.ones(100))
    assert plain == 0.0 and factor == pytest.approx(UNDER_TOLERANCE) and at_factor == pytest.approx(0.05)


def test_a_generator_chain_is_rebuilt_layer_for_layer() -> None:
    layers = ("[('conv2d', 2048, 224), ('batchnorm2d', 2048, 16), ('ReLU', 2048, 0), ('dropout', 2048, 0), "
              "('conv2d', 2048, 584), ('ReLU', 2048, 0), ('adaptive_avg_pool2d', 8, 0), ('linear', 10, 90), "
              "('softmax', 10, 0)]")
    model, shape, batch = rebuild_sequential(_row(layers))
    assert shape == (3, 16, 16) and batch == 4
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(3, 8), (8, 8)]
    assert sum(p.numel() for p in model.parameters()) == 224 + 16 + 584 + 90
    dropout = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert dropout.p == 0.25
    assert model(torch.randn(batch, *shape)).shape == (batch, 10)


def test_rows_that_are_not_a_plain_chain_are_left_out() -> None:
    shortcut = "[('conv2d', 2048, 224), ('conv2d', 2048, 32), ('ReLU', 2048, 0)]"  # a 1x1 shortcut conv
    assert rebuild_sequential(_row(shortcut)) is None
    unknown = "[('conv2d', 2048, 224), ('maxpool2d', 512, 0)]"
    assert rebuild_sequential(_row(unknown)) is None
