"""How much of the public model world the trace path estimates (``hier-sched estimators coverage``).

Two sources, never a weight download:
- ``timm``: every architecture of timm's registry (``timm.list_models()``), built with
  ``pretrained=False`` at the input size of its default pretrained configuration;
- ``hf``: every Hugging Face architecture with a sequence-classification or image-classification
  head (``transformers``' auto mappings), built from its default configuration.

Each model is estimated once with ``estimate_memory(method="auto")`` at a batch size drawn from
``BATCH_SIZES`` (seeded by the model's name), optimizer SGD with momentum, on an A100-40GB, and
recorded as ``traced`` (``method`` starts with ``auto:trace``), ``fell back`` (the ML path answered;
the trace's failure reason is kept) or ``failed`` (no estimate), with the seconds it took.
Results are appended to a JSON-lines file one model at a time, in a seeded random order, so a run
can be stopped at any point (``--time-budget``) with a random sample done, and resumed by running
the same command again.
"""

from __future__ import annotations

import functools
import json
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from estimators.data import read_jsonl
from estimators.types import EstimatorError

__all__ = ["SOURCES", "BATCH_SIZES", "CoverageRow", "run_coverage", "summarise", "load_rows"]

BATCH_SIZES = (8, 16, 32, 64, 128)
SOURCES = ("timm", "hf")
HF_TEXT_TOKENS = 128
# A real-tensor trace (models whose forward reads tensor values) may take this share of the host
# memory here instead of the default half: a coverage run shares its machine for an hour.
COVERAGE_CPU_RUN_MEMORY_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class CoverageRow:
    source: str
    model: str
    batch_size: int
    input: str  # e.g. "3x224x224" or "input_ids 128"
    outcome: str  # traced | fell back | failed
    method: str
    peak_mib: float | None
    seconds: float
    reason: str  # why the trace failed ("" when traced)


@dataclass(frozen=True, slots=True)
class _Case:
    model: str
    factory: Callable[[], Any]
    input_shape: tuple[int, ...] | None = None
    sample_input: Callable[[int], Any] | None = None  # batch size -> inputs
    described: str = ""


def _batch_for(seed: int, model: str) -> int:
    return random.Random(f"{seed}:{model}").choice(BATCH_SIZES)


def _timm_cases(names: list[str]) -> Iterator[_Case]:
    import timm

    for name in names:
        size = tuple(timm.models.get_pretrained_cfg(name).input_size)
        yield _Case(name, functools.partial(timm.create_model, name, pretrained=False), input_shape=size,
                    described="x".join(map(str, size)))


def _timm_names() -> list[str]:
    import timm

    return timm.list_models()


def _hf_names() -> list[str]:
    from transformers.models.auto import modeling_auto

    names = {f"seq-cls:{t}" for t in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES}
    names |= {f"img-cls:{t}" for t in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES}
    return sorted(names)


def _hf_model(head: str, model_type: str) -> Any:
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    # A sequence classifier on a decoder pools at the last non-padding token, so it refuses batches
    # without a padding id; a user sets one (any id: our inputs have no padding), as we do here.
    for part in {id(c): c for c in (config, getattr(config, "get_text_config", lambda: config)())}.values():
        if getattr(part, "pad_token_id", 0) is None:
            part.pad_token_id = 0
    auto = (transformers.AutoModelForSequenceClassification if head == "seq-cls"
            else transformers.AutoModelForImageClassification)
    return auto.from_config(config)


def _text_inputs(vocab: int, tokens: int, decoder: bool, batch: int) -> dict:
    import torch

    ids = torch.randint(0, vocab, (batch, tokens))
    return {"input_ids": ids, "decoder_input_ids": ids} if decoder else {"input_ids": ids}


def _image_inputs(channels: int, height: int, width: int, batch: int) -> dict:
    import torch

    return {"pixel_values": torch.randn(batch, channels, height, width)}


def _hf_cases(names: list[str]) -> Iterator[_Case]:
    import transformers

    for name in names:
        head, model_type = name.split(":", 1)
        factory = functools.partial(_hf_model, head, model_type)
        try:
            config = transformers.AutoConfig.for_model(model_type)
        except Exception as exc:  # noqa: BLE001 - a config the library itself cannot build is a row to report
            yield _Case(name, functools.partial(_raise, f"AutoConfig.for_model failed: {type(exc).__name__}: {exc}"))
            continue
        if head == "img-cls":
            size = getattr(config, "image_size", 224)
            h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
            channels = getattr(config, "num_channels", 3)
            yield _Case(name, factory, sample_input=functools.partial(_image_inputs, channels, h, w),
                        described=f"pixel_values {channels}x{h}x{w}")
        else:
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            vocab = getattr(text, "vocab_size", None) or 1000
            limit = getattr(text, "max_position_embeddings", None) or HF_TEXT_TOKENS
            tokens = min(HF_TEXT_TOKENS, limit)
            decoder = bool(getattr(config, "is_encoder_decoder", False))
            yield _Case(name, factory, sample_input=functools.partial(_text_inputs, vocab, tokens, decoder),
                        described=f"input_ids {tokens}{' + decoder_input_ids' if decoder else ''}")


def _raise(message: str) -> Any:
    raise EstimatorError(message)


def load_rows(path: Path) -> list[CoverageRow]:
    rows = read_jsonl(path, "coverage row")
    try:
        return [CoverageRow(**row) for row in rows]
    except TypeError as exc:
        raise EstimatorError(f"{path}: not a coverage row ({exc})") from None


def _estimate(case: _Case, batch: int, source: str, timeout_s: float, state_dir: str) -> CoverageRow:
    from estimators.api import estimate_memory

    start = time.perf_counter()
    sample = case.sample_input(batch) if case.sample_input else None
    try:
        est = estimate_memory(case.factory, batch_size=batch, input_shape=case.input_shape, sample_input=sample,
                              optimizer="sgd", timeout_s=timeout_s, state_dir=state_dir)
    except EstimatorError as exc:
        return CoverageRow(source, case.model, batch, case.described, "failed", "", None,
                           round(time.perf_counter() - start, 2), str(exc)[:400])
    traced = est.method.startswith("auto:trace")
    reason = "" if traced else est.method.partition("(trace failed: ")[2].removesuffix(")")
    return CoverageRow(source, case.model, batch, case.described, "traced" if traced else "fell back", est.method[:200],
                       round(est.peak_mib, 1), round(time.perf_counter() - start, 2), reason)


def run_coverage(source: str, out: Path, *, sample: int | None = None, seed: int = 0,
                 time_budget_s: float | None = None, timeout_s: float = 120.0,
                 progress: Callable[[CoverageRow], None] | None = None) -> list[CoverageRow]:
    """Estimate every model of ``source`` not yet in ``out`` (or a seeded random ``sample`` of the
    registry), appending one JSON line per model; stops starting new models once
    ``time_budget_s`` has passed. Returns every row in ``out``."""
    if source not in SOURCES:
        raise EstimatorError(f"coverage source must be one of {', '.join(SOURCES)} (got {source!r})")
    from estimators import trace_estimator

    trace_estimator.REAL_RUN_MEMORY_SHARE = COVERAGE_CPU_RUN_MEMORY_SHARE
    # In a seeded random order: a run stopped by its time budget has estimated a random sample.
    names = _timm_names() if source == "timm" else _hf_names()
    names = random.Random(seed).sample(names, len(names) if sample is None else min(sample, len(names)))
    done = {r.model for r in load_rows(out) if r.source == source}
    todo = [n for n in names if n not in done]
    cases = _timm_cases(todo) if source == "timm" else _hf_cases(todo)
    start = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as state_dir:  # no recorded peaks: every estimate is a fresh one
        for case in cases:
            if time_budget_s is not None and time.monotonic() - start > time_budget_s:
                break
            row = _estimate(case, _batch_for(seed, case.model), source, timeout_s, state_dir)
            with out.open("a") as fh:
                fh.write(json.dumps(asdict(row)) + "\n")
            if progress:
                progress(row)
    return load_rows(out)


def summarise(rows: list[CoverageRow]) -> dict[str, Any]:
    """Counts per outcome, share traced, seconds per estimate, and the failure reasons grouped."""
    outcomes = Counter(r.outcome for r in rows)
    seconds = [r.seconds for r in rows]
    reasons = Counter(_reason_class(r.reason) for r in rows if r.outcome != "traced")
    return {
        "models": len(rows),
        "traced": outcomes["traced"], "fell back": outcomes["fell back"], "failed": outcomes["failed"],
        "traced share": outcomes["traced"] / len(rows) if rows else float("nan"),
        "cpu-run": sum("trace:cpu-run" in r.method for r in rows),
        "median s": statistics.median(seconds) if seconds else float("nan"),
        "p90 s": statistics.quantiles(seconds, n=10)[-1] if len(seconds) > 1 else float("nan"),
        "reasons": reasons.most_common(),
    }


def _reason_class(reason: str) -> str:
    """A failure reason without its model-specific details (numbers, shapes), to group rows."""
    return re.sub(r"\d+", "N", reason)[:140]
