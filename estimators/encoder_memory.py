"""Peak memory of training GPUMemNet's encoder classifier, in closed form from its shape.

``TransformerShape`` is the model (``Embedding`` -> post-norm ``TransformerEncoder`` ->
``Linear``) and its training batch; ``transformer_encoder_memory`` turns it into the MiB
GPUMemNet's labels measure. The constants are fitted to our own traces by
``python -m estimators.transformer_fit``; ``transformer_rows`` reads shapes from table rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hier_sched.core.gpu_types import gpu_type

from estimators.features import MIB
from estimators.types import LABEL_GPU, MemoryEstimate

__all__ = ["TransformerShape", "transformer_encoder_memory", "regime_features", "GPUMEMNET_BASELINE_MIB",
           "TRANSFORMER_BAND"]


@dataclass(frozen=True, slots=True)
class TransformerShape:
    batch: int
    seq: int
    embed: int
    layers: int
    heads: int
    ff: int
    vocab: int
    classes: int

    @property
    def params(self) -> int:
        """Every trainable parameter: embedding, per layer in/out projections (4E^2 + 4E), the two
        FFN linears (2EF + F + E) and two LayerNorms (4E), and the classifier."""
        e, f = self.embed, self.ff
        per_layer = 4 * e * e + 4 * e + 2 * e * f + f + e + 4 * e
        return self.vocab * e + self.layers * per_layer + e * self.classes + self.classes


# The smallest peak any GPUMemNet MLP row recorded (mlp_step1.csv: 1443 MiB for models of a few
# dozen parameters): what a training process holds on their A100 set-up before its tensors — CUDA
# context, cuBLAS/cuDNN handles. Their labels include it, so the transformer table adds it too.
GPUMEMNET_BASELINE_MIB = 1443.0
# Fitted by ``python -m estimators.transformer_fit`` to our own traces of 50 random encoder
# classifiers (median 2.8 %, max 13.1 % off the simulated reserved memory); see that module.
_ENCODER_FORM = (5.0015, 21.7631, 13.1603, 71.6524, 10.2620, -4.9430, -0.2986)
TRANSFORMER_BAND = 0.15


def regime_features(params: float, vocab_embed: float, batch: int, seq: int, embed: int, ff: int,
                    layers: int) -> tuple[float, ...]:
    """(W, L*T*E, L*T*F, T*E, V*E*4) in MiB-of-fp32 units, T = batch x seq tokens."""
    tokens = batch * seq
    return (4.0 * params / MIB, layers * tokens * embed / MIB, layers * tokens * ff / MIB, tokens * embed / MIB,
            4.0 * vocab_embed / MIB)


def transformer_encoder_memory(shape: "TransformerShape", gpu: str = LABEL_GPU) -> MemoryEstimate:
    """Peak MiB of training GPUMemNet's encoder classifier (Adam, fp32) as their labels measure it.

    Two regimes, the larger wins: the start of backward (weights, Adam moments and every saved
    activation: per layer ~ T x E and T x F terms, T = batch x seq tokens; attention as the GPU's
    fused kernels keep it, no S x S matrix) and the optimizer step (weights, gradients, moments
    and foreach temporaries, cheaper per parameter for the embedding table)."""
    start = time.perf_counter()
    w, lte, ltf, te, ve = regime_features(shape.params, shape.vocab * shape.embed, shape.batch, shape.seq,
                                          shape.embed, shape.ff, shape.layers)
    c = _ENCODER_FORM
    tensors = max(c[0] * w + c[1] * lte + c[2] * ltf + c[3] * te, c[4] * w + c[5] * ve) + c[6]
    shift = gpu_type(gpu).cuda_context_mib - gpu_type(LABEL_GPU).cuda_context_mib
    peak = GPUMEMNET_BASELINE_MIB + shift + max(tensors, 0.0)
    return MemoryEstimate(peak, peak * (1 - TRANSFORMER_BAND), peak * (1 + TRANSFORMER_BAND), "transformer-formula",
                          time.perf_counter() - start)
