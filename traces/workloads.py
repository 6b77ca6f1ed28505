"""The thesis' real training workloads: ``carma_workloads.csv`` joined with ``solo_profiles.csv``.

Every trace job needs a solo duration, a true peak memory and a utilization profile. The carma
table has durations, peaks and the recorded estimates; the AEGIS solo profiles have SMACT / SMOCC /
DRAMA. They name workloads differently (``resnet3.rad`` vs ``resnet50_imagenet_bs128_1gpu``), so
``PROFILE_OF`` below joins them by hand. Each line was checked against the command line in
``carma_workloads.csv`` (model, dataset, batch size, epochs); ``tests/traces/test_traces_workloads.py``
re-checks batch size, epochs and memory for every line.

Choices, with reasons:

* Duration = ``sim_solo_runtime_min`` x 60. That column is already epoch time x epochs: it equals
  the thesis' Table 6.2 "Epoch Time(m)" times "#Training Epochs" (xlnet_base 8.9495 x 8 = 71.59,
  xlnet_large 25.3138 x 3 = 75.94, resnet18/cifar100 bs32 0.3284 x 20 = 6.568 and x 50 = 16.42), so
  multiplying by epochs again would count them twice. Where the column is empty (UNet, dlrm,
  maskrcnn) the AEGIS profile's ``training_loop_time_s`` is used instead: the same workload run
  solo on the same GPU type, loop only.
* The ``*_50e_3`` resnet18/34 rows run ``--epochs 20`` on their command line, but their runtime is
  the 50-epoch figure (0.1634 min x 50 = 8.17) and their name says 50e: they map to the 50-epoch
  profiles.
* maskrcnn's ``batch_size`` column says 128 while its command says ``-b 8`` and its profile is
  ``maskrcnn_coco_bs8``: the command wins (``_BATCH_SIZE_FIXES``).
* A multi-GPU profile is the mean over the GPUs that were busy (mean SMACT > 0): xlnet_base's
  second GPU sat idle (428 MiB, SMACT 0), so its first GPU alone describes the job's per-GPU load.
* Workloads without a profile (BERT_base, BERT_large, xlnet_large, gpt2_xl) get the mean profile
  of the profiled workloads of the same kind (here: xlnet_base and gpt2_large, the transformers).
* Estimates of 40000 MiB mean "the estimator failed" in the thesis; they are kept as recorded.
* Rows without a measured peak (gpt2_xl) cannot be replayed and are left out of the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import fmean
from types import MappingProxyType

from traces._csv import Row, read_rows
from traces._paths import cached_per_data_dir, data_file
from traces.schema import TraceError

__all__ = [
    "UtilProfile", "SoloProfile", "Workload", "PROFILE_OF", "solo_profiles", "carma_workloads", "skipped_workloads",
]

# rad file stem -> (AEGIS solo-profile workload_id, or None where none was profiled; model kind)
PROFILE_OF: dict[str, tuple[str | None, str]] = {
    "BERT_base": (None, "transformer"),
    "BERT_large": (None, "transformer"),
    "Inception": ("inception_imagenet_bs32_1gpu", "cnn"),
    "Inception2": ("inception_imagenet_bs64_1gpu", "cnn"),
    "Inception3": ("inception_imagenet_bs128_1gpu", "cnn"),
    "UNet": ("unet_voc_1gpu", "cnn"),
    "Xception": ("xception_imagenet_bs32_1gpu", "cnn"),
    "Xception2": ("xception_imagenet_bs64_1gpu", "cnn"),
    "Xception3": ("xception_imagenet_bs128_1gpu", "cnn"),
    "dlrm": ("dlrm_criteo_bs32768_1gpu", "mlp"),  # embeddings + MLPs
    "efficientNet": ("efficientnet_imagenet_bs32_1gpu", "cnn"),
    "efficientNet2": ("efficientnet_imagenet_bs64_1gpu", "cnn"),
    "efficientNet3": ("efficientnet_imagenet_bs128_1gpu", "cnn"),
    "efficientNet_cifar100_20e_1": ("efficientnet_cifar100_bs32_20e_1gpu", "cnn"),
    "efficientNet_cifar100_20e_2": ("efficientnet_cifar100_bs64_20e_1gpu", "cnn"),
    "efficientNet_cifar100_20e_3": ("efficientnet_cifar100_bs128_20e_1gpu", "cnn"),
    "efficientNet_cifar100_50e_1": ("efficientnet_cifar100_bs32_50e_1gpu", "cnn"),
    "efficientNet_cifar100_50e_2": ("efficientnet_cifar100_bs64_50e_1gpu", "cnn"),
    "efficientNet_cifar100_50e_3": ("efficientnet_cifar100_bs128_50e_1gpu", "cnn"),
    "gpt2_large_2": ("gpt2_large_wiki_bs8_2gpu", "transformer"),
    "gpt2_xl": (None, "transformer"),
    "maskrcnn": ("maskrcnn_coco_bs8_1gpu", "cnn"),
    "mnist_train": ("mnist_bs32_1gpu", "cnn"),
    "mobilenet": ("mobilenet_imagenet_bs32_1gpu", "cnn"),
    "mobilenet2": ("mobilenet_imagenet_bs64_1gpu", "cnn"),
    "mobilenet3": ("mobilenet_imagenet_bs128_1gpu", "cnn"),
    "mobilenet_cifar100_20e_1": ("mobilenet_cifar100_bs32_20e_1gpu", "cnn"),
    "mobilenet_cifar100_20e_2": ("mobilenet_cifar100_bs64_20e_1gpu", "cnn"),
    "mobilenet_cifar100_20e_3": ("mobilenet_cifar100_bs128_20e_1gpu", "cnn"),
    "mobilenet_cifar100_50e_1": ("mobilenet_cifar100_bs32_50e_1gpu", "cnn"),
    "mobilenet_cifar100_50e_2": ("mobilenet_cifar100_bs64_50e_1gpu", "cnn"),
    "mobilenet_cifar100_50e_3": ("mobilenet_cifar100_bs128_50e_1gpu", "cnn"),
    "resnet": ("resnet50_imagenet_bs32_1gpu", "cnn"),
    "resnet2": ("resnet50_imagenet_bs64_1gpu", "cnn"),
    "resnet3": ("resnet50_imagenet_bs128_1gpu", "cnn"),
    "resnet18_cifar100_20e_1": ("resnet18_cifar100_bs32_20e_1gpu", "cnn"),
    "resnet18_cifar100_20e_2": ("resnet18_cifar100_bs64_20e_1gpu", "cnn"),
    "resnet18_cifar100_20e_3": ("resnet18_cifar100_bs128_20e_1gpu", "cnn"),
    "resnet18_cifar100_50e_1": ("resnet18_cifar100_bs32_50e_1gpu", "cnn"),
    "resnet18_cifar100_50e_2": ("resnet18_cifar100_bs64_50e_1gpu", "cnn"),
    "resnet18_cifar100_50e_3": ("resnet18_cifar100_bs128_50e_1gpu", "cnn"),
    "resnet34_cifar100_20e_1": ("resnet34_cifar100_bs32_20e_1gpu", "cnn"),
    "resnet34_cifar100_20e_2": ("resnet34_cifar100_bs64_20e_1gpu", "cnn"),
    "resnet34_cifar100_20e_3": ("resnet34_cifar100_bs128_20e_1gpu", "cnn"),
    "resnet34_cifar100_50e_1": ("resnet34_cifar100_bs32_50e_1gpu", "cnn"),
    "resnet34_cifar100_50e_2": ("resnet34_cifar100_bs64_50e_1gpu", "cnn"),
    "resnet34_cifar100_50e_3": ("resnet34_cifar100_bs128_50e_1gpu", "cnn"),
    "vgg": ("vgg16_imagenet_bs32_1gpu", "cnn"),
    "vgg2": ("vgg16_imagenet_bs64_1gpu", "cnn"),
    "vgg3": ("vgg16_imagenet_bs128_1gpu", "cnn"),
    "xlnet_base_cased_2": ("xlnet_base_cased_wiki_bs8_2gpu", "transformer"),
    "xlnet_large_cased_2": (None, "transformer"),
}

_BATCH_SIZE_FIXES = {"maskrcnn": 8}  # see the module docstring

_METRICS = ("smact", "smocc", "drama")


@dataclass(frozen=True, slots=True)
class UtilProfile:
    """Solo means of one workload's utilization, per busy GPU; ``source`` says where they came from."""

    smact: float
    smocc: float
    drama: float
    source: str


@dataclass(frozen=True, slots=True)
class SoloProfile:
    util: UtilProfile
    loop_time_s: float
    memory_requirement_mib: float  # AEGIS' measured need; equals the carma oracle peak


@dataclass(frozen=True, slots=True)
class Workload:
    """One real workload with everything a trace job takes from it."""

    name: str  # rad file stem, e.g. "resnet3"
    model_kind: str
    batch_size: int
    gpus: int
    peak_mib: float  # measured (oracle) peak per GPU
    horus_mib: float | None
    faketensor_mib: float | None
    gpumemnet_mib: float | None
    duration_s: float
    duration_source: str
    util: UtilProfile


@cached_per_data_dir
def solo_profiles() -> Mapping[str, SoloProfile]:
    """``solo_profiles.csv`` by workload_id; multi-GPU rows averaged over their busy GPUs."""
    path = data_file("workloads", "solo_profiles.csv")
    columns = ["workload_id", "training_loop_time_s", "gpu_memory_requirement_mib"]
    columns += [f"{m}_mean_full" for m in _METRICS]
    rows_of: dict[str, list[Row]] = {}
    for row in read_rows(path, columns):
        rows_of.setdefault(row.text("workload_id"), []).append(row)
    profiles = {}
    for workload_id, rows in rows_of.items():
        busy = [[row.number(f"{m}_mean_full") for m in _METRICS] for row in rows]
        busy = [means for means in busy if means[0] > 0]
        if not busy:
            raise rows[0].error(f"{workload_id} has no GPU with activity")
        smact, smocc, drama = (fmean(means[i] for means in busy) for i in range(len(_METRICS)))
        profiles[workload_id] = SoloProfile(
            UtilProfile(smact, smocc, drama, f"solo_profiles.csv:{workload_id}"),
            rows[0].number("training_loop_time_s"),
            rows[0].number("gpu_memory_requirement_mib"),
        )
    return MappingProxyType(profiles)


def _kind_defaults(profiles: Mapping[str, SoloProfile]) -> dict[str, UtilProfile]:
    """Mean profile of each model kind over the workloads that were profiled."""
    by_kind: dict[str, list[tuple[str, UtilProfile]]] = {}
    for profile_id, kind in PROFILE_OF.values():
        if profile_id is not None:
            by_kind.setdefault(kind, []).append((profile_id, profiles[profile_id].util))
    defaults = {}
    for kind, members in by_kind.items():
        means = [fmean(getattr(u, m) for _, u in members) for m in _METRICS]
        names = ", ".join(sorted({pid for pid, _ in members}))
        defaults[kind] = UtilProfile(*means, source=f"mean of the {kind} profiles ({names})")
    return defaults


@cached_per_data_dir
def _joined() -> tuple[Mapping[str, Workload], tuple[str, ...]]:
    path = data_file("workloads", "carma_workloads.csv")
    runtime_col = "sim_solo_runtime_min(exclusive_execution.py)"
    columns = ["rad_file", "batch_size", "num_gpus", "oracle_peak_mem_mib", "horus_est_mib",
               "faketensor_est_mib", "gpumemnet_est_mib", runtime_col]
    profiles = solo_profiles()
    missing = {pid for pid, _ in PROFILE_OF.values() if pid is not None} - profiles.keys()
    if missing:
        raise TraceError(f"solo_profiles.csv lacks {', '.join(sorted(missing))} named in PROFILE_OF")
    defaults = _kind_defaults(profiles)
    table: dict[str, Workload] = {}
    skipped: list[str] = []
    for row in read_rows(path, columns):
        stem = row.text("rad_file").removesuffix(".rad")
        if stem not in PROFILE_OF:
            raise row.error(f"workload {stem!r} has no entry in traces.workloads.PROFILE_OF")
        if not row.text("oracle_peak_mem_mib"):
            skipped.append(f"{stem} ({row.where}: no measured peak memory)")
            continue
        profile_id, kind = PROFILE_OF[stem]
        profile = profiles[profile_id] if profile_id else None
        minutes = row.optional_number(runtime_col)
        if minutes is not None:
            duration, duration_source = minutes * 60.0, "carma_workloads.csv sim_solo_runtime_min"
        elif profile is not None:
            duration, duration_source = profile.loop_time_s, f"solo_profiles.csv:{profile_id} training_loop_time_s"
        else:
            raise row.error(f"{stem}: no solo runtime and no solo profile to take one from")
        table[stem] = Workload(
            name=stem,
            model_kind=kind,
            batch_size=_BATCH_SIZE_FIXES.get(stem, row.integer("batch_size")),
            gpus=row.integer("num_gpus"),
            peak_mib=row.number("oracle_peak_mem_mib"),
            horus_mib=row.optional_number("horus_est_mib"),
            faketensor_mib=row.optional_number("faketensor_est_mib"),
            gpumemnet_mib=row.optional_number("gpumemnet_est_mib"),
            duration_s=duration,
            duration_source=duration_source,
            util=profile.util if profile else defaults[kind],
        )
    return MappingProxyType(table), tuple(skipped)


def carma_workloads() -> Mapping[str, Workload]:
    """Every replayable carma workload by rad file stem (cached, read-only)."""
    return _joined()[0]


def skipped_workloads() -> tuple[str, ...]:
    """The carma workloads left out of the table, each with the reason."""
    return _joined()[1]
