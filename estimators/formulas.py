"""Closed-form estimates from a model description.

``horus_memory`` is the Horus baseline exactly as the thesis used it (Yeung et al., TPDS 2022):
``(B*A + P + B*G + d) x 4 bytes`` with G = P gradients and no CUDA context — kept to be beaten.

``accounting_memory`` is our complete closed form for kinds without training data (transformers):
the process baseline + cuBLAS workspace of the GPU type, weights + gradients + optimizer state
(16 bytes/parameter for Adam in fp32), and every layer output of the batch kept for backward.
"""

from __future__ import annotations

import time

from hier_sched.core.gpu_types import gpu_type

from estimators.features import MIB, ModelDescription
from estimators.types import MemoryEstimate

__all__ = ["horus_memory", "accounting_memory", "OPTIMIZER_STATE_COPIES"]

OPTIMIZER_STATE_COPIES = {"adam": 2, "adamw": 2, "sgd": 1, "none": 0}
ACCOUNTING_BAND = 0.25  # +-25 %: what a closed form cannot know (kernel temporaries, fragmentation)


def horus_memory(desc: ModelDescription, init_overhead_bytes: int = 0) -> MemoryEstimate:
    start = time.perf_counter()
    b = desc.batch_size
    acts, params = desc.total_activations, desc.total_params
    mib = (b * acts + params + b * params + init_overhead_bytes / 4) * 4 / MIB
    mib = max(mib, 1.0)
    return MemoryEstimate(mib, mib, mib, "horus", time.perf_counter() - start)


def accounting_memory(desc: ModelDescription, *, optimizer: str = "adam", gpu: str = "A100-40GB",
                      baseline_mib: float | None = None) -> MemoryEstimate:
    """``baseline_mib``: the process baseline (``estimators.baseline``); default: the GPU type's."""
    start = time.perf_counter()
    g = gpu_type(gpu)
    base = g.cuda_context_mib if baseline_mib is None else baseline_mib
    bpe = desc.bytes_per_element
    params, acts = desc.total_params, desc.total_activations
    model_bytes = params * bpe * (2 + OPTIMIZER_STATE_COPIES.get(optimizer, 2))
    peak = base + g.cublas_workspace_mib + (model_bytes + desc.batch_size * acts * bpe) / MIB
    return MemoryEstimate(peak, peak * (1 - ACCOUNTING_BAND), peak * (1 + ACCOUNTING_BAND), "accounting",
                          time.perf_counter() - start)
