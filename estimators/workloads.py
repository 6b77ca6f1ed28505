"""``estimate_for_workload``: our estimate for a named thesis workload, fast enough for a 100k-job replay.

Three sources, never the measured (oracle) peak (a test checks that the oracle cannot change it):

1. **Trace** — workloads whose architecture ``estimators.zoo`` defines (ResNet-18/34/50, VGG-16,
   MobileNetV2, MobileNetV3-Small, Xception, Inception v3, EfficientNet-B0, the MNIST CNN, BERT
   base/large, GPT-2 large, XLNet base/large, Mask R-CNN), set up as the thesis' scripts ran them (see
   ``zoo/registry.py`` and ``_TRANSFORMER_SEQ``/``_DATA_PARALLEL`` below for the evidence): the
   trace path's best estimate, low and high bound, precomputed at batch sizes 8..128 into
   ``models/workload_table.json`` (``hier-sched estimators build-workload-table`` rebuilds it),
   interpolated linearly in the batch size in between (memory is affine in the batch) and
   extrapolated from the two nearest points. ``peak_mib`` is what ``auto`` reserves: the best
   estimate plus ``AUTO_MARGIN`` (``safe=False``: the best estimate itself).
2. **Transfer from the thesis' FakeTensor value** — CNNs we cannot build but whose recorded
   FakeTensor estimate exists (UNet: its input size is unknown): FakeTensor saw forward +
   backward tensors only, so we map it through an envelope fitted on the *buildable* workloads
   (our ``auto`` value vs. their recorded FakeTensor value): ``context + max(slope x ft, floor)``,
   where slope/floor are the largest ratios seen, so the envelope upper-bounds every buildable case.
   The measured peaks of carma_workloads.csv are never read here — only its FakeTensor column.
3. Anything else (no trace, no FakeTensor value: DLRM, GPT-2 XL, DenseNet) gets
   the whole GPU — an unknown job runs alone rather than risk its neighbours.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hier_sched.core.gpu_types import gpu_type

from estimators.baseline import default_baseline
from estimators.data import shared_dir
from estimators.trace_estimator import reserve_value
from estimators.types import EstimatorError, MemoryEstimate

__all__ = ["estimate_for_workload", "build_workload_table", "WORKLOAD_TABLE", "canonical_workload", "traced_workload"]

WORKLOAD_TABLE = Path(__file__).resolve().parent / "models" / "workload_table.json"
FAILED_MIB = 40000  # the thesis' "estimator failed" value
TABLE_BATCHES = (8, 16, 32, 64, 128)
_IMAGENET_BATCH_BY_SUFFIX = {"": 32, "2": 64, "3": 128}
_CIFAR_BATCH_BY_SUFFIX = {"1": 32, "2": 64, "3": 128}

# Workload family (rad-file stem without its variant suffix, lower case) -> zoo model.
_ZOO_OF_FAMILY = {
    "resnet": "resnet50", "resnet50": "resnet50", "vgg": "vgg16", "vgg16": "vgg16",
    "mobilenet": "mobilenet_v2", "resnet18_cifar100": "resnet18_cifar100",
    "resnet34_cifar100": "resnet34_cifar100", "mobilenet_cifar100": "mobilenet_v3_small_cifar100",
    "mnist_train": "mnist_cnn", "mnist": "mnist_cnn", "bert_base": "bert_base", "bert_large": "bert_large",
    "gpt2_large": "gpt2_large", "xception": "xception", "inception": "inception_v3",
    "efficientnet": "efficientnet_b0", "efficientnet_cifar100": "efficientnet_b0_cifar100",
    "xlnet_base_cased": "xlnet_base", "xlnet_large_cased": "xlnet_large", "maskrcnn": "maskrcnn_resnet50_fpn",
}
# Workloads whose command line fixes the batch, whatever the CSV's batch column says: Mask R-CNN runs
# the torchvision detection reference with ``-b 8`` (images per GPU); the CSV lists 128.
_BATCH_OF_COMMAND = {"maskrcnn": 8}
# Batches traced per model (default ``TABLE_BATCHES``): Mask R-CNN's 1344 x 1344 canvas makes
# anything far above its command's batch meaningless.
_TABLE_BATCHES_OF = {"maskrcnn_resnet50_fpn": (2, 4, 8)}
# The transformer scripts (``*_on_wiki.py`` / ``xlnet_*_cased.py``, one family: same Wikipedia
# data, plain ``input_ids``/``labels`` batches) tokenise to 512 tokens: BERT's maximum, the length
# the family's BERT scripts must use, and the one their shared pre-processing gives GPT-2/XLNet too.
# (GPT-2's own limit is 1024; at 1024 tokens and batch 8 a GPT-2-large fp32 step needs > 40 GB, and
# the job ran on A100-40GB, so it did not use 1024 at batch 8 in fp32.)
_TRANSFORMER_SEQ = {"bert_base": 512, "bert_large": 512, "gpt2_large": 512, "xlnet_base": 512, "xlnet_large": 512}
# Zoo models of the thesis' 2-GPU jobs (``num_gpus`` 2 in carma_workloads.csv, rad suffix ``_2``):
# data-parallel, so each GPU also holds DistributedDataParallel's gradient buckets; the CSV batch is
# the per-GPU batch (as for every single-GPU row).
_DATA_PARALLEL = {"gpt2_large", "xlnet_base", "xlnet_large"}


@dataclass(frozen=True, slots=True)
class _Workload:
    family: str  # e.g. "resnet", "efficientnet_cifar100", "xlnet_large_cased"
    batch: int | None  # from the rad file's variant suffix, when it encodes one


def canonical_workload(name: str) -> _Workload:
    """``"resnet3.rad"`` -> (resnet, 128); ``"resnet18_cifar100_20e_2"`` -> (resnet18_cifar100, 64);
    ``"xlnet_large_cased_2"`` -> (xlnet_large_cased, None) (the suffix there counts GPUs)."""
    stem = Path(name.strip()).name.lower().removesuffix(".rad")
    if not stem:
        raise EstimatorError("workload name is empty")
    gavel = re.fullmatch(r"resnet-(18|50) \(batch size (\d+)\)", stem)  # Gavel's job types
    if gavel:
        return _Workload("resnet18_cifar100" if gavel.group(1) == "18" else "resnet50", int(gavel.group(2)))
    cifar = re.fullmatch(r"(.+_cifar100)_\d+e_(\d)", stem)
    if cifar:
        return _Workload(cifar.group(1), _CIFAR_BATCH_BY_SUFFIX.get(cifar.group(2)))
    imagenet = re.fullmatch(r"(resnet|vgg|mobilenet|efficientnet|inception|xception|densenet)([23]?)", stem)
    if imagenet:
        return _Workload(imagenet.group(1), _IMAGENET_BATCH_BY_SUFFIX[imagenet.group(2)])
    return _Workload(re.sub(r"_\d$", "", stem), None)


# --- building the table (slow: traces; run by the CLI, not at import) -----------------------------

def _recorded_rows() -> list[dict[str, str]]:
    path = shared_dir() / "data" / "workloads" / "carma_workloads.csv"
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _valid(value: str | float | None) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if 0 < v < FAILED_MIB else None


def build_workload_table(out: Path = WORKLOAD_TABLE, gpu: str = "A100-40GB") -> dict:
    """Trace every zoo model at ``TABLE_BATCHES`` and fit the FakeTensor-transfer envelope on the
    buildable workloads of carma_workloads.csv (recorded FakeTensor column only)."""
    import tempfile

    from estimators.trace_estimator import trace_memory
    from estimators.zoo import build

    empty_state = tempfile.mkdtemp()  # no probe or learned baseline of this machine: the default is traced

    traced: dict[str, dict[str, dict[str, float]]] = {"low": {}, "peak": {}, "high": {}}
    base = default_baseline(gpu)
    for model in sorted(set(_ZOO_OF_FAMILY.values())):
        z = build(model)
        for part in traced.values():
            part[model] = {}
        for batch in _TABLE_BATCHES_OF.get(model, TABLE_BATCHES):
            est = trace_memory(z.factory, batch_size=batch, gpu=gpu, timeout_s=600, state_dir=empty_state,
                               **_trace_kwargs(model, z))
            for part, value in (("low", est.low_mib), ("peak", est.peak_mib), ("high", est.high_mib)):
                traced[part][model][str(batch)] = round(value, 1)
    ctx = base.mib
    slopes, floors = [], []
    for row in _recorded_rows():
        w = canonical_workload(row["rad_file"])
        ft = _valid(row["faketensor_est_mib"])
        model = _ZOO_OF_FAMILY.get(w.family)
        if model is None or ft is None or model in _TRANSFORMER_SEQ:
            continue
        batch = _BATCH_OF_COMMAND.get(w.family, int(row["batch_size"]))
        ours = reserve_value(_interpolate(traced["peak"][model], batch), _interpolate(traced["high"][model], batch))
        (slopes if ft >= 1000 else floors).append((ours - ctx) / ft if ft >= 1000 else ours - ctx)
    table = {
        "gpu": gpu,
        "batches": list(TABLE_BATCHES),
        "transformer_seq_len": _TRANSFORMER_SEQ,
        "traced_mib": traced,
        # The process baseline the traced values include (low and peak; high: ``Baseline.high_mib``);
        # lookups swap it for the current one (``default_baseline``).
        "baseline_mib": base.mib, "baseline_high_mib": base.high_mib(),
        "ft_transfer": {"context_mib": ctx, "slope": round(max(slopes), 4), "floor_mib": round(max(floors), 1),
                        "fitted_on": len(slopes) + len(floors)},
    }
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    _table.cache_clear()
    estimate_for_workload.cache_clear()
    return table


def _trace_kwargs(model: str, z: Any) -> dict[str, Any]:
    """How a zoo model is traced for the thesis workloads: its input (transformers at their
    sequence length), optimizer, and DDP's buckets for the 2-GPU jobs."""
    shape = (_TRANSFORMER_SEQ[model],) if model in _TRANSFORMER_SEQ else z.input_shape
    return dict(input_shape=shape, optimizer=z.optimizer, data_parallel=model in _DATA_PARALLEL)


def traced_workload(workload: str, batch_size: int | None) -> tuple[str, int, Any, dict[str, Any]] | None:
    """(zoo model, batch, factory, trace keyword arguments) of a thesis workload the trace path
    builds (the table's rows), else None."""
    from estimators.zoo import build

    w = canonical_workload(workload)
    batch = _BATCH_OF_COMMAND.get(w.family) or batch_size or w.batch
    model = _ZOO_OF_FAMILY.get(w.family)
    if model is None or batch is None:
        return None
    z = build(model)
    return model, batch, z.factory, _trace_kwargs(model, z)


def _interpolate(points: dict[str, float], batch: int) -> float:
    """Linear in batch through the two nearest traced batches (extrapolates at the ends)."""
    xs = sorted(int(b) for b in points)
    lo, hi = (xs[0], xs[1]) if batch <= xs[0] else (xs[-2], xs[-1]) if batch >= xs[-1] else \
        max((a, b) for a, b in zip(xs, xs[1:]) if a <= batch)
    y0, y1 = points[str(lo)], points[str(hi)]
    return max(y0 + (y1 - y0) * (batch - lo) / (hi - lo), 1.0)


@lru_cache(maxsize=1)
def _table() -> dict:
    if not WORKLOAD_TABLE.is_file():
        raise EstimatorError(f"{WORKLOAD_TABLE} missing; run `hier-sched estimators build-workload-table`")
    return json.loads(WORKLOAD_TABLE.read_text())


def _recorded_value(recorded: dict[str, float | None], name: str) -> float | None:
    for key in (name, f"{name}_mib", f"{name}_est_mib"):
        if key in recorded:
            return _valid(recorded[key])
    return None


@lru_cache(maxsize=4096)
def _cached(workload: str, batch_size: int | None, ft: float | None, gpu: str, safe: bool) -> MemoryEstimate:
    g = gpu_type(gpu)
    table = _table()
    w = canonical_workload(workload)
    batch = _BATCH_OF_COMMAND.get(w.family) or batch_size or w.batch
    model = _ZOO_OF_FAMILY.get(w.family)
    base = default_baseline(gpu)
    if model is not None and batch is not None:
        # The table holds a trace on its GPU type with the baseline of its build; swap that for
        # this GPU type's current one (the thesis' server is no node of ours: no probe applies).
        shift, shift_high = base.mib - table["baseline_mib"], base.high_mib() - table["baseline_high_mib"]
        low, peak, high = (_interpolate(table["traced_mib"][p][model], batch) + (shift_high if p == "high" else shift)
                           for p in ("low", "peak", "high"))
        low, high = min(low, peak), max(high, peak)
        method = f"ours:trace-table({model}, batch {batch})"
        reserve = reserve_value(peak, high) if safe else peak
        if reserve > g.memory_mib:
            # The trace says it does not fit; the job ran on this GPU type, so give it the whole GPU
            # (a need above the GPU's size would make a scheduler reject it as never placeable).
            whole = float(g.memory_mib)
            return MemoryEstimate(whole, min(low, whole), max(high, whole), method + " capped at the whole GPU", 0.0,
                                  notes=f"trace estimate {reserve:.0f} MiB")
        return MemoryEstimate(reserve, low, high, method, 0.0)
    if ft is not None:
        t = table["ft_transfer"]
        high = base.mib + max(t["slope"] * ft, t["floor_mib"])
        return MemoryEstimate(high, base.mib + ft, high, "ours:faketensor-transfer", 0.0)
    return MemoryEstimate(float(g.memory_mib), 1.0, float(g.memory_mib), "ours:whole-gpu (no trustworthy basis)", 0.0,
                          notes=f"workload family {w.family!r} is not buildable here and has no FakeTensor value")


def estimate_for_workload(workload: str, batch_size: int | None, recorded: dict[str, float | None],
                          gpu: str = "A100-40GB", *, safe: bool = True) -> MemoryEstimate:
    """Per-GPU peak (MiB) for a thesis workload. ``recorded`` holds the trace's recorded estimates
    (keys ``horus``/``faketensor``/``gpumemnet``, optionally with ``_mib``; 40000 or None = failed);
    only the FakeTensor value is used, and only for workloads we cannot trace.

    ``safe=True`` (default): ``peak_mib`` is the value to reserve, with ``estimate_memory``'s
    ``auto`` semantics — for traced workloads the best estimate plus ``AUTO_MARGIN`` (the node actor
    adds its own margin on top), capped at the whole GPU. ``safe=False``: the trace's best estimate.
    ``high_mib`` is the wide safe bound either way. The other two sources have no separate best
    estimate and return their (upper-envelope) value either way."""
    return _cached(workload, batch_size, _recorded_value(recorded, "faketensor"), gpu, safe)


estimate_for_workload.cache_clear = _cached.cache_clear  # type: ignore[attr-defined]
