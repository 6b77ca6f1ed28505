"""Name -> (factory, input shape without batch) for the architectures we can build."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import nn

from estimators.types import EstimatorError
from estimators.zoo import transformers as tf
from estimators.zoo import vision, vision_more, xlnet

__all__ = ["ZooModel", "ZOO", "build"]


@dataclass(frozen=True, slots=True)
class ZooModel:
    factory: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    kind: str


ZOO: dict[str, ZooModel] = {
    "resnet18_cifar100": ZooModel(partial(vision.resnet, 18, 100, True), (3, 32, 32), "cnn"),
    "resnet34_cifar100": ZooModel(partial(vision.resnet, 34, 100, True), (3, 32, 32), "cnn"),
    "resnet50": ZooModel(partial(vision.resnet, 50), (3, 224, 224), "cnn"),
    "vgg16": ZooModel(vision.vgg16, (3, 224, 224), "cnn"),
    "mobilenet_v2": ZooModel(vision.mobilenet_v2, (3, 224, 224), "cnn"),
    "mobilenet_v2_cifar100": ZooModel(partial(vision.mobilenet_v2, 100, True), (3, 32, 32), "cnn"),
    "mnist_cnn": ZooModel(vision.mnist_cnn, (1, 28, 28), "cnn"),
    "xception": ZooModel(vision_more.xception, (3, 299, 299), "cnn"),
    "inception_v3": ZooModel(vision_more.inception_v3, (3, 299, 299), "cnn"),
    "efficientnet_b0": ZooModel(vision_more.efficientnet_b0, (3, 224, 224), "cnn"),
    "efficientnet_b0_cifar100": ZooModel(partial(vision_more.efficientnet_b0, 100), (3, 32, 32), "cnn"),
    "bert_base": ZooModel(partial(tf.transformer_lm, tf.BERT_BASE), (512,), "transformer"),
    "bert_large": ZooModel(partial(tf.transformer_lm, tf.BERT_LARGE), (512,), "transformer"),
    "gpt2_large": ZooModel(partial(tf.transformer_lm, tf.GPT2_LARGE), (1024,), "transformer"),
    "xlnet_base": ZooModel(partial(xlnet.xlnet_lm, xlnet.XLNET_BASE), (512,), "transformer"),
    "xlnet_large": ZooModel(partial(xlnet.xlnet_lm, xlnet.XLNET_LARGE), (512,), "transformer"),
}


def build(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise EstimatorError(f"unknown zoo model {name!r}; have {', '.join(sorted(ZOO))}") from None
