"""Derive the transformer table's closed form from our own traces: ``python -m estimators.transformer_fit``.

A table must estimate >= 10^4 rows/s, a trace takes seconds, so ``--kind transformer`` uses a
closed form in the shape (``formulas.transformer_encoder_memory``). Its constants come from here:
``EncoderClassifier`` models of random shapes in the ranges GPUMemNet's generator uses are traced
(2 Adam iterations through the caching-allocator simulation, attention as a GPU runs it), and the
two-regime form below is fitted to the simulated reserved memory. Fixed seeds: the same constants
every run. Nothing measured on a GPU is fitted here.
"""

from __future__ import annotations

import random

import numpy as np

from hier_sched.core.gpu_types import gpu_type

from estimators.encoder_memory import regime_features

__all__ = ["sample_shapes", "fit"]

SEEDS_AND_COUNTS = ((1, 30), (2, 20))


def sample_shapes(seed: int, count: int) -> list[dict[str, int]]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        shape = dict(embed=rng.choice([128, 256, 512, 768, 1024]), heads=rng.choice([2, 4, 8, 16]),
                     layers=rng.randint(2, 10), ff=rng.randint(256, 3072), seq=rng.choice([64, 128, 256, 512]),
                     batch=rng.choice([8, 16, 32, 64]), vocab=rng.randint(100_000, 1_000_000),
                     classes=rng.randint(100, 1000))
        if shape["embed"] % shape["heads"] == 0:
            shapes.append(shape)
    return shapes


def _trace_reserved(shape: dict[str, int]) -> float:
    import torch

    from estimators.trace_estimator import trace_memory
    from estimators.zoo.encoder_classifier import EncoderClassifier

    s = shape
    est = trace_memory(lambda: EncoderClassifier(s["vocab"], s["embed"], s["layers"], s["heads"], s["ff"], s["classes"]),
                       batch_size=s["batch"], sample_input=torch.randint(0, s["vocab"], (s["batch"], s["seq"])),
                       timeout_s=300)
    g = gpu_type("A100-40GB")
    return est.peak_mib - g.cuda_context_mib - g.cublas_workspace_mib


def fit() -> tuple[np.ndarray, float, float]:
    """(constants, median and max relative error on the traced shapes)."""
    from scipy.optimize import least_squares

    from estimators.encoder_memory import TransformerShape

    xs, ys = [], []
    for seed, count in SEEDS_AND_COUNTS:
        for s in sample_shapes(seed, count):
            shape = TransformerShape(s["batch"], s["seq"], s["embed"], s["layers"], s["heads"], s["ff"], s["vocab"],
                                     s["classes"])
            xs.append(regime_features(shape.params, shape.vocab * shape.embed, shape.batch, shape.seq, shape.embed,
                                      shape.ff, shape.layers))
            ys.append(_trace_reserved(s))
    x, y = np.array(xs), np.array(ys)

    def model(c: np.ndarray) -> np.ndarray:
        w, lte, ltf, te, ve = x.T
        return np.maximum(c[0] * w + c[1] * lte + c[2] * ltf + c[3] * te, c[4] * w + c[5] * ve) + c[6]

    result = least_squares(lambda c: (model(c) - y) / y, [3, 38, 9, 4, 5, 0, 0])
    err = np.abs(model(result.x) / y - 1)
    return result.x, float(np.median(err)), float(err.max())


if __name__ == "__main__":
    constants, median, worst = fit()
    print("constants:", ", ".join(f"{c:.4f}" for c in constants))
    print(f"relative error on the traced shapes: median {median:.1%}, max {worst:.1%}")
