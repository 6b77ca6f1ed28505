"""XLNet (Yang et al. 2019) with relative attention whose content and relative-position (over 2L
offsets, then shifted) score terms are materialised per layer, as the Hugging Face implementation
does (it has no fused attention path).

Two training set-ups, chosen by the config:
- ``two_stream=True``: permutation language modelling — a content stream ``h`` and a query stream
  ``g`` that attends to ``h``, both over the full sequence, as ``DataCollatorForPermutationLanguage
  Modeling`` predicts every position; the segment score term is added when ``segment_ids``.
- ``two_stream=False`` (the ``XLNET_BASE``/``XLNET_LARGE`` defaults): what Hugging Face's
  ``XLNetLMHeadModel(input_ids, labels=...)`` runs when a script passes neither ``perm_mask`` nor
  ``target_mapping`` nor ``token_type_ids`` — only the content stream, no segment term, every
  position predicted from ``h``. The thesis' ``xlnet_*_cased.py`` belong to the same
  ``*_on_wiki`` family as its BERT/GPT-2 scripts (same dataset, plain ``input_ids``/``labels``
  batches), so this is the set-up they ran."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["XLNetConfig", "XLNET_BASE", "XLNET_LARGE", "xlnet_lm"]


@dataclass(frozen=True, slots=True)
class XLNetConfig:
    layers: int
    hidden: int
    heads: int
    inner: int
    vocab: int = 32000
    dropout: float = 0.1
    two_stream: bool = False
    segment_ids: bool = False


XLNET_BASE = XLNetConfig(12, 768, 12, 3072)
XLNET_LARGE = XLNetConfig(24, 1024, 16, 4096)


class _TwoStreamLayer(nn.Module):
    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        d, h = cfg.hidden, cfg.heads
        self.heads, self.head_dim = h, d // h
        self.segment_ids = cfg.segment_ids
        self.q, self.k, self.v, self.o, self.r = (nn.Linear(d, d, bias=False) for _ in range(5))
        self.r_w_bias, self.r_r_bias, self.r_s_bias = (nn.Parameter(torch.zeros(h, d // h)) for _ in range(3))
        self.seg_embed = nn.Parameter(torch.zeros(2, h, d // h))
        self.attn_norm, self.ff_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, cfg.inner), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.inner, d),
                                nn.Dropout(cfg.dropout))
        self.dropout = nn.Dropout(cfg.dropout)

    def _split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def _attend(self, q, k, v, k_pos, same_segment):
        t = q.shape[-2]
        content = (q + self.r_w_bias[:, None]) @ k.transpose(-2, -1)
        position = (q + self.r_r_bias[:, None]) @ k_pos.transpose(-2, -1)  # (B, H, L, 2L)
        b, h = position.shape[:2]
        position = position.reshape(b, h, 2 * t, t)[:, :, 1:].reshape(b, h, t, 2 * t - 1)[..., :t]  # rel_shift
        scores = content + position
        if same_segment is not None:
            seg = (q + self.r_s_bias[:, None]) @ self.seg_embed.permute(1, 2, 0)  # (B, H, L, 2)
            scores = scores + seg[..., :1] * same_segment + seg[..., 1:] * (1 - same_segment)
        probs = (scores / math.sqrt(self.head_dim)).softmax(-1)
        return self.dropout(probs) @ v

    def _post(self, stream, attended):
        b, _, t, _ = attended.shape
        out = self.attn_norm(stream + self.dropout(self.o(attended.transpose(1, 2).reshape(b, t, -1))))
        return self.ff_norm(out + self.ff(out))

    def forward(self, h, g, pos, same_segment):
        k, v, k_pos = self._split(self.k(h)), self._split(self.v(h)), self._split(self.r(pos))
        new_h = self._post(h, self._attend(self._split(self.q(h)), k, v, k_pos, same_segment))
        if g is None:
            return new_h, None
        return new_h, self._post(g, self._attend(self._split(self.q(g)), k, v, k_pos, same_segment))


class _XLNetLM(nn.Module):
    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.layers = nn.ModuleList(_TwoStreamLayer(cfg) for _ in range(cfg.layers))
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)
        self.head.weight = self.tokens.weight

    def _relative_positions(self, t: int, device: torch.device) -> torch.Tensor:
        offsets = torch.arange(t, -t, -1.0, device=device)
        inv_freq = 1 / 10000 ** (torch.arange(0, self.cfg.hidden, 2.0, device=device) / self.cfg.hidden)
        angles = offsets[:, None] * inv_freq[None]
        return torch.cat([angles.sin(), angles.cos()], -1)[None]  # (1, 2L, d)

    def forward(self, ids):
        b, t = ids.shape
        h = self.dropout(self.tokens(ids))
        g = self.dropout(self.mask_emb.expand(b, t, -1)) if self.cfg.two_stream else None
        pos = self.dropout(self._relative_positions(t, ids.device)).expand(b, -1, -1)
        same_segment = torch.ones(b, 1, t, t, device=ids.device) if self.cfg.segment_ids else None
        for layer in self.layers:
            h, g = layer(h, g, pos, same_segment)
        out = g if g is not None else h
        return self.head(self.dropout(out)).view(b * t, -1)  # every position is a prediction target


def xlnet_lm(cfg: XLNetConfig) -> nn.Module:
    return _XLNetLM(cfg)
