"""Closed-form estimates from a model description.

``horus_memory`` is the Horus baseline exactly as the thesis used it (Yeung et al., TPDS 2022):
``(B*A + P + B*G + d) x 4 bytes`` with G = P gradients and no CUDA context — kept to be beaten.

``accounting_memory`` is our complete closed form for kinds without training data (transformers):
CUDA context + cuBLAS workspace of the GPU type, weights + gradients + optimizer state
(16 bytes/parameter for Adam in fp32), and every layer output of the batch kept for backward.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hier_sched.core.gpu_types import gpu_type

from estimators.features import MIB, ModelDescription
from estimators.types import MemoryEstimate

if TYPE_CHECKING:
    from estimators.transformer_rows import TransformerShape

__all__ = ["horus_memory", "accounting_memory", "transformer_encoder_memory", "regime_features", "OPTIMIZER_STATE_COPIES",
           "GPUMEMNET_BASELINE_MIB"]

OPTIMIZER_STATE_COPIES = {"adam": 2, "adamw": 2, "sgd": 1, "none": 0}
ACCOUNTING_BAND = 0.25  # +-25 %: what a closed form cannot know (kernel temporaries, fragmentation)


def horus_memory(desc: ModelDescription, init_overhead_bytes: int = 0) -> MemoryEstimate:
    start = time.perf_counter()
    b = desc.batch_size
    acts, params = desc.total_activations, desc.total_params
    mib = (b * acts + params + b * params + init_overhead_bytes / 4) * 4 / MIB
    mib = max(mib, 1.0)
    return MemoryEstimate(mib, mib, mib, "horus", time.perf_counter() - start)


def accounting_memory(desc: ModelDescription, *, optimizer: str = "adam", gpu: str = "A100-40GB") -> MemoryEstimate:
    start = time.perf_counter()
    g = gpu_type(gpu)
    bpe = desc.bytes_per_element
    params, acts = desc.total_params, desc.total_activations
    model_bytes = params * bpe * (2 + OPTIMIZER_STATE_COPIES.get(optimizer, 2))
    peak = g.cuda_context_mib + g.cublas_workspace_mib + (model_bytes + desc.batch_size * acts * bpe) / MIB
    return MemoryEstimate(peak, peak * (1 - ACCOUNTING_BAND), peak * (1 + ACCOUNTING_BAND), "accounting",
                          time.perf_counter() - start)


# The smallest peak any GPUMemNet MLP row recorded (mlp_step1.csv: 1443 MiB for models of a few
# dozen parameters): what a training process holds on their A100 set-up before its tensors — CUDA
# context, cuBLAS/cuDNN handles. Their labels include it, so the transformer table adds it too.
GPUMEMNET_BASELINE_MIB = 1443.0
_TRAINING_GPU = "A100-40GB"
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


def transformer_encoder_memory(shape: "TransformerShape", gpu: str = _TRAINING_GPU) -> MemoryEstimate:
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
    shift = gpu_type(gpu).cuda_context_mib - gpu_type(_TRAINING_GPU).cuda_context_mib
    peak = GPUMEMNET_BASELINE_MIB + shift + max(tensors, 0.0)
    return MemoryEstimate(peak, peak * (1 - TRANSFORMER_BAND), peak * (1 + TRANSFORMER_BAND), "transformer-formula",
                          time.perf_counter() - start)
