"""Zero-argument factories of public model-zoo architectures that are NOT thesis workloads: the
generality check of the trace path (``hier-sched estimate --model estimators.zoo.public:NAME``).
Each follows its paper's published configuration; none is used to build or tune the workload table."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from estimators.zoo import transformers as tf
from estimators.zoo import vision

__all__ = ["resnet18", "resnet101", "resnet152", "mobilenet_v3_small", "vit_b16", "gpt2_xl", "bert_base_eager"]

VIT_B16 = tf.TransformerConfig(12, 768, 12, vocab=0, max_len=197, causal=False, dropout=0.0)


def resnet18() -> nn.Module:
    return vision.resnet(18)


def resnet101() -> nn.Module:
    return vision.resnet(101)


def resnet152() -> nn.Module:
    return vision.resnet(152)


def mobilenet_v3_small() -> nn.Module:
    return vision.mobilenet_v3_small()


class _VisionTransformer(nn.Module):
    """ViT-B/16 (Dosovitskiy et al. 2020) at 224 px: 16 x 16 patches, a class token, learned
    positions, 12 pre-norm blocks with fused attention, a linear head on the class token."""

    def __init__(self, cfg: tf.TransformerConfig, patch: int = 16, classes: int = 1000):
        super().__init__()
        self.patches = nn.Conv2d(3, cfg.hidden, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.positions = nn.Parameter(torch.zeros(1, cfg.max_len, cfg.hidden))
        self.blocks = nn.Sequential(*(tf.TransformerBlock(cfg) for _ in range(cfg.layers)))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, classes)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1) + self.positions
        return self.head(self.norm(self.blocks(tokens))[:, 0])


def vit_b16() -> nn.Module:
    return _VisionTransformer(VIT_B16)


def gpt2_xl() -> nn.Module:
    return tf.transformer_lm(tf.GPT2_XL)


def bert_base_eager() -> nn.Module:
    """BERT-base with the attention matrices materialised (Hugging Face's "eager" attention)."""
    return tf.transformer_lm(replace(tf.BERT_BASE, attention="eager"))
