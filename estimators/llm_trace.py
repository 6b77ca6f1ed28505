"""Trace an LLM training step on fake tensors at two small depths and carry the figures to full depth.

Every decoder block of a model has the same shapes, so every quantity of the step's memory is
``a + b * layers`` as long as the peak falls in the same phase of the step: the fixed part (token
embedding, head, logits and loss) and one block's worth (its weights, gradients, optimizer state,
saved activations). The step is traced at ``DEPTHS`` blocks and each phase's peak is extended
linearly to the model's depth, the larger of the phases wins (the forward-backward's peak and the
optimizer step's are both linear in the depth, with different slopes). Seconds instead of a full
model's minutes, and a host memory use that does not grow with the model.

The step is what a training loop does: a forward, a cross-entropy over the vocabulary in fp32
(Hugging Face's loss upcasts the logits) and a backward, then the optimizer step and ``zero_grad``.
It is traced once: the forward-backward of the steps after it is the same plus the optimizer state
the first step made. Under gradient accumulation the micro-batches after the first find every
gradient in place: a full fine-tune traces two micro-batches, a PEFT one traces one and adds its
few gradients (``_traced_micro_batches``). Mixed precision runs the forward and loss under autocast.

A loop that writes ``loss = ...`` (litgpt's, and most hand-written ones) holds the last loss, and
with it the autograd graph, until the next micro-batch's loss replaces it. After the backward that
graph holds nothing of a plain model (autograd has released its saved tensors), but it holds every
input that a 4-bit matmul kept (``llm_model._FourBitMatmul``): the ``next_micro_batch`` phase is the
end of a micro-batch's loss with the previous micro-batch's held inputs still there.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch.nn import functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from hier_sched.core.gpu_types import gpu_type
from hier_sched.core.spec import TrainingSpec

from estimators.allocator import simulate
from estimators.llm_model import ADAPTER_START_LAYER, BuiltModel, build_llm, decoder_layers, full_depth
from estimators.model_input import quiet_fake_tensor_errors
from estimators.tracer import _AllocationRecorder, _attention_as_on_a_gpu, _materialize_on_cpu
from estimators.types import EstimatorError

__all__ = ["StepFigures", "trace_step", "DEPTHS"]

DEPTHS = (1, 2)
PHASES = ("forward_backward", "next_micro_batch", "optimizer_step")


@dataclass(frozen=True)
class StepFigures:
    """Bytes of one rank's step at ``layers`` blocks (traced, or extended to the model's depth)."""

    layers: int
    phase_peaks: dict[str, int]  # live tensor bytes at each phase's peak
    reserved_slack: int  # what the caching allocator holds beyond the allocated peak (simulated)
    param_bytes: int
    trainable_bytes: int
    trainable_elements: int
    quantizable_elements: int  # weights of a 4-bit base
    largest_quantizable_elements: int
    block_param_bytes: int  # one decoder block (an FSDP unit)
    block_has_trainable: bool
    logits_loss_bytes: int  # what the head and the loss hold at the end of the forward
    seconds: float = 0.0
    extras: dict[str, int] = field(default_factory=dict)

    def at_depth(self, other: "StepFigures", layers: int) -> "StepFigures":
        """Extend ``self`` (fewer blocks) and ``other`` linearly to ``layers`` blocks."""
        def ext(a: int, b: int) -> int:
            return max(0, round(b + (b - a) * (layers - other.layers) / (other.layers - self.layers)))

        return replace(other, layers=layers,
                       phase_peaks={k: ext(self.phase_peaks[k], other.phase_peaks[k]) for k in other.phase_peaks},
                       reserved_slack=max(self.reserved_slack, other.reserved_slack),
                       param_bytes=ext(self.param_bytes, other.param_bytes),
                       trainable_bytes=ext(self.trainable_bytes, other.trainable_bytes),
                       trainable_elements=ext(self.trainable_elements, other.trainable_elements),
                       quantizable_elements=ext(self.quantizable_elements, other.quantizable_elements),
                       logits_loss_bytes=other.logits_loss_bytes, seconds=self.seconds + other.seconds)


class _PhaseRecorder(_AllocationRecorder):
    """The allocation recorder with a peak per phase of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = ""
        self.phase_peaks: dict[str, int] = {}

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.phase_peaks.setdefault(phase, self.live_bytes)

    def track(self, tensor: torch.Tensor) -> None:
        super().track(tensor)
        if self.phase:
            self.phase_peaks[self.phase] = max(self.phase_peaks[self.phase], self.live_bytes)


def _optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer traced for ``name``; the 8-bit and paged ones (bitsandbytes, no fake-tensor
    kernels) are traced as AdamW and their state is counted afterwards (``estimators.llm_estimate``)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, foreach=True)
    return torch.optim.AdamW(params, foreach=True)


def _autocast(setup: TrainingSpec):
    if setup.precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if setup.precision == "fp16-mixed":
        return torch.autocast("cpu", dtype=torch.float16)
    return nullcontext()


def _traced_micro_batches(setup: TrainingSpec) -> int:
    """Two micro-batches where gradients are large (a full fine-tune under accumulation: the first
    backward's peak may come late, with most of its gradients made), else one, the gradients of a
    later micro-batch added (a few adapters' worth)."""
    return 2 if setup.grad_accum > 1 and setup.peft == "none" else 1


def _trace_at(setup: TrainingSpec, layers: int) -> StepFigures:
    start = time.perf_counter()
    built: BuiltModel = build_llm(setup, layers)
    model = built.model
    recorder = _PhaseRecorder()
    head = model.get_output_embeddings()
    before_head: list[int] = []
    head.register_forward_pre_hook(lambda *_: before_head.append(recorder.live_bytes))
    with quiet_fake_tensor_errors(), _attention_as_on_a_gpu(), FakeTensorMode(allow_non_fake_inputs=True), recorder:
        _materialize_on_cpu(model)
        for tensor in (*model.parameters(), *model.buffers()):
            recorder.track(tensor)
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            raise EstimatorError("the set-up trains no parameter")
        opt = _optimizer(setup.optimizer, trainable)
        model.train()
        recorder.enter("forward_backward")
        for _ in range(_traced_micro_batches(setup)):
            ids = torch.zeros(setup.micro_batch, setup.seq_len, dtype=torch.long)
            recorder.track(ids)
            with _autocast(setup):
                logits = model(input_ids=ids).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
            logits_loss = recorder.live_bytes - before_head[-1]
            next_micro_batch = recorder.live_bytes + built.held_inputs.total_bytes()
            del logits
            loss.backward()
        recorder.enter("optimizer_step")
        opt.step()
        state = sum(t.untyped_storage().nbytes() for st in opt.state.values() for t in st.values()
                    if isinstance(t, torch.Tensor))
        opt.zero_grad(set_to_none=True)
        del loss, ids  # a training loop holds its last loss until the next micro-batch's replaces it
    # Steps after the first find the optimizer state in place during their forward and backward, and
    # under gradient accumulation every micro-batch after the first finds the gradients in place.
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    untraced_grads = trainable_bytes if setup.grad_accum > _traced_micro_batches(setup) else 0
    recorder.phase_peaks["forward_backward"] += state + untraced_grads
    recorder.phase_peaks["next_micro_batch"] = next_micro_batch + state + untraced_grads
    blocks = decoder_layers(model)
    block_params = list(blocks[-1].parameters())
    quantizable = [m.weight.numel() for m in built.quantizable]
    sim = simulate(recorder.events, gpu_type("A100-80GB"))
    return StepFigures(
        layers=layers, phase_peaks=dict(recorder.phase_peaks),
        reserved_slack=max(0, sim.peak_reserved_bytes - sim.peak_allocated_bytes),
        param_bytes=sum(p.untyped_storage().nbytes() for p in params),
        trainable_bytes=trainable_bytes,
        trainable_elements=sum(p.numel() for p in trainable),
        quantizable_elements=sum(quantizable), largest_quantizable_elements=max(quantizable, default=0),
        block_param_bytes=sum(p.numel() * p.element_size() for p in block_params),
        block_has_trainable=any(p.requires_grad for p in block_params),
        logits_loss_bytes=max(0, logits_loss), seconds=time.perf_counter() - start)


def trace_step(setup: TrainingSpec) -> StepFigures:
    """One rank's step of ``setup`` at the model's full depth, unsharded (``llm_estimate`` shards it)."""
    depth = full_depth(setup)
    # Adapters train the blocks from ADAPTER_START_LAYER on: both depths must hold such blocks.
    first = ADAPTER_START_LAYER if setup.peft in ("adapter", "adapter_v2") else 0
    depths = [first + d for d in DEPTHS]
    if depth <= depths[-1]:
        return _trace_at(setup, depth)
    low, high = (_trace_at(setup, d) for d in depths)
    return low.at_depth(high, depth)
