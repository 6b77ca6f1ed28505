"""Name -> (factory, input shape without batch) for the architectures we can build."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import nn

from estimators.types import EstimatorError
from estimators.zoo import transformers as tf
from estimators.zoo import detection, vision, vision_more, xlnet

__all__ = ["ZooModel", "ZOO", "build"]


@dataclass(frozen=True, slots=True)
class ZooModel:
    factory: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    kind: str
    optimizer: str = "adam"  # what the workload's script trains with (Adam unless its command says otherwise)


# The CIFAR-100 workloads ran the ImageNet definitions (ImageNet stem: strided 7x7/3x3 conv, and
# max-pool for ResNet) with 100 classes on 32 x 32 images. Evidence: the thesis' recorded FakeTensor
# values grow 0.41 (ResNet-18), 0.35 (MobileNet) and 1.8 (EfficientNet-B0) MiB per sample — 1/49 of
# the ImageNet models' growth at 224 px, as a stride-32 network at 32 px gives; a CIFAR stem (no
# down-sampling before stage 1) would grow ~15x faster. The thesis text (Ch. 6) names the CIFAR
# MobileNet "MobileNet V3 on CIFAR-100"; the recorded FakeTensor intercept (~4 MiB of parameters)
# fits the Small variant (1.6 M parameters with 100 classes), not V2 (2.4 M) or V3-Large (4.3 M).
# Xception ran at 224 px, not its paper's 299: our FakeTensor-thesis trace at 224 px gives 4235 /
# 8375 MiB at batch 32 / 64 against the recorded 4166 / 8325 (at 299 px: 7638 / 15180) — the
# ImageNet loader of the scripts crops 224 px for every model. Inception v3 keeps 299 px (its
# definition requires >= 75 px and torchvision's reference recipe trains it at 299).
ZOO: dict[str, ZooModel] = {
    "resnet18_cifar100": ZooModel(partial(vision.resnet, 18, 100), (3, 32, 32), "cnn"),
    "resnet34_cifar100": ZooModel(partial(vision.resnet, 34, 100), (3, 32, 32), "cnn"),
    "resnet50": ZooModel(partial(vision.resnet, 50), (3, 224, 224), "cnn"),
    "vgg16": ZooModel(vision.vgg16, (3, 224, 224), "cnn"),
    "mobilenet_v2": ZooModel(vision.mobilenet_v2, (3, 224, 224), "cnn"),
    "mobilenet_v3_small_cifar100": ZooModel(partial(vision.mobilenet_v3_small, 100), (3, 32, 32), "cnn"),
    "mnist_cnn": ZooModel(vision.mnist_cnn, (1, 28, 28), "cnn"),
    "xception": ZooModel(vision_more.xception, (3, 224, 224), "cnn"),
    "inception_v3": ZooModel(vision_more.inception_v3, (3, 299, 299), "cnn"),
    "efficientnet_b0": ZooModel(vision_more.efficientnet_b0, (3, 224, 224), "cnn"),
    "efficientnet_b0_cifar100": ZooModel(partial(vision_more.efficientnet_b0, 100), (3, 32, 32), "cnn"),
    "bert_base": ZooModel(partial(tf.transformer_lm, tf.BERT_BASE), (512,), "transformer"),
    "bert_large": ZooModel(partial(tf.transformer_lm, tf.BERT_LARGE), (512,), "transformer"),
    "gpt2_large": ZooModel(partial(tf.transformer_lm, tf.GPT2_LARGE), (512,), "transformer"),
    "xlnet_base": ZooModel(partial(xlnet.xlnet_lm, xlnet.XLNET_BASE), (512,), "transformer"),
    "xlnet_large": ZooModel(partial(xlnet.xlnet_lm, xlnet.XLNET_LARGE), (512,), "transformer"),
    # torchvision's detection reference trains with SGD + momentum (``--opt sgd`` default).
    "maskrcnn_resnet50_fpn": ZooModel(detection.maskrcnn_resnet50_fpn, detection.MASKRCNN_CANVAS, "detection", "sgd"),
}


def build(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise EstimatorError(f"unknown zoo model {name!r}; have {', '.join(sorted(ZOO))}") from None
