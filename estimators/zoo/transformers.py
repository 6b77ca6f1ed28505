"""Transformers with the published sizes: BERT (Devlin et al. 2018) and GPT-2 (Radford et al.
2019).

Attention is "fused" by default: ``scaled_dot_product_attention`` without dropout, so the CPU trace
takes the flash-style path a GPU runs (FIELD_NOTES §2: on CPU with dropout SDPA takes the math
path and stores the L x L matrix, +25-46 % memory — route to the flash-style kernel to mimic the
GPU). Hugging Face's BERT and GPT-2 use SDPA by default on the PyTorch 2.x stack the thesis ran.
``attention="eager"`` materialises scores, softmax and dropout (older Hugging Face versions)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["TransformerConfig", "TransformerBlock", "transformer_lm", "BERT_BASE", "BERT_LARGE", "GPT2_LARGE", "GPT2_XL"]


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    layers: int
    hidden: int
    heads: int
    vocab: int
    max_len: int
    causal: bool
    attention: str = "fused"  # or "eager"
    dropout: float = 0.1


BERT_BASE = TransformerConfig(12, 768, 12, 30522, 512, causal=False)
BERT_LARGE = TransformerConfig(24, 1024, 16, 30522, 512, causal=False)
GPT2_LARGE = TransformerConfig(36, 1280, 20, 50257, 1024, causal=True)
GPT2_XL = TransformerConfig(48, 1600, 25, 50257, 1024, causal=True)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1, self.ln2 = nn.LayerNorm(cfg.hidden), nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(), nn.Linear(4 * cfg.hidden, cfg.hidden),
                                 nn.Dropout(cfg.dropout))
        self.attention_dropout = nn.Dropout(cfg.dropout)

    def _attend(self, q, k, v):
        if self.cfg.attention == "fused":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.cfg.causal)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.cfg.causal:
            t = q.shape[-2]
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return self.attention_dropout(scores.softmax(dim=-1)) @ v

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.cfg.heads, c // self.cfg.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self._attend(q, k, v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class _LanguageModel(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.max_len, cfg.hidden)
        self.blocks = nn.Sequential(*(TransformerBlock(cfg) for _ in range(cfg.layers)))
        self.ln = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in BERT's MLM head and GPT-2

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        logits = self.head(self.ln(self.blocks(self.tokens(ids) + self.positions(pos))))
        return logits.view(-1, logits.shape[-1])  # (B*L, vocab): the loss is token-level cross-entropy


def transformer_lm(cfg: TransformerConfig) -> nn.Module:
    return _LanguageModel(cfg)
