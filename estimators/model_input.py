"""Turning the public arguments (model or factory, batch size, input shape or sample) into a model,
a batch, and the training loss — shared by the feature extractor and the tracer so both see the
same computation."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from estimators.types import EstimatorError

__all__ = ["quiet_fake_tensor_errors", "ModelSource", "resolve_factory", "build_model", "MetaBuildFailed", "Batch",
           "make_batch",
           "training_loss", "parse_dtype", "first_tensor", "check_batch_size"]

ModelSource = nn.Module | Callable[[], nn.Module]
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_BATCH = 1 << 20
MAX_ELEMENTS_PER_SAMPLE = 1 << 31


@contextlib.contextmanager
def quiet_fake_tensor_errors() -> Iterator[None]:
    """FakeTensorMode logs a full traceback for every failing op before raising; we report the
    error ourselves (as an ``EstimatorError``), so keep the log quiet while we trace."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise EstimatorError(f"dtype must be one of {', '.join(_DTYPES)} (got {name!r})") from None


def check_batch_size(batch_size: object) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= MAX_BATCH:
        raise EstimatorError(f"batch_size must be an integer in 1..{MAX_BATCH} (got {batch_size!r})")
    return batch_size


def resolve_factory(path: str, what: str = "model factory") -> Callable[[], Any]:
    """``"pkg.module:function"`` -> the callable (imported, not called); ``what`` it is, for messages."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise EstimatorError(f"{what} must look like 'pkg.module:function' (got {path!r})")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EstimatorError(f"cannot import {module_name!r} for {what} {path!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EstimatorError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EstimatorError(f"{what} {path!r} is not callable")
    return obj


class MetaBuildFailed(EstimatorError):
    """A factory that cannot run on the meta device: its ``__init__`` computes with tensor values
    (``torch.unique``, ``.item()``, copying a tensor's data), which meta tensors do not have."""


def build_model(source: ModelSource, *, on_meta: bool) -> nn.Module:
    """The module itself, or the factory's result (built on the meta device when ``on_meta`` —
    no weight memory is touched)."""
    if isinstance(source, nn.Module):
        return source
    if not callable(source):
        raise EstimatorError(f"model must be an nn.Module or a zero-argument callable (got {type(source).__name__})")
    try:
        if on_meta:
            with torch.device("meta"):
                model = source()
        else:
            model = source()
    except Exception as exc:  # a user factory can fail in any way; report it by name
        error = MetaBuildFailed if on_meta else EstimatorError
        raise error(f"model factory failed{' on the meta device' if on_meta else ''}: {type(exc).__name__}: "
                    f"{str(exc)[:300]}") from exc
    if not isinstance(model, nn.Module):
        raise EstimatorError(f"model factory returned {type(model).__name__}, not an nn.Module")
    return model


def _first_leaf(model: nn.Module) -> nn.Module | None:
    return next((m for m in model.modules() if not list(m.children())), None)


class Batch(NamedTuple):
    """The inputs of one forward call: positional and keyword (Hugging Face models take
    ``input_ids=..., decoder_input_ids=...``)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def forward(self, model: nn.Module) -> Any:
        return model(*self.args, **self.kwargs)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.args, *self.kwargs.values()) if isinstance(t, torch.Tensor)]


def make_batch(model: nn.Module, batch_size: int, input_shape: tuple[int, ...] | None, sample_input: Any,
               dtype: torch.dtype, device: str | torch.device = "cpu") -> Batch:
    """The inputs for one forward call. ``sample_input`` is used as given: a tuple is positional
    arguments, a dict keyword arguments, anything else the one argument. Otherwise token models
    (first leaf layer an ``nn.Embedding``) get integer ids below the vocabulary size and everything
    else gets ``randn`` in ``dtype``."""
    if sample_input is not None:
        if isinstance(sample_input, dict):
            return Batch((), dict(sample_input))
        return Batch(sample_input if isinstance(sample_input, tuple) else (sample_input,), {})
    if input_shape is None:
        raise EstimatorError("give input_shape (without the batch dimension) or sample_input")
    shape = tuple(input_shape)
    if not shape or any(not isinstance(d, int) or d < 1 for d in shape):
        raise EstimatorError(f"input_shape must be positive integers without the batch dimension (got {input_shape!r})")
    per_sample = 1
    for d in shape:
        per_sample *= d
    if per_sample > MAX_ELEMENTS_PER_SAMPLE:
        raise EstimatorError(f"input_shape {shape} has {per_sample:.3g} elements per sample; that is not a real input")
    leaf = _first_leaf(model)
    if isinstance(leaf, nn.Embedding):
        return Batch((torch.randint(0, leaf.num_embeddings, (batch_size, *shape), device=device),), {})
    return Batch((torch.randn((batch_size, *shape), dtype=dtype, device=device),), {})


def first_tensor(output: Any) -> torch.Tensor:
    """The tensor a loss is computed from: the output itself, ``logits``, or the first tensor found."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) or hasattr(output, "keys"):
        if "logits" in output:
            return output["logits"]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            try:
                return first_tensor(item)
            except EstimatorError:
                continue
    raise EstimatorError(f"model output has no tensor (got {type(output).__name__})")


def training_loss(output: Any) -> torch.Tensor:
    """Cross-entropy against random targets for a ``(B, C)`` output, else ``output.float().mean()``."""
    out = first_tensor(output)
    if out.dim() == 2 and out.is_floating_point() and out.shape[1] > 1:
        targets = torch.randint(0, out.shape[1], (out.shape[0],), device=out.device)
        return nn.functional.cross_entropy(out.float(), targets)
    return out.float().mean()
