"""``hier-sched estimators evaluate --llm``: the LLM estimator against measured runs.

Reads any CSV of the schema of ``data/llm/litgpt_runs.csv`` (one run a row: the architecture as a
Hugging Face ``hf_model_type`` and ``hf_config``, the set-up, the GPU, the metric and the measured
peak or an OOM), estimates each row and compares like with like: the estimate's quantity of the
row's ``metric`` (``LlmEstimate.quantity``) against the measured peak, and for the rows that ran out
of memory, the whole process's estimate against the GPU's memory. Rows marked ``doubtful`` are
estimated and shown but left out of the figures.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from hier_sched.core.spec import TrainingSpec

from estimators.llm_estimate import METRICS, LlmEstimate, baseline_for, compose
from estimators.llm_trace import trace_step
from estimators.types import EstimatorError

__all__ = ["RowResult", "setup_of_row", "evaluate_rows", "summary"]

GIB = 2**30
MIB = 2**20
_REQUIRED = ("run_id", "hf_model_type", "hf_config", "method", "micro_batch", "seq_len", "gpu_memory_gib", "metric")
_METHODS = {"full": "none", "lora": "lora", "qlora": "lora", "adapter": "adapter", "adapter_v2": "adapter_v2"}
_SHARDINGS = {"none": "none", "": "none", "ddp": "ddp", "fsdp": "fsdp", "fsdp_full_shard": "fsdp", "fsdp2": "fsdp2",
              "zero1": "zero1", "zero2": "zero2", "zero3": "zero3"}
# Traces at a time: this machine's cores, two at most (a shared machine's other users keep theirs).
DEFAULT_WORKERS = min(2, os.cpu_count() or 1)
# litgpt's LoRA dropout, which the runs of its tables used (the schema has no column for it).
_DEFAULT_LORA_DROPOUT = 0.05


@dataclass
class RowResult:
    run_id: str
    row: dict
    metric: str
    measured_gib: float | None  # None: the run ran out of memory
    oom: bool
    doubtful: bool
    gpu_memory_gib: float
    estimate: LlmEstimate | None = None
    error: str = ""

    @property
    def estimated_gib(self) -> float | None:
        return None if self.estimate is None else self.estimate.quantity(self.metric) * MIB / GIB

    @property
    def error_pct(self) -> float | None:
        """Signed error of the estimate, in % of the measured peak (negative: under-estimated)."""
        if self.estimate is None or self.measured_gib is None:
            return None
        return 100 * (self.estimated_gib - self.measured_gib) / self.measured_gib

    @property
    def predicted_oom(self) -> bool | None:
        return None if self.estimate is None else self.estimate.peak_mib * MIB / GIB > self.gpu_memory_gib

    def as_dict(self) -> dict:
        e = self.estimate
        return {"run_id": self.run_id, "model": self.row.get("model", ""), "method": self.row.get("method", ""),
                "metric": self.metric, "gpu": self.row.get("gpu", ""), "measured_gib": self.measured_gib,
                "oom": self.oom, "doubtful": self.doubtful,
                "estimated_gib": None if e is None else round(self.estimated_gib, 3),
                "process_gib": None if e is None else round(e.peak_mib / 1024, 3),
                "error_pct": None if self.error_pct is None else round(self.error_pct, 2),
                "predicted_oom": self.predicted_oom, "estimator": None if e is None else e.method,
                "phase": None if e is None else e.phase, "trace_s": None if e is None else round(e.seconds, 2),
                "parts_mib": None if e is None else {k: round(v, 1) for k, v in e.parts.items()},
                "error": self.error}


def _flag(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")


def _optimizer(text: str) -> str:
    t = text.lower().replace("-", "").replace("_", "")
    paged, eight_bit = "paged" in t, "8bit" in t or "8 bit" in t
    if paged:
        return "paged_adamw8bit" if eight_bit else "paged_adamw"
    if eight_bit:
        return "adamw8bit"
    for name in ("adamw", "adam", "sgd"):
        if name in t:
            return name
    raise EstimatorError(f"optimizer {text!r} is none of AdamW, Adam, SGD and their 8-bit or paged kinds")


def setup_of_row(row: dict) -> TrainingSpec:
    """The training set-up a row describes (``EstimatorError`` names the column at fault)."""
    missing = [c for c in _REQUIRED if not row.get(c, "").strip()]
    if missing:
        raise EstimatorError(f"empty column(s): {', '.join(missing)}")
    try:
        config = json.loads(row["hf_config"])
    except json.JSONDecodeError as exc:
        raise EstimatorError(f"hf_config is not JSON: {exc}") from None
    n_params, in_run = row.get("n_params", "").strip(), row.get("n_params_in_run", "").strip()
    if n_params and in_run and int(in_run) > int(n_params):
        config["tie_word_embeddings"] = False  # the run held a separate head (see the data's README)
    method = row["method"].strip()
    if method not in _METHODS:
        raise EstimatorError(f"method {method!r} is none of {', '.join(_METHODS)}")
    sharding = row.get("sharding", "none").strip()
    if sharding not in _SHARDINGS:
        raise EstimatorError(f"sharding {sharding!r} is none of {', '.join(k for k in _SHARDINGS if k)}")
    world = int(row.get("n_gpus") or 1)
    kind = _SHARDINGS[sharding]
    if kind == "none" and world > 1:
        kind = "ddp"
    fields = {
        "hf_model_type": row["hf_model_type"].strip(), "hf_config": config,
        "precision": row.get("precision", "").strip() or "bf16-mixed",
        "checkpointing": "block" if _flag(row.get("grad_checkpointing", "")) else "none",
        "peft": _METHODS[method], "quantization": row.get("quant", "").strip() or "none",
        "optimizer": _optimizer(row.get("optimizer", "") or "adamw"),
        "sharding": kind if world > 1 else "none", "world_size": world,
        "micro_batch": int(row["micro_batch"]), "seq_len": int(row["seq_len"]),
        "grad_accum": int(row.get("grad_accum") or 1),
    }
    if fields["peft"] == "lora":
        fields.update(lora_r=int(row.get("lora_r") or 8), lora_alpha=float(row.get("lora_alpha") or 16),
                      lora_dropout=float(row.get("lora_dropout") or _DEFAULT_LORA_DROPOUT),
                      lora_targets=tuple(t.strip() for t in (row.get("lora_targets") or "q,v").split(",")))
    try:
        return TrainingSpec(**fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors())
        raise EstimatorError(problems) from None
    except ValueError as exc:
        raise EstimatorError(str(exc)) from None


def _result_of_row(row: dict) -> RowResult:
    metric = row.get("metric", "").strip()
    peak = row.get("peak_gib_per_gpu", "").strip()
    result = RowResult(row.get("run_id", "?"), row, metric, float(peak) if peak else None, _flag(row.get("oom", "")),
                       _flag(row.get("doubtful", "")), float(row.get("gpu_memory_gib") or 0))
    if metric not in METRICS:
        result.error = f"metric {metric!r} is none of {', '.join(METRICS)}"
    elif result.measured_gib is None and not result.oom:
        result.error = "neither a measured peak nor oom=true"
    return result


def _trace_key(setup: TrainingSpec) -> TrainingSpec:
    """The part of a set-up its trace depends on: sharding is composed afterwards (``llm_estimate``),
    and gradient accumulation only matters as "more than one micro-batch"."""
    return setup.model_copy(update={"sharding": "none", "world_size": 1, "grad_accum": min(setup.grad_accum, 2)})


def evaluate_rows(path: Path, progress: Callable[[RowResult], None] | None = None,
                  workers: int = DEFAULT_WORKERS) -> list[RowResult]:
    """Estimate every row of the CSV at ``path``; a row that cannot be estimated keeps its reason.
    Set-ups whose traces are the same (other GPUs, other sharding) are traced once, ``workers``
    traces at a time (fresh processes: nothing of this one is inherited)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise EstimatorError(f"{path}: no rows")
    results, setups = [], []
    for row in rows:
        result = _result_of_row(row)
        setup = None
        if not result.error:
            try:
                setup = setup_of_row(row)
            except EstimatorError as exc:
                result.error = str(exc)
        results.append(result)
        setups.append(setup)
    keys = {_trace_key(s).model_dump_json(): _trace_key(s) for s in setups if s is not None}
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {key: pool.submit(trace_step, setup) for key, setup in keys.items()}
        for result, setup, row in zip(results, setups, rows):
            if setup is not None:
                try:
                    figures = futures[_trace_key(setup).model_dump_json()].result()
                    result.estimate = compose(setup, figures, baseline_for(row.get("gpu"))[0])
                except EstimatorError as exc:
                    result.error = str(exc)
                except Exception as exc:  # noqa: BLE001 - a model the trace cannot run is that row's failure
                    result.error = f"{type(exc).__name__} while tracing: {str(exc)[:300]}"
            if progress is not None:
                progress(result)
    return results


def summary(results: list[RowResult]) -> dict:
    """The figures over the rows that are not doubtful."""
    counted = [r for r in results if not r.doubtful]
    estimated = [r for r in counted if r.estimate is not None]
    measured = [r for r in estimated if r.measured_gib is not None]
    errors = [r.error_pct for r in measured]
    oom_rows = [r for r in counted if r.oom]
    oom_hit = [r for r in oom_rows if r.predicted_oom]
    under10 = [e for e in errors if e < -10]
    return {
        "rows": len(counted), "estimated": len(estimated), "doubtful_rows": len(results) - len(counted),
        "measured_rows": len(measured),
        "median_abs_err_pct": statistics.median(abs(e) for e in errors) if errors else float("nan"),
        "median_err_pct": statistics.median(errors) if errors else float("nan"),
        "under10_pct": 100 * len(under10) / len(errors) if errors else float("nan"),
        "over25_pct": 100 * sum(e > 25 for e in errors) / len(errors) if errors else float("nan"),
        "oom_rows": len(oom_rows),
        "oom_predicted_pct": 100 * len(oom_hit) / len(oom_rows) if oom_rows else float("nan"),
        "median_trace_s": statistics.median(r.estimate.seconds for r in estimated) if estimated else float("nan"),
        "row_results": [r.as_dict() for r in results],
    }
