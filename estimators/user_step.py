"""The user's own training step, traced as written: for everything a model description or a
``training`` section cannot say (a custom loss, several forwards, autocast, activation
checkpointing, a PEFT wrapper, a hand-written loop).

A step is a zero-argument callable the user gives (``est=`` in Python, ``model.step:
"pkg.mod:fn"`` in a spec) that builds the model, the optimizer and a batch, and either

- returns the step to run (a zero-argument callable): it is run ``iterations`` times, so the
  forward of the second sees the optimizer state the first made, as every later step does; or
- runs one training step itself and returns nothing: the optimizer state it made (found with
  PyTorch's global optimizer hook) is allocated at the start of the trace, where the forward and
  backward of every later step find it.

It runs on fake tensors (no weights, no GPU): whatever the user's code allocates is recorded by
the same recorder as a model's trace (``tracer._AllocationRecorder``), replayed through the caching
allocator's simulation per GPU type by ``trace_estimator``. The user's code says ``cuda`` (``.cuda()``,
``device="cuda"``, ``torch.autocast("cuda", ...)``): while it is traced, every CUDA device is the
CPU the fakes live on, ``torch.cuda.is_available()`` says False for code that picks its device, and
``torch.cuda.current_device()`` says 0. A step that shards its model is rank 0 of a fake world of
the job's ranks (``_fake_world``): FSDP2 and DTensor, not FSDP1, which refuses to run without CUDA.
Real weights read from files are out of reach of fakes: build the model from its config.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from estimators.allocator import AllocEvent
from estimators.model_input import quiet_fake_tensor_errors, resolve_factory
from estimators.tracer import (TrainingTrace, _AllocationRecorder, _attention_as_on_a_gpu,
                               replace_tensors)
from estimators.types import EstimatorError

__all__ = ["UserStep", "trace_user_step"]


@dataclass(frozen=True, slots=True)
class UserStep:
    """The user's step: a zero-argument callable, or ``"pkg.mod:fn"`` imported only when traced (in
    the tracing worker's child, under its budgets, like a model factory). ``world_size``: the ranks
    it trains on (the job's GPUs); it is traced as rank 0 of them (``_fake_world``)."""

    fn: Callable[[], Any] | str
    world_size: int = 1

    @property
    def name(self) -> str:
        return self.fn if isinstance(self.fn, str) else getattr(self.fn, "__qualname__", type(self.fn).__name__)

    def resolve(self) -> Callable[[], Any]:
        if isinstance(self.fn, str):
            return resolve_factory(self.fn, "training step")
        if not callable(self.fn):
            raise EstimatorError(f"the step must be a zero-argument callable (got {type(self.fn).__name__})")
        return self.fn


def _on_the_cpu(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
        return "cpu"
    return value


class _CudaIsTheCpu(TorchFunctionMode):
    """Every CUDA device a torch function is given becomes the CPU; ``Tensor.cuda()`` stays put."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.Tensor.cuda:
            return args[0]
        args, kwargs = tree_map(_on_the_cpu, (args, kwargs or {}))
        return func(*args, **kwargs)


@contextmanager
def _cuda_as_cpu() -> Iterator[None]:
    """The user's CUDA code, run on the CPU fakes: devices, autocast, module conversions and the
    CUDA queries a step makes. Patched only in the tracing worker's child, which ends with the trace."""
    autocast_init = torch.amp.autocast_mode.autocast.__init__

    def autocast_on_cpu(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        autocast_init(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    with ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        # a GradScaler or autocast made for CUDA says it is disabled: the trace knows
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        stack.enter_context(mock.patch.object(torch.amp.autocast_mode.autocast, "__init__", autocast_on_cpu))
        stack.enter_context(mock.patch("torch.cuda.is_available", return_value=False))
        # .to(dtype), .cuda(), .bfloat16(): each tensor replaced in its module (a fake cannot be swapped)
        stack.enter_context(mock.patch.object(nn.Module, "_apply", replace_tensors))
        for no_op in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
            stack.enter_context(mock.patch(f"torch.cuda.{no_op}", lambda *a, **k: None))
        stack.enter_context(mock.patch("torch.cuda.current_device", lambda: 0))  # rank 0's GPU (``_fake_world``)
        stack.enter_context(_CudaIsTheCpu())
        yield


@contextmanager
def _fake_world(world_size: int) -> Iterator[None]:
    """Rank 0 of ``world_size`` ranks, none of which exists: PyTorch's fake process group (every
    collective returns at once, with outputs of the right sizes), so a step that shards its model
    (FSDP2's ``fully_shard``, DTensor) holds a rank's share, and gathers and reduce-scatters make
    their buffers, as on one GPU of the job. The step's own ``init_process_group`` finds it made,
    its device meshes are the CPU's (made outside the fakes: a mesh reads its ranks' values), and
    ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` say rank 0 of the world."""
    import torch.distributed as dist
    from torch.distributed import device_mesh
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    # PyTorch's fake process group (importing it registers the "fake" backend): what its own tests and
    # torchtitan's memory estimation use; no public module offers it.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_available():
        yield
        return
    make_mesh = device_mesh.DeviceMesh.__init__

    def mesh_on_the_cpu(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        # A mesh lists its ranks (``tolist``): made under the fakes, its rank tensors are real aranges again.
        def real(t: Any) -> Any:
            if isinstance(t, FakeTensor):
                return torch.arange(t.numel(), dtype=t.dtype).view(t.shape)
            return t

        with unset_fake_temporarily():
            args, kwargs = tree_map(real, (args, kwargs))
            make_mesh(self, "cpu" if device_type.startswith("cuda") else device_type, *args, **kwargs)

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
    try:
        with ExitStack() as stack:
            stack.enter_context(mock.patch.dict("os.environ", env))
            stack.enter_context(mock.patch.object(dist, "init_process_group", lambda *a, **k: None))
            stack.enter_context(mock.patch.object(dist, "destroy_process_group", lambda *a, **k: None))
            stack.enter_context(mock.patch.object(device_mesh.DeviceMesh, "__init__", mesh_on_the_cpu))
            stack.enter_context(mock.patch("torch.cuda.set_device", lambda *a, **k: None))
            yield
    finally:
        dist.destroy_process_group()


class _OptimizerWatch:
    """The optimizers that stepped, through PyTorch's global optimizer hook."""

    def __enter__(self) -> _OptimizerWatch:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.optimizers: list[torch.optim.Optimizer] = []
        self._handle = register_optimizer_step_post_hook(self._stepped)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def _stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)

    def state(self) -> list[torch.Tensor]:
        return [_local(t) for o in self.optimizers for st in o.state.values() for t in st.values()
                if isinstance(t, torch.Tensor)]

    def param_bytes(self) -> int:
        """The bytes of this rank's parameters the optimizers train."""
        params = {id(p): _local(p) for o in self.optimizers for g in o.param_groups for p in g["params"]}
        return sum(p.numel() * p.element_size() for p in params.values())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's part on this rank (a DTensor's local tensor); any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _state_from_the_start(recorder: _AllocationRecorder, state: list[torch.Tensor]) -> list[AllocEvent]:
    """The trace of one step as a later step sees it: the optimizer state it made allocated before
    everything else (the forward and backward of every step after the first find it in place)."""
    keys = {recorder._seen[t.untyped_storage()] for t in state if t.untyped_storage() in recorder._seen}
    first = [e for e in recorder.events if e.key in keys and e.size > 0]
    return first + [e for e in recorder.events if not (e.key in keys and e.size > 0)]


def _peak_live_bytes(events: list[AllocEvent]) -> int:
    """The most tensor bytes alive at once in ``events`` (kernels' workspaces are not tensors)."""
    live = peak = 0
    sizes: dict[int, int] = {}
    for e in events:
        if e.workspace:
            continue
        if e.size:
            sizes[e.key] = e.size
            live += e.size
            peak = max(peak, live)
        else:
            live -= sizes.pop(e.key, 0)
    return peak


@contextmanager
def _named_limits(step: UserStep) -> Iterator[None]:
    """What a step may do that cannot be traced here, said as such, with what can."""
    try:
        yield
    except RuntimeError as exc:
        if _raised_by_fsdp1(exc):
            raise EstimatorError(
                f"the step {step.name} shards its model with FSDP1 (FullyShardedDataParallel), which runs only "
                "on CUDA devices and cannot be traced without one: shard it with FSDP2's fully_shard (traced as "
                "rank 0 of the job's ranks), or describe the job with a training section (sharding: fsdp)") from None
        raise


def _raised_by_fsdp1(exc: BaseException) -> bool:
    """Whether FSDP1's own code raised ``exc`` (it refuses a CPU at its start or at its first
    forward, by PyTorch version); FSDP2 lives apart, in ``fsdp._fully_shard``."""
    files = [frame.filename.replace(os.sep, "/") for frame in traceback.extract_tb(exc.__traceback__)]
    return any("torch/distributed/fsdp/" in f and "/_fully_shard/" not in f for f in files)


def trace_user_step(step: UserStep, *, iterations: int = 2, real_tensors: bool = False) -> TrainingTrace:
    """The allocation trace of the user's step (module docstring). ``real_tensors``: run it for real
    on the CPU (a step that reads tensor values, which fakes cannot), the same accounting."""
    fn = step.resolve()
    recorder = _AllocationRecorder()
    fake = nullcontext() if real_tensors else FakeTensorMode(allow_non_fake_inputs=True)
    with quiet_fake_tensor_errors(), _attention_as_on_a_gpu(), _cuda_as_cpu(), _fake_world(step.world_size), fake, \
            recorder, _OptimizerWatch() as watch, _named_limits(step):
        run = fn()
        ran_itself = run is None  # it ran its one step
        if ran_itself:
            ran = 1
        elif callable(run):
            ran = iterations
            for _ in range(iterations):
                run()
        else:
            raise EstimatorError(f"the step {step.name} returned {type(run).__name__}: return the step to run "
                                 "(a zero-argument callable), or run one step and return None")
        param_bytes = watch.param_bytes()
        del run
        events = _state_from_the_start(recorder, watch.state()) if ran_itself else list(recorder.events)
    if not recorder.events:
        raise EstimatorError(f"the step {step.name} made no tensor: nothing to estimate")
    return TrainingTrace(tuple(events), _peak_live_bytes(events), param_bytes, ran, recorder.largest_transient_bytes)
