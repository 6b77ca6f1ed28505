"""Build an LLM as a training set-up (``TrainingSpec``) describes it, on the meta device, at a chosen depth.

The architecture comes from a Hugging Face ``model_type`` and config fields (transformers builds it
without weights). Then the set-up is applied the way the training tools do it: the precision of the
stored weights, LoRA or adapter modules on a frozen base as litgpt makes them, DoRA and IA3 as PEFT
makes them (our own small modules: their memory is what matters, and it is the same as theirs: a
test traces each beside PEFT's own), and activation checkpointing per decoder
block (transformers' own, non-reentrant). A quantized base is traced in the compute dtype and its
storage counted afterwards (``estimators.llm_estimate``): bitsandbytes kernels do not run on fakes.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary

from hier_sched.core.spec import TrainingSpec

from estimators.types import EstimatorError

__all__ = ["BuiltModel", "build_llm", "decoder_layers", "LAYER_FIELDS"]

# The config field that holds the number of decoder blocks, by what transformers calls it.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")

# Each LoRA target role, by the names the architectures give that linear (fused projections serve
# every role they hold: a LoRA on q of a fused qkv projection adapts that projection).
_ROLE_NAMES = {
    "q": ("q_proj", "query_key_value", "qkv_proj", "Wqkv", "c_attn"),
    "k": ("k_proj", "query_key_value", "qkv_proj", "Wqkv", "c_attn"),
    "v": ("v_proj", "query_key_value", "qkv_proj", "Wqkv", "c_attn"),
    "o": ("o_proj", "dense", "out_proj", "c_proj"),
    "gate": ("gate_proj", "gate_up_proj", "w1"),
    "up": ("up_proj", "gate_up_proj", "w3"),
    "down": ("down_proj", "w2"),
    "fc_in": ("fc1", "dense_h_to_4h", "c_fc", "up_proj"),
    "fc_out": ("fc2", "dense_4h_to_h", "down_proj"),
    "lm_head": ("lm_head",),
}
# The MLP's output projections (no attention projection has these names): IA3 scales their input.
_MLP_OUTPUTS = frozenset(_ROLE_NAMES["down"] + _ROLE_NAMES["fc_out"])
# An attention output projection called "dense"/"c_proj" must not be taken for an MLP's.
_ATTENTION_PARENTS = ("attn", "attention", "self_attn", "self_attention")


class HeldInputs:
    """The inputs that 4-bit matmuls hold on the autograd graph, each storage counted once (the
    linears that read one normed hidden state share it)."""

    def __init__(self) -> None:
        self._bytes: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def add(self, x: torch.Tensor) -> None:
        storage = x.untyped_storage()
        self._bytes[storage] = storage.nbytes()

    def total_bytes(self) -> int:
        return sum(self._bytes.values())


class _FourBitMatmul(torch.autograd.Function):
    """A frozen linear as the 4-bit matmul of bitsandbytes 0.41-0.42 (``MatMul4Bit``, what lit-gpt and
    litgpt ran) runs it: its backward dequantizes the weight again, and its forward keeps the input
    whenever the input needs a gradient, where a plain frozen ``nn.Linear`` keeps nothing. It keeps
    it as an attribute of the autograd context (``ctx.tensors = (A, B)``), not as a saved tensor:
    autograd releases saved tensors once their backward has run and checkpointing drops them, but an
    attribute lives as long as the graph node, so until the training loop lets go of the loss
    (``llm_trace``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                held: HeldInputs) -> torch.Tensor:
        if ctx.needs_input_grad[0]:
            ctx.tensors = (x, weight)
            held.add(x)
        else:
            ctx.tensors = (None, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        _, weight = ctx.tensors
        return grad @ weight.to(grad.dtype), None, None, None


def _four_bit_forward(held: HeldInputs, self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _FourBitMatmul.apply(x, self.weight, self.bias, held)


class _AdaptedLinear(nn.Module):
    """A frozen linear ``base`` with an adapter around it."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base = base

    @property
    def weight(self) -> torch.Tensor:  # models that read a projection's weight (dtype checks) still can
        return self.base.weight


class LoraLinear(_AdaptedLinear):
    """``base(x) + B(A(dropout(x))) * alpha / r`` with ``base`` frozen; A and B in the base's dtype."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float):
        super().__init__(base)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_a = nn.Linear(base.in_features, r, bias=False, device=base.weight.device, dtype=base.weight.dtype)
        self.lora_b = nn.Linear(r, base.out_features, bias=False, device=base.weight.device, dtype=base.weight.dtype)
        self.scale = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(self.dropout(x))) * self.scale


# PEFT keeps the adapters of a half-precision base in fp32 (``get_peft_model``'s ``autocast_adapter_dtype``).
_PEFT_ADAPTER_DTYPE = torch.float32


class DoraLinear(LoraLinear):
    """DoRA (Liu et al. 2024, "DoRA: Weight-Decomposed Low-Rank Adaptation"): LoRA's update with each
    output row's magnitude ``m`` learned apart from its direction, ``W' = m (W + s BA) / ||W + s BA||``,
    the norm treated as a constant (the paper's section 4.3), as PEFT trains it (``use_dora=True``), with
    its adapters in fp32. Beyond LoRA, every forward makes the full-size update ``BA`` (through the two
    linears, from an identity matrix) and the weight in the input's dtype to take the row norms, and keeps
    for the backward what the magnitude's gradient needs: the base and LoRA outputs. With dropout the base
    product is made again on the dropped input, which keeps the weight it multiplied (a full-size copy
    when the dtypes differ)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float):
        super().__init__(base, r, alpha, dropout)
        kw = {"device": base.weight.device, "dtype": _PEFT_ADAPTER_DTYPE}
        self.lora_a.to(**kw)
        self.lora_b.to(**kw)
        self.magnitude = nn.Parameter(torch.empty(base.out_features, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In PEFT's order, each temporary made and freed where PEFT's functions make and free it: the
        # peak of a layer's forward is decided by which of them are alive together.
        result = self.base(x)
        x = x.to(self.lora_a.weight.dtype)
        if isinstance(self.dropout, nn.Identity):
            base_result = result if self.base.bias is None else result - self.base.bias
        else:
            x, base_result = self.dropout(x), None
        update = self._update().to(x.dtype)
        weight = self.base.weight.to(x.dtype)
        ratio = (self.magnitude / _row_norms(weight, self.scale, update.detach()).detach()).view(1, -1)
        lora_result = self.lora_b(self.lora_a(x))
        if base_result is None:
            base_result = F.linear(x, weight)
        return (result + ((ratio - 1) * base_result + ratio * lora_result * self.scale)).to(result.dtype)

    def _update(self) -> torch.Tensor:
        """The full-size update ``BA``, made through the two linears from an identity matrix."""
        eye = torch.eye(self.base.in_features, device=self.lora_a.weight.device, dtype=self.lora_a.weight.dtype)
        return self.lora_b(self.lora_a(eye)).T


def _row_norms(weight: torch.Tensor, scale: float, update: torch.Tensor) -> torch.Tensor:
    return torch.linalg.norm(weight + scale * update, dim=1).to(weight.dtype)


class Ia3Linear(_AdaptedLinear):
    """(IA)^3 (Liu et al. 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than
    In-Context Learning"), as PEFT trains it: a learned fp32 vector rescales the linear's output, or,
    on an MLP's output projection (``feedforward``), its input. The product is made in fp32 and kept
    for the vector's gradient: the output, or the fp32 copy of the input."""

    def __init__(self, base: nn.Linear, feedforward: bool):
        super().__init__(base)
        self.feedforward = feedforward
        size = base.in_features if feedforward else base.out_features
        self.vector = nn.Parameter(torch.ones(size, device=base.weight.device, dtype=_PEFT_ADAPTER_DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.feedforward:
            return self.base((x.to(self.vector.dtype) * self.vector).to(x.dtype))
        result = self.base(x)
        return (result * self.vector).to(result.dtype)


class ScaledLinear(_AdaptedLinear):
    """litgpt's Adapter v2 linear: ``scale * (base(x) + bias)`` with a trainable bias and scale."""

    def __init__(self, base: nn.Linear):
        super().__init__(base)
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.adapter_bias = nn.Parameter(torch.zeros(base.out_features, **kw))
        self.adapter_scale = nn.Parameter(torch.ones(base.out_features, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter_scale * (self.base(x) + self.adapter_bias)


class _Prompt(nn.Module):
    """Adapter (LLaMA-Adapter): a trainable, zero-gated prompt joins the hidden states of the blocks
    from ``ADAPTER_START_LAYER`` on; what matters for memory is that gradients flow back through
    those blocks, so their activations are kept although their weights are frozen."""

    def __init__(self, hidden: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(hidden, dtype=dtype, device=device))

    def hook(self, _module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (args[0] + self.gate, *args[1:]), kwargs
        kwargs = dict(kwargs)
        kwargs["hidden_states"] = kwargs["hidden_states"] + self.gate
        return args, kwargs


ADAPTER_START_LAYER = 2  # litgpt's default adapter_start_layer


@dataclass
class BuiltModel:
    model: nn.Module
    layers: int  # decoder blocks built
    quantizable: list[nn.Linear]  # the frozen linears a quantized base stores in 4 bits
    vocab: int
    held_inputs: HeldInputs  # what those linears hold on the graph of the step being run


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks: the longest ``ModuleList`` of the model."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise EstimatorError(f"{type(model).__name__}: no list of decoder blocks found")
    return max(lists, key=len)


def _config(setup: TrainingSpec, layers: int):
    from transformers import AutoConfig

    fields = dict(setup.hf_config)
    key = next((k for k in LAYER_FIELDS if k in fields), "num_hidden_layers")
    fields[key] = layers
    if "layer_types" in fields:  # per-layer attention kinds (Gemma-2/3): keep the pattern, cut to depth
        fields["layer_types"] = list(fields["layer_types"])[:layers]
    try:
        config = AutoConfig.for_model(setup.hf_model_type, **fields)
    except (ValueError, TypeError, KeyError) as exc:
        raise EstimatorError(f"hf_model_type {setup.hf_model_type!r} / hf_config: {exc}") from None
    config._attn_implementation = "sdpa"  # the fused kernels a GPU run uses (see tracer._attention_as_on_a_gpu)
    config.use_cache = False
    return config


def full_depth(setup: TrainingSpec) -> int:
    key = next((k for k in LAYER_FIELDS if k in setup.hf_config), None)
    if key is None:
        raise EstimatorError(f"hf_config has no number of layers ({' / '.join(LAYER_FIELDS)})")
    value = setup.hf_config[key]
    if not isinstance(value, int) or value < 1:
        raise EstimatorError(f"hf_config.{key} must be a positive integer (got {value!r})")
    return value


def _weight_dtype(setup: TrainingSpec) -> torch.dtype:
    """The dtype weights are stored in: mixed precision keeps fp32 masters; "true" precisions do not."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision, torch.float32)


def _targets(model: nn.Module, roles: tuple[str, ...]) -> list[tuple[nn.Module, str, nn.Linear]]:
    wanted = {name for role in roles for name in _ROLE_NAMES[role]}
    found = []
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if not isinstance(child, nn.Linear) or name not in wanted:
                continue
            in_attention = any(p in parent_name.split(".")[-1] for p in _ATTENTION_PARENTS)
            role_ok = any(name in _ROLE_NAMES[r] and (r != "o" or in_attention) and (r not in ("fc_in", "fc_out")
                          or not in_attention) for r in roles)
            if role_ok:
                found.append((parent, name, child))
    return found


def build_llm(setup: TrainingSpec, layers: int) -> BuiltModel:
    """The model of ``setup`` with ``layers`` decoder blocks, on meta, as the set-up trains it."""
    from transformers import AutoModelForCausalLM

    config = _config(setup, layers)
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad config
            raise EstimatorError(f"transformers cannot build {setup.hf_model_type!r} from hf_config: "
                                 f"{type(exc).__name__}: {str(exc)[:200]}") from None
    model.to(_weight_dtype(setup))
    if getattr(config, "tie_word_embeddings", False) is False:
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and inp is not None and out.weight is inp.weight:
            out.weight = nn.Parameter(torch.empty_like(inp.weight))
    blocks = decoder_layers(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if setup.peft != "none":
        model.requires_grad_(False)
    if setup.peft in ("lora", "dora"):
        adapted = LoraLinear if setup.peft == "lora" else DoraLinear
        for parent, name, linear in _targets(model, setup.lora_targets):
            setattr(parent, name, adapted(linear, setup.lora_r, setup.lora_alpha, setup.lora_dropout))
    elif setup.peft == "ia3":
        for parent, name, linear in _targets(model, setup.ia3_targets):
            setattr(parent, name, Ia3Linear(linear, feedforward=name in _MLP_OUTPUTS))
    elif setup.peft == "adapter_v2":
        for parent, name, linear in _targets(model, tuple(_ROLE_NAMES)):
            setattr(parent, name, ScaledLinear(linear))
    if setup.peft in ("adapter", "adapter_v2"):
        hidden = model.get_input_embeddings().weight.shape[1]
        for block in list(blocks)[ADAPTER_START_LAYER:]:
            prompt = _Prompt(hidden, _weight_dtype(setup), torch.device("meta"))
            block.add_module("adapter_prompt", prompt)
            block.register_forward_pre_hook(prompt.hook, with_kwargs=True)
    if setup.checkpointing == "block":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    quantizable = linears if setup.quantization != "none" else []
    held = HeldInputs()
    for linear in quantizable:
        linear.forward = types.MethodType(functools.partial(_four_bit_forward, held), linear)
    vocab = model.get_output_embeddings().weight.shape[0]
    return BuiltModel(model, layers, quantizable, vocab, held)


def nf4_bytes_per_weight(quantization: str) -> float:
    """bitsandbytes 4-bit storage: half a byte per weight plus the block scales (one fp32 absmax per
    64 weights; double quantization stores them in 8 bits with one fp32 per 256 of them)."""
    if quantization == "nf4":
        return 0.5 + 4 / 64
    if quantization == "nf4-dq":
        return 0.5 + 1 / 64 + 4 / (64 * 256)
    raise EstimatorError(f"no 4-bit storage for quantization {quantization!r}")
