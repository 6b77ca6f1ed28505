"""``hier-sched estimators measure``: real training steps on a GPU against their estimates.

Every job is estimated first, in this process, before anything touches CUDA (a trace after CUDA was
initialised in the same process, or in a fork of it, fails with "CUDA error: initialization error").
Then each job runs in a fresh process of its own (``python -m estimators.measure``): a few real
training steps, then ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and NVML's view of
the process. ``--device cpu`` runs the same steps on the CPU (no memory figures): a smoke test of
the whole path on a machine without a GPU.

The jobs (``JOBS``) need only torch, transformers and timm: timm CNNs and a ViT, and a
Llama-3.2-1B-shaped model (its public config, random weights) with LoRA and fully fine-tuned,
with and without activation checkpointing, in bf16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JOBS", "MeasureJob", "estimate_job", "run_job", "measure"]

MIB = 2**20
STEPS = 3
# Llama-3.2-1B's config.json (architecture fields only).
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True,
            "max_position_embeddings": 131072, "hidden_act": "silu", "rope_theta": 500000.0,
            "rms_norm_eps": 1e-05}


@dataclass(frozen=True)
class MeasureJob:
    name: str
    kind: str  # "timm" or "llm"
    params: dict[str, Any] = field(default_factory=dict)


def _llm(name: str, **training: Any) -> MeasureJob:
    base = {"hf_model_type": "llama", "hf_config": LLAMA_1B, "micro_batch": 4, "seq_len": 512}
    return MeasureJob(name, "llm", {**base, **training})


JOBS = [
    MeasureJob("resnet50-b64", "timm", {"model": "resnet50", "batch": 64, "image": 224}),
    MeasureJob("resnet50-b128", "timm", {"model": "resnet50", "batch": 128, "image": 224}),
    MeasureJob("convnext_tiny-b64", "timm", {"model": "convnext_tiny", "batch": 64, "image": 224}),
    MeasureJob("efficientnet_b0-b96", "timm", {"model": "efficientnet_b0", "batch": 96, "image": 224}),
    MeasureJob("vit_base-b64", "timm", {"model": "vit_base_patch16_224", "batch": 64, "image": 224}),
    _llm("llama1b-lora-bf16", precision="bf16", peft="lora", lora_targets=["q", "k", "v", "o"]),
    _llm("llama1b-lora-bf16-ckpt", precision="bf16", peft="lora", lora_targets=["q", "k", "v", "o"],
         checkpointing="block"),
    _llm("llama1b-full-bf16", precision="bf16", micro_batch=2),
    _llm("llama1b-full-bf16-ckpt", precision="bf16", micro_batch=2, checkpointing="block"),
    _llm("llama1b-lora-bf16mixed-ckpt", precision="bf16-mixed", peft="lora", checkpointing="block"),
]
# The same jobs shrunk for ``--device cpu``: every code path, seconds on two cores.
_SMOKE = {"timm": {"batch": 2, "image": 64}, "llm": {"micro_batch": 1, "seq_len": 32,
                                                      "hf_config": {**LLAMA_1B, "num_hidden_layers": 2,
                                                                    "hidden_size": 256, "intermediate_size": 512,
                                                                    "num_attention_heads": 4,
                                                                    "num_key_value_heads": 2, "vocab_size": 1024}}}


def _smoke(job: MeasureJob) -> MeasureJob:
    return MeasureJob(job.name, job.kind, {**job.params, **_SMOKE[job.kind]})


def _timm_factory(params: dict[str, Any]):
    import functools

    import timm

    return functools.partial(timm.create_model, params["model"], pretrained=False)


def estimate_job(job: MeasureJob, gpu: str) -> dict[str, float | str]:
    """The estimate's figures for ``job`` (MiB): process total, reserved and allocated where known."""
    if job.kind == "llm":
        from hier_sched.core.spec import TrainingSpec
        from estimators.llm_estimate import estimate_llm

        est = estimate_llm(TrainingSpec(**job.params), gpu)
        return {"process": est.quantity("process_total"), "reserved": est.quantity("max_reserved"),
                "allocated": est.quantity("max_allocated"), "method": est.method}
    from estimators.trace_estimator import trace_memory

    p = job.params
    est = trace_memory(_timm_factory(p), gpu=gpu, batch_size=p["batch"], input_shape=(3, p["image"], p["image"]),
                       optimizer="adamw")
    parts = est.parts
    reserved = est.peak_mib - parts.baseline_mib - parts.margin_mib
    return {"process": est.peak_mib, "reserved": reserved, "allocated": parts.tensors_mib, "method": est.method}


def _train_steps(job: MeasureJob, device: str) -> None:
    import torch
    from torch.nn import functional as F

    p = job.params
    if job.kind == "timm":
        model = _timm_factory(p)().to(device)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(STEPS):
            x = torch.randn(p["batch"], 3, p["image"], p["image"], device=device)
            y = torch.randint(0, 1000, (p["batch"],), device=device)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return
    from hier_sched.core.spec import TrainingSpec
    from estimators.llm_model import build_llm
    from estimators.llm_trace import _autocast

    setup = TrainingSpec(**p)
    model = build_llm(setup, setup.hf_config["num_hidden_layers"]).model
    model.to_empty(device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], foreach=True)
    autocast = _autocast(setup) if device == "cpu" else _cuda_autocast(setup)
    for _ in range(STEPS):
        for _ in range(setup.grad_accum):
            ids = torch.randint(0, setup.hf_config["vocab_size"], (setup.micro_batch, setup.seq_len), device=device)
            with autocast:
                logits = model(input_ids=ids).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
            del logits
            loss.backward()
            del loss
        opt.step()
        opt.zero_grad(set_to_none=True)


def _cuda_autocast(setup: Any):
    import contextlib

    import torch

    dtypes = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
    return torch.autocast("cuda", dtype=dtypes[setup.precision]) if setup.precision in dtypes \
        else contextlib.nullcontext()


def _nvml_process_mib() -> float | None:
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return proc.usedGpuMemory / MIB
    finally:
        pynvml.nvmlShutdown()
    return None


def run_job(job: MeasureJob, device: str) -> dict[str, Any]:
    """Runs in the job's own process: the steps, then what the device measured (MiB)."""
    start = time.perf_counter()
    out: dict[str, Any] = {"device": device}
    try:
        _train_steps(job, device)
    except Exception as exc:  # noqa: BLE001 - an OOM or a library error is a result of the job
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        out.update(allocated=torch.cuda.max_memory_allocated() / MIB, reserved=torch.cuda.max_memory_reserved() / MIB,
                   process=_nvml_process_mib(), gpu=torch.cuda.get_device_name(0))
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def measure(jobs: list[MeasureJob], *, gpu: str, device: str, timeout_s: float = 240.0) -> list[dict[str, Any]]:
    """Estimate every job, then run each in a fresh process; one result dict per job."""
    if device == "cpu":
        jobs = [_smoke(j) for j in jobs]
    results = []
    for job in jobs:  # estimates first: nothing in this process has touched CUDA yet
        try:
            results.append({"job": job.name, "estimate": estimate_job(job, gpu)})
        except Exception as exc:  # noqa: BLE001 - a failed estimate is reported beside its measurement
            results.append({"job": job.name, "estimate": {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}})
    for job, result in zip(jobs, results):
        payload = json.dumps({"name": job.name, "kind": job.kind, "params": job.params, "device": device})
        try:
            proc = subprocess.run([sys.executable, "-m", "estimators.measure", payload], capture_output=True, check=False,
                                  text=True, timeout=timeout_s)
            lines = proc.stdout.strip().splitlines()
            result["measured"] = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
                {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        except subprocess.TimeoutExpired:
            result["measured"] = {"error": f"did not finish in {timeout_s:.0f} s"}
    return results


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(run_job(MeasureJob(request["name"], request["kind"], request["params"]), request["device"])))
