"""Record the allocation trace of real training iterations without touching real memory.

The recipe (FIELD_NOTES §2, verified with torch 2.13 CPU): build the model on ``meta``, materialise
it with ``to_empty(device="cpu")`` inside ``FakeTensorMode(allow_non_fake_inputs=True)``, and run
full iterations — forward, loss, backward, ``optimizer.step()``, ``zero_grad`` — under a dispatch
mode that sees every tensor an op creates. Fake CPU tensors give the same sizes a GPU run allocates;
``device="cuda"`` fakes abort on backward (pytorch#92627), so CPU fakes it is.

A storage is "allocated" when an op first returns it and "freed" when its last reference dies
(weakref callback), which is exactly when the caching allocator would get the block back.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from estimators.allocator import AllocEvent
from estimators.model_input import (ModelSource, build_model, make_batch, parse_dtype, quiet_fake_tensor_errors,
                                    training_loss)
from estimators.types import EstimatorError

__all__ = ["TrainingTrace", "trace_training", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "adamw", "sgd", "none")


class _AllocationRecorder(TorchDispatchMode):
    """Appends an ``AllocEvent`` for every new storage and for every storage that dies."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[AllocEvent] = []
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._next_key = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.largest_transient_bytes = 0

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self._seen:
            return
        size = storage.nbytes()
        key = self._next_key
        self._next_key += 1
        self._seen[storage] = key
        if size == 0:
            return
        self.events.append(AllocEvent(key, size))
        self.live_bytes += size
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(storage, self._freed, key, size)

    def _freed(self, key: int, size: int) -> None:
        self.events.append(AllocEvent(key, 0))
        self.live_bytes -= size

    def transient(self, size: int) -> None:
        """A buffer alive only during one kernel (allocated after its outputs, freed right away)."""
        key = self._next_key
        self._next_key += 1
        self.events += [AllocEvent(key, size), AllocEvent(key, 0)]
        self.largest_transient_bytes = max(self.largest_transient_bytes, size)
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes + size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        result = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.track, result)
        if func.overloadpacket in _CUDNN_CONV_OPS:
            self.transient(_conv_workspace_bytes(args, result))
        return result


# cuDNN convolutions take a workspace the CPU kernels do not; PyTorch asks the caching allocator
# for it on every call. Its size depends on the algorithm cuDNN picks; the fast ones (implicit
# precomputed GEMM, FFT, Winograd) need buffers on the order of the layer's largest operand, so we
# charge one such buffer per convolution call — a transient that the allocator simulation turns
# into reserved memory only when it does not fit in a cached block.
_CUDNN_CONV_OPS = {torch.ops.aten.convolution, torch.ops.aten.convolution_backward}


def _conv_workspace_bytes(args: Any, result: Any) -> int:
    sizes: list[int] = []
    tree_map_only(torch.Tensor, lambda t: sizes.append(t.numel() * t.element_size()), (args, result))
    return max(sizes, default=0)


@dataclass(frozen=True, slots=True)
class TrainingTrace:
    events: tuple[AllocEvent, ...]
    peak_live_bytes: int  # raw tensor bytes at the peak (what the thesis' FakeTensor estimate saw)
    param_bytes: int
    iterations: int
    largest_workspace_bytes: int  # the largest modelled cuDNN workspace (0 without convolutions)


def _make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    if name == "adam":
        return torch.optim.Adam(params, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if name == "none":
        return None
    raise EstimatorError(f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {name!r})")


def trace_training(source: ModelSource, *, batch_size: int, input_shape: tuple[int, ...] | None = None,
                   sample_input: Any = None, optimizer: str = "adam", dtype: str = "float32",
                   iterations: int = 2) -> TrainingTrace:
    """Allocation trace of ``iterations`` training steps. Mutates a passed-in module (its parameters
    become fake): run it in a forked child (``trace_estimator`` does) when the caller keeps the model."""
    torch_dtype = parse_dtype(dtype)
    model = build_model(source, on_meta=True).to(torch_dtype)
    recorder = _AllocationRecorder()
    with quiet_fake_tensor_errors(), FakeTensorMode(allow_non_fake_inputs=True), recorder:
        model = model.to_empty(device="cpu")
        for tensor in (*model.parameters(), *model.buffers()):
            recorder.track(tensor)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = _make_optimizer(optimizer, params)
        model.train()
        for _ in range(iterations):
            inputs = make_batch(model, batch_size, input_shape, sample_input, torch_dtype)
            for t in inputs:
                if isinstance(t, torch.Tensor):
                    recorder.track(t)
            loss = training_loss(model(*inputs))
            loss.backward()
            del loss, inputs
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
        param_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    return TrainingTrace(tuple(recorder.events), recorder.peak_live_bytes, param_bytes, iterations,
                         recorder.largest_transient_bytes)
