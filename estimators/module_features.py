"""Layer list of an ``nn.Module`` (GPUMemNet's ``Activations-Params`` shape) via forward hooks,
computed on meta or fake tensors so no real activation memory is ever touched."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from estimators.features import Layer, ModelDescription, dominant_activation
from estimators.model_input import (ModelSource, build_model, check_batch_size, first_tensor, make_batch, parse_dtype,
                                    quiet_fake_tensor_errors)
from estimators.types import EstimatorError

__all__ = ["description_from_module"]


def _is_layer(module: nn.Module) -> bool:
    return not list(module.children()) or any(True for _ in module.parameters(recurse=False))


def description_from_module(source: ModelSource, *, batch_size: int, input_shape: tuple[int, ...] | None = None,
                            sample_input: Any = None, dtype: str = "float32") -> ModelDescription:
    check_batch_size(batch_size)
    torch_dtype = parse_dtype(dtype)
    model = build_model(source, on_meta=True)
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta:
        model = model.to(torch_dtype)
    layers: list[Layer] = []
    called: set[int] = set()

    def record(module: nn.Module, _inputs: Any, output: Any) -> None:
        try:
            out = first_tensor(output)
        except EstimatorError:
            return
        called.add(id(module))
        params = sum(p.numel() for p in module.parameters(recurse=False))
        layers.append(Layer(type(module).__name__, out.numel() // batch_size, params))

    handles = [m.register_forward_hook(record) for m in model.modules() if _is_layer(m)]
    try:
        device = "meta" if on_meta else next((p.device for p in model.parameters()), torch.device("cpu"))
        with quiet_fake_tensor_errors(), FakeTensorMode(allow_non_fake_inputs=True):
            inputs = make_batch(model, batch_size, input_shape, sample_input, torch_dtype, device)
            with torch.no_grad():
                inputs.forward(model)
    except EstimatorError:
        raise
    except Exception as exc:  # any model/shape mismatch surfaces here
        raise EstimatorError(f"forward pass failed while extracting features: {type(exc).__name__}: {exc}") from exc
    finally:
        for h in handles:
            h.remove()
    # Parameters used functionally (e.g. MultiheadAttention.out_proj) were never seen by a hook.
    unseen = sum(p.numel() for m in model.modules() if id(m) not in called for p in m.parameters(recurse=False))
    if unseen:
        layers.append(Layer("unhooked_parameters", 0, unseen))
    if not layers:
        raise EstimatorError("the model produced no layer outputs (no leaf module was called)")
    return ModelDescription(tuple(layers), batch_size, dominant_activation(l.name for l in layers),
                            torch.finfo(torch_dtype).bits // 8)
