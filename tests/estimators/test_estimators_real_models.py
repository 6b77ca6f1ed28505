"""The set-ups the real-model estimates rest on: zoo definitions, data-parallel buckets, XLNet's
training streams — each checked against published or recorded (never measured-peak) figures."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from estimators.trace_estimator import run_trace
from estimators.tracer import _ddp_bucket_sizes
from estimators.zoo import build
from estimators.zoo.xlnet import XLNetConfig, xlnet_lm

MIB = 2**20


@pytest.mark.parametrize("name,published", [
    ("mobilenet_v3_small_cifar100", 1_620_356),  # torchvision's 2,542,856 with a 100-way classifier
    ("resnet18_cifar100", 11_227_812),  # 11,689,512 with 1000 classes
])
def test_cifar_workloads_use_the_imagenet_definitions(name, published):
    with torch.device("meta"):
        model = build(name).factory()
    assert sum(p.numel() for p in model.parameters()) == published


def test_cifar_resnet_grows_like_the_recorded_faketensor_values():
    """Recorded FakeTensor (thesis) for resnet18_cifar100: 54 / 93 MiB at batch 32 / 128, i.e.
    0.41 MiB per sample; an ImageNet stem at 32 px gives that, a CIFAR stem ~15x more."""
    z = build("resnet18_cifar100")
    live = [run_trace(z.factory, batch_size=b, input_shape=z.input_shape, iterations=1, optimizer="none")
            .peak_live_bytes / MIB for b in (32, 128)]
    assert (live[1] - live[0]) / 96 == pytest.approx(0.41, rel=0.2)


def test_ddp_buckets_hold_one_more_copy_of_the_gradients():
    params = [nn.Parameter(torch.empty(n)) for n in (10, 3 * MIB, 7 * MIB, 100)]
    sizes = _ddp_bucket_sizes(params)
    assert sum(sizes) == sum(p.numel() for p in params)
    assert sizes[0] == 100 + 7 * MIB  # reverse order; the first bucket closes past 1 MiB

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))

    single = run_trace(mlp, batch_size=8, input_shape=(512,))
    ddp = run_trace(mlp, batch_size=8, input_shape=(512,), data_parallel=True)
    extra = ddp.peak_allocated_bytes - single.peak_allocated_bytes
    assert extra == pytest.approx(single.param_bytes, rel=0.02)


def test_xlnet_query_stream_costs_memory_only_when_trained_with_permutations():
    tiny = XLNetConfig(2, 64, 4, 128, vocab=100)
    content = run_trace(lambda: xlnet_lm(tiny), batch_size=4, input_shape=(64,))
    two_stream = run_trace(lambda: xlnet_lm(XLNetConfig(2, 64, 4, 128, vocab=100, two_stream=True)), batch_size=4,
                           input_shape=(64,))
    assert two_stream.peak_allocated_bytes > 1.3 * content.peak_allocated_bytes


def test_mask_rcnn_matches_torchvisions_parameter_count():
    """torchvision publishes 44,401,393 parameters with a frozen (pre-trained) backbone, whose
    BatchNorm affines are buffers; trained from scratch they are 53,120 parameters more."""
    with torch.device("meta"):
        model = build("maskrcnn_resnet50_fpn").factory()
    assert sum(p.numel() for p in model.parameters()) == 44_401_393 + 53_120


@pytest.mark.parametrize("name,published", [
    ("vit_b16", 86_567_656), ("resnet101", 44_549_160), ("resnet152", 60_192_808), ("mobilenet_v3_small", 2_542_856),
])
def test_public_zoo_matches_published_parameter_counts(name, published):
    from estimators.zoo import public

    with torch.device("meta"):
        model = getattr(public, name)()
    assert sum(p.numel() for p in model.parameters()) == published


def test_winograd_workspace_only_for_ungrouped_3x3_stride_1_convolutions():
    from estimators.tracer import _winograd_workspace_bytes

    conv = torch.ops.aten.convolution.default
    x = torch.empty(2, 64, 224, 224, device="meta")

    def args(w, stride=(1, 1), groups=1):
        return (x, w, None, list(stride), [1, 1], [1, 1], False, [0, 0], groups)

    w3 = torch.empty(64, 64, 3, 3, device="meta")
    # F(4x4, 3x3): 56 x 56 tiles of 6 x 6 values for every input and output plane, plus the filters
    assert _winograd_workspace_bytes(conv, args(w3)) == 36 * (56 * 56 * 2 * 128 + 64 * 64) * 4
    assert _winograd_workspace_bytes(conv, args(w3, stride=(2, 2))) == 0
    assert _winograd_workspace_bytes(conv, args(torch.empty(64, 1, 3, 3, device="meta"), groups=64)) == 0
    assert _winograd_workspace_bytes(conv, args(torch.empty(64, 64, 1, 1, device="meta"))) == 0
