"""The sequence classifier of GPUMemNet's transformer data, as PyTorch's own modules build it:
``Embedding(vocab, E)`` -> ``TransformerEncoder`` of post-norm layers (E wide, F feed-forward,
``heads``) -> mean over tokens -> ``Linear(E, classes)``. Used to derive the closed form of the
transformer table (``estimators.transformer_fit``) from our own traces."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EncoderClassifier"]


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, embed: int, layers: int, heads: int, ff: int, classes: int, dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        layer = nn.TransformerEncoderLayer(embed, heads, ff, dropout, batch_first=True)
        # enable_nested_tensor=False: the fast path for padded batches is inference-only anyway.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(embed, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(self.embedding(tokens)).mean(dim=1))
