"""An LLM training set-up's per-GPU memory, in parts: the traced step (``llm_trace``) composed with
what fake tensors cannot run — a 4-bit base, 8-bit and paged optimizers — and with sharding.

Parts (MiB, per rank, at the step's peak): ``weights``, ``gradients``, ``optimizer_state`` (in the
caching allocator), ``activations``, ``logits_loss``, ``communication`` (gathered units, buckets),
``dequantize`` (a 4-bit weight unpacked for its matmul, in fp16 and cast), ``allocator`` (cached
beyond the tensors), ``paged_optimizer_state`` (bitsandbytes' paged state: unified memory, outside
PyTorch's allocator) and ``baseline`` (CUDA context). ``quantity(metric)`` adds up the ones a
measurement sees.

Sharding, as the tools lay memory out per rank (world size ``N``, none of it needs ``N`` GPUs):
- ``fsdp`` (flat parameters, full shard): weights, optimizer state and gradients ``/N``; one block
  gathered and the next prefetched, and the root unit (embeddings, head) gathered from its forward
  to its backward. Under gradient accumulation the micro-batches skip the
  reduce-scatter (``no_sync``) and keep *unsharded* gradients, of the whole flat parameter of each
  unit that trains anything: with LoRA that is every block's frozen weights too (PyTorch's FSDP
  notes: mixed ``requires_grad`` in a flat parameter with ``use_orig_params``). A full fine-tune's
  root gradient is assembled from its parameters' pieces when its backward ends
  (``_flat_root_at_backward_end``): with a large vocabulary, that is the step's peak.
- ``fsdp2`` / ``zero3``: per-parameter shards; unsharded gradients under accumulation only for the
  trainable parameters.
- ``zero1``: optimizer state ``/N``; ``zero2``: and gradients; each with DeepSpeed's reduce bucket.
- ``ddp``: one more copy of the gradients in its buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

from hier_sched.core.gpu_types import GPU_TYPES
from hier_sched.core.spec import TrainingSpec

from estimators.llm_model import nf4_bytes_per_weight
from estimators.llm_trace import StepFigures, trace_step
from estimators.types import EstimatorError

__all__ = ["LlmEstimate", "estimate_llm", "compose", "METRICS"]

MIB = 2**20
# What a measured peak counts (a row's ``metric``): allocated tensors; the caching allocator's
# reserve; the reserve above what the process held when it started (the same here: an estimate
# starts from an empty allocator); the process as nvidia-smi shows it.
METRICS = ("max_allocated", "max_reserved", "reserved_minus_start", "process_total")
_METRIC_PARTS = {
    "max_allocated": ("weights", "gradients", "optimizer_state", "activations", "logits_loss", "communication",
                      "dequantize"),
}
_METRIC_PARTS["max_reserved"] = (*_METRIC_PARTS["max_allocated"], "allocator")
_METRIC_PARTS["reserved_minus_start"] = _METRIC_PARTS["max_reserved"]
_METRIC_PARTS["process_total"] = (*_METRIC_PARTS["max_reserved"], "paged_optimizer_state", "baseline")
# DeepSpeed's default reduce_bucket_size (elements): ZeRO-1/2 reduce gradients through it.
_ZERO_BUCKET_ELEMENTS = 500_000_000
# bitsandbytes' 8-bit optimizers: one byte per state value plus an fp32 scale per block of 256.
_STATE_8BIT_BYTES = 1 + 4 / 256
_DEFAULT_BASELINE_GPU = "A100-40GB"
_FP16_ELEMENT = 2


@dataclass(frozen=True)
class LlmEstimate:
    parts: dict[str, float]  # MiB per rank
    method: str
    seconds: float
    phase: str  # the phase of the step whose peak this is

    def quantity(self, metric: str) -> float:
        """The estimate of what ``metric`` measures, in MiB."""
        if metric not in _METRIC_PARTS:
            raise EstimatorError(f"metric must be one of {', '.join(METRICS)} (got {metric!r})")
        return sum(self.parts[p] for p in _METRIC_PARTS[metric])

    @property
    def peak_mib(self) -> float:
        """What the GPU must hold for the process: every part."""
        return self.quantity("process_total")


def _traced_state_bytes(setup: TrainingSpec, f: StepFigures) -> int:
    """The optimizer state the trace made (``llm_trace._optimizer``)."""
    return f.trainable_bytes * (1 if setup.optimizer == "sgd" else 2)


def _state_bytes(setup: TrainingSpec, f: StepFigures) -> tuple[int, int]:
    """(state in the caching allocator, paged state outside it) of the real optimizer."""
    if setup.optimizer in ("adamw", "adam", "sgd"):
        return _traced_state_bytes(setup, f), 0
    if setup.optimizer == "adamw8bit":
        return round(2 * _STATE_8BIT_BYTES * f.trainable_elements), 0
    if setup.optimizer == "paged_adamw":
        return 0, 2 * 4 * f.trainable_elements  # 32-bit paged: fp32 states
    return 0, round(2 * _STATE_8BIT_BYTES * f.trainable_elements)  # paged_adamw8bit


def compose(setup: TrainingSpec, f: StepFigures, baseline_mib: float) -> LlmEstimate:
    """The parts of one rank's peak from the unsharded step's figures ``f``."""
    n = setup.world_size
    sharded = setup.sharding in ("fsdp", "fsdp2", "zero3")
    accumulating = setup.grad_accum > 1
    traced_state = _traced_state_bytes(setup, f)
    traced_grads = f.trainable_bytes if accumulating else 0  # present at the forward-backward peak
    # A micro-batch's forward and loss run while the loop still holds the previous loss (``llm_trace``).
    fb = max(f.phase_peaks["forward_backward"], f.phase_peaks.get("next_micro_batch", 0))
    step = f.phase_peaks.get("optimizer_step", 0)
    logits_loss = f.logits_loss_bytes
    activations = max(0, fb - f.param_bytes - traced_state - traced_grads - logits_loss)
    step_temporaries = max(0, step - f.param_bytes - traced_state - f.trainable_bytes)

    weights = f.param_bytes
    dequantize = 0
    method = "trace:llm"
    if setup.quantization != "none":
        element = _weight_element(setup)
        weights -= round(f.quantizable_elements * (element - nf4_bytes_per_weight(setup.quantization)))
        dequantize = _dequantized_bytes(setup, f)
        method += f" +{setup.quantization} counted"
    state, paged = _state_bytes(setup, f)
    if setup.optimizer not in ("adamw", "adam", "sgd"):
        method += f" +{setup.optimizer} counted"

    grads = traced_grads
    step_grads = f.trainable_bytes
    communication = 0
    if setup.sharding == "ddp":
        communication = f.trainable_bytes
    elif setup.sharding in ("zero1", "zero2"):
        state //= n
        communication = min(f.trainable_bytes, _ZERO_BUCKET_ELEMENTS * _weight_element(setup))
        if setup.sharding == "zero2":
            grads, step_grads = grads // n if not accumulating else f.trainable_bytes // n, f.trainable_bytes // n
    elif sharded:
        weights //= n
        state //= n
        step_grads = f.trainable_bytes // n
        # The unit being computed and the one prefetched, and the root unit (embeddings, head,
        # final norm): the root is not resharded between its forward and its backward.
        communication = 2 * f.block_param_bytes + _gathered_root(f, n)
        if accumulating and setup.sharding == "fsdp" and setup.peft != "none" and f.block_has_trainable:
            grads = f.block_param_bytes * f.layers  # flat gradients cover each block's frozen weights too
        elif accumulating:
            grads = f.trainable_bytes
        else:
            grads = step_grads
            communication += f.block_param_bytes if setup.peft == "none" else 0
        step_temporaries //= n
        method += f" +{setup.sharding} x{n}"
    forward_backward = weights + state + grads + activations + logits_loss + communication + dequantize
    optimizer_step = weights + state + step_grads + step_temporaries
    gathered_root, root_gradient = _flat_root_at_backward_end(setup, f)
    backward_end = weights + state + grads + gathered_root + root_gradient
    if root_gradient and backward_end > max(forward_backward, optimizer_step):
        phase = "backward_end"
        parts = {"weights": weights, "gradients": grads + root_gradient, "optimizer_state": state, "activations": 0,
                 "logits_loss": 0, "communication": gathered_root, "dequantize": 0}
    elif optimizer_step > forward_backward:
        phase = "optimizer_step"
        parts = {"weights": weights, "gradients": step_grads, "optimizer_state": state + step_temporaries,
                 "activations": 0, "logits_loss": 0, "communication": 0, "dequantize": 0}
    else:
        phase = "forward_backward"
        parts = {"weights": weights, "gradients": grads, "optimizer_state": state, "activations": activations,
                 "logits_loss": logits_loss, "communication": communication, "dequantize": dequantize}
    mib = {k: v / MIB for k, v in parts.items()}
    mib["allocator"] = f.reserved_slack / MIB
    mib["paged_optimizer_state"] = paged / MIB
    mib["baseline"] = baseline_mib
    return LlmEstimate(mib, method, f.seconds, phase)


def _root_bytes(f: StepFigures) -> int:
    """The root unit's weights: all but the decoder blocks (embeddings, head, final norm)."""
    return max(0, f.param_bytes - f.block_param_bytes * f.layers)


def _gathered_root(f: StepFigures, n: int) -> int:
    """What a rank holds of the root unit beyond its shard while the root is gathered."""
    root = _root_bytes(f)
    return root - root // n


def _flat_root_at_backward_end(setup: TrainingSpec, f: StepFigures) -> tuple[int, int]:
    """What FSDP with flat parameters holds beyond the weights, state and gradients when a full
    fine-tune's backward ends ((0, 0) for the other set-ups): the root unit (embeddings, head,
    final norm) still gathered, and its gradient made twice over. Each parameter of a unit is a
    view of the unit's flat parameter, so its gradient waits for the gradients of all the others,
    and they are concatenated into one flat gradient when the last arrives: the head's, made
    first, waits through the whole backward for the input embedding's, made last; then the pieces
    and the concatenation are alive together. A large vocabulary makes this the step's peak."""
    if setup.sharding != "fsdp" or setup.peft != "none":
        return 0, 0
    return _gathered_root(f, setup.world_size), 2 * _root_bytes(f)


def _dequantized_bytes(setup: TrainingSpec, f: StepFigures) -> int:
    """The largest 4-bit weight unpacked for its matmul. bitsandbytes 0.41-0.42 quantize an fp16 copy
    of the weight (``Params4bit.cuda``, and Lightning Fabric's plugin that litgpt uses), so the
    quantization state's dtype is fp16: the matmul dequantizes to fp16 and casts that to the compute
    dtype, and both copies are alive during the cast (one only when computing in fp16)."""
    compute = 4 if setup.precision == "fp32" else 2
    cast = 0 if setup.precision.startswith("fp16") else compute
    return f.largest_quantizable_elements * (_FP16_ELEMENT + cast)


def _weight_element(setup: TrainingSpec) -> int:
    """Bytes per stored weight: mixed precision keeps fp32 masters (``llm_model._weight_dtype``)."""
    return 2 if setup.precision in ("bf16", "fp16") else 4


def baseline_for(gpu: str | None) -> tuple[float, str]:
    """The CUDA context of ``gpu`` when it is a known type, else that of ``_DEFAULT_BASELINE_GPU``."""
    from estimators.baseline import default_baseline

    name = gpu if gpu in GPU_TYPES else _DEFAULT_BASELINE_GPU
    base = default_baseline(name)
    return base.mib, base.source


def estimate_llm(setup: TrainingSpec, gpu: str | None = None) -> LlmEstimate:
    """Trace ``setup``'s step and compose one rank's peak (``gpu``: the type whose baseline is added)."""
    figures = trace_step(setup)
    baseline, _ = baseline_for(gpu)
    return compose(setup, figures, baseline)
