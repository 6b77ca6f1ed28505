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
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
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
        if is_traceable_wrapper_subclass(tensor):
            # A DTensor, say: no memory of its own (its storage would claim the global size), but
            # the tensors it wraps (its local shard), made inside its dispatch where this mode does not see them.
            for name in tensor.__tensor_flatten__()[0]:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self.track(inner)
            return
        if tensor.device.type == "meta":  # a model built on meta (to be materialized later) holds no memory
            return
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
        """A buffer alive only during one kernel (allocated after its outputs, freed right away).
        Not a tensor, so not in ``peak_live_bytes`` (the thesis' FakeTensor count of tensors)."""
        key = self._next_key
        self._next_key += 1
        self.events += [AllocEvent(key, size, workspace=True), AllocEvent(key, 0)]
        self.largest_transient_bytes = max(self.largest_transient_bytes, size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        result = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.track, result)
        if func.overloadpacket in _CUDNN_CONV_OPS:
            self.transient(_conv_workspace_bytes(func, args, result))
        return result


# cuDNN convolutions take a workspace the CPU kernels do not; PyTorch asks the caching allocator
# for it on every call — a transient that the allocator simulation turns into reserved memory only
# when it does not fit in a cached block. Its size depends on the algorithm cuDNN picks:
# - ungrouped 3x3 stride-1 convolutions run the non-fused Winograd algorithm (the fastest for them;
#   pytorch#49207 shows cuDNN picking Winograd for VGG-16), whose workspace holds the transformed
#   tiles: F(4x4, 3x3) maps every 4x4 output tile to a 6x6 tile, so input and output planes are
#   stored at 36/16 = 2.25x their size, plus 36 values per filter pair (Lavin & Gray 2016);
# - the other fast algorithms (implicit precomputed GEMM, FFT) need buffers on the order of the
#   layer's largest operand, so every other convolution is charged one such buffer.
# A late large workspace matters even when little is live: freed activations sit in separate
# segments (>= 10 MiB blocks get their own), so a workspace larger than each of them is a new one.
_CUDNN_CONV_OPS = {torch.ops.aten.convolution, torch.ops.aten.convolution_backward}
_WINOGRAD_TILE, _WINOGRAD_TRANSFORMED = 4, 36  # F(4x4, 3x3): 4x4 output tiles, 6x6 transformed tiles


def _conv_workspace_bytes(func: Any, args: Any, result: Any) -> int:
    winograd = _winograd_workspace_bytes(func, args)
    if winograd:
        return winograd
    sizes: list[int] = []
    tree_map_only(torch.Tensor, lambda t: sizes.append(t.numel() * t.element_size()), (args, result))
    return max(sizes, default=0)


def _winograd_workspace_bytes(func: Any, args: Any) -> int:
    """The non-fused Winograd workspace of a 2-D, ungrouped, 3x3, stride-1, undilated convolution, else 0."""
    if func.overloadpacket is torch.ops.aten.convolution:
        x, w, stride, padding, dilation, transposed, groups = (args[0], args[1], args[3], args[4], args[5], args[6],
                                                               args[8])
    else:  # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, ...)
        x, w, stride, padding, dilation, transposed, groups = (args[1], args[2], args[4], args[5], args[6], args[7],
                                                               args[9])
    if (x.dim() != 4 or transposed or groups != 1 or tuple(w.shape[-2:]) != (3, 3)
            or any(s != 1 for s in stride) or any(d != 1 for d in dilation)):
        return 0
    batch, c_in, height, width = x.shape
    c_out = w.shape[0]
    out_h, out_w = height + 2 * padding[0] - 2, width + 2 * padding[1] - 2
    tiles = -(-out_h // _WINOGRAD_TILE) * -(-out_w // _WINOGRAD_TILE)  # each needs a 6x6 input and output tile
    values = _WINOGRAD_TRANSFORMED * (tiles * batch * (c_in + c_out) + c_in * c_out)
    return values * x.element_size()


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


# DistributedDataParallel (defaults: ``bucket_cap_mb=25``, first bucket 1 MiB,
# ``gradient_as_bucket_view=False``) allocates flat all-reduce buckets holding one more copy of every
# gradient, filled in reverse parameter order, for the life of the job: per-GPU memory of a
# data-parallel job is the single-GPU footprint plus these buckets.
_DDP_FIRST_BUCKET_BYTES = 1 * 2**20
_DDP_BUCKET_BYTES = 25 * 2**20


def _ddp_bucket_sizes(params: list[nn.Parameter]) -> list[int]:
    """Element counts of DDP's gradient buckets (a parameter never splits across buckets)."""
    sizes: list[int] = []
    current = current_bytes = 0
    cap = _DDP_FIRST_BUCKET_BYTES
    for p in reversed(params):
        current += p.numel()
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= cap:
            sizes.append(current)
            current = current_bytes = 0
            cap = _DDP_BUCKET_BYTES
    return sizes + ([current] if current else [])


@contextmanager
def _attention_as_on_a_gpu() -> Iterator[None]:
    """Trace ``scaled_dot_product_attention`` the way a GPU runs it during training.

    On a GPU the fused kernels (flash / memory-efficient, fp32 included) keep only q, k, v, the
    output and a log-sum-exp for backward — dropout too: the mask is regenerated from the RNG
    state. On CPU an SDPA call with dropout falls back to the math path and keeps the L x L
    attention matrices (FIELD_NOTES §2: +25-46 % on BERT-sized jobs, several-fold at long
    sequences). Dropped to ``dropout_p=0`` here, the CPU takes its flash path, whose saved tensors
    match the GPU kernel's. ``nn.MultiheadAttention`` and Hugging Face models call the function
    through ``torch.nn.functional``, so they are covered."""
    original = F.scaled_dot_product_attention

    def fused(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def replace_tensors(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], *,
                    recurse: bool = True) -> nn.Module:
    """Every parameter and buffer of ``module`` replaced by ``fn`` of itself, in place, once per
    tensor: every reference to a tensor gets the same replacement, so tied weights stay tied and
    are counted once (encoder-decoder models use one embedding in three places, where
    ``Module.to_empty`` fails on the module reached twice; a fake tensor cannot be swapped by
    ``Module._apply``, its mode holds a weak reference to it). Same order as PyTorch's ``_apply``
    (children first, then a module's parameters, then its buffers): the allocator simulation sees
    the allocations in the order a GPU run would make them."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (original, kept alive so ids stay unique; new)
    visited: set[int] = set()

    def visit(m: nn.Module) -> None:
        visited.add(id(m))
        for child in m.children() if recurse else ():
            if id(child) not in visited:
                visit(child)
        for registry in (m._parameters, m._buffers):
            for name, tensor in registry.items():
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    new = fn(tensor)
                    if isinstance(tensor, nn.Parameter) and not isinstance(new, nn.Parameter):
                        new = nn.Parameter(new, requires_grad=tensor.requires_grad)
                    made[id(tensor)] = (tensor, new)
                registry[name] = made[id(tensor)][1]

    visit(module)
    return module


def _materialize_on_cpu(model: nn.Module) -> None:
    """``model.to_empty(device="cpu")`` that keeps shared tensors shared."""
    replace_tensors(model, lambda t: torch.empty_like(t, device="cpu"))


def trace_training(source: ModelSource, *, batch_size: int, input_shape: tuple[int, ...] | None = None,
                   sample_input: Any = None, optimizer: str = "adam", dtype: str = "float32",
                   iterations: int = 2, data_parallel: bool = False, real_tensors: bool = False,
                   build_on_meta: bool = True) -> TrainingTrace:
    """Allocation trace of ``iterations`` training steps (per GPU; ``data_parallel`` adds the
    gradient buckets of DistributedDataParallel). Mutates a passed-in module (its parameters
    become fake): run it in a forked child (``trace_estimator`` does) when the caller keeps the model.

    ``real_tensors`` runs the steps for real on the CPU instead, for models whose forward reads
    tensor values (``.item()``, boolean masks, ``nonzero``), which fake tensors cannot run. The
    accounting is the same as a fake run's, to the byte (a test compares the two); the price is
    real host memory and compute. ``build_on_meta=False`` builds the model with real CPU weights
    (then traced on fakes all the same), for factories that compute with tensor values while they
    build (``MetaBuildFailed``); that costs host memory for the weights."""
    torch_dtype = parse_dtype(dtype)
    model = build_model(source, on_meta=build_on_meta and not real_tensors).to(torch_dtype)
    recorder = _AllocationRecorder()
    fake = nullcontext() if real_tensors else FakeTensorMode(allow_non_fake_inputs=True)
    with quiet_fake_tensor_errors(), _attention_as_on_a_gpu(), fake, recorder:
        if not real_tensors or any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            _materialize_on_cpu(model)
        for tensor in (*model.parameters(), *model.buffers()):
            recorder.track(tensor)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = _make_optimizer(optimizer, params)
        buckets = [torch.empty(n, dtype=torch_dtype) for n in _ddp_bucket_sizes(params)] if data_parallel else []
        for bucket in buckets:
            recorder.track(bucket)
        model.train()
        for _ in range(iterations):
            inputs = make_batch(model, batch_size, input_shape, sample_input, torch_dtype)
            for t in inputs.tensors():
                recorder.track(t)
            loss = training_loss(inputs.forward(model))
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
