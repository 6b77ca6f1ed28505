"""``gavel:<name>``: Gavel's Philly-derived cluster traces (``traces/gavel/msr/seed=0/<name>.trace``).

Format (tab-separated, no header, one job per line), as Gavel's trace generator writes it:
``job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor``;
``scale_factor`` is the job's #GPUs.

* Duration: ``total_steps`` / the job's measured V100 throughput (steps/s of the whole job at that
  scale factor) from ``interference/gavel_physical_cluster_throughputs.json`` — the inverse of how
  Gavel turned durations into steps. Scale factors Gavel did not measure (16, 32, ... GPUs, and any
  multi-GPU Recommendation / A3C / CycleGAN job) scale the largest measured one linearly, an
  optimistic (perfect data-parallel) assumption. The V100 time is converted to the A100 reference
  time of ``TraceJob`` with ``gpu_types`` (V100 relative speed 0.55), so a replay on the hinted
  V100 cluster gets the V100 times back.
* Memory and utilization: Gavel's traces carry neither; ``GAVEL_TYPES`` gives each job type a peak
  and a profile, taken from the carma workloads where the same or a similar model was measured on
  an A100, else estimated (each line says which).
* Cluster hint: Gavel's Philly spec (``cluster_specs.json``: 500 V100s) as 8-GPU nodes (p3.16xlarge,
  V100-16GB), rounded up to 63 nodes. Jobs above 8 GPUs are multi-node gangs.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from hier_sched.core.gpu_types import gpu_type
from traces._paths import cached_per_data_dir, data_file
from traces.gang import gpus_per_node_for
from traces.schema import ClusterHint, Trace, TraceError, TraceJob
from traces.workloads import UtilProfile, carma_workloads

__all__ = ["GavelType", "GAVEL_TYPES", "gavel_traces", "load_gavel", "v100_throughputs"]

NODE_GPUS = 8
GAVEL_CLUSTER = ClusterHint(nodes=63, gpus_per_node=NODE_GPUS, gpu_type="V100-16GB")
_TRACE_GPU = "V100-16GB"


@dataclass(frozen=True, slots=True)
class GavelType:
    """What a Gavel job type looks like on a GPU. ``util`` names the carma workload whose solo
    profile it borrows, or is an estimated profile."""

    peak_mib: float
    util: str | UtilProfile
    model_kind: str
    why: str


_LSTM_ESTIMATE = UtilProfile(0.35, 0.15, 0.15, "estimate: small 2-layer LSTM, launch-bound; no RNN was profiled")

# Peaks in MiB per GPU as nvidia-smi reports them on an A100 (CUDA context included).
GAVEL_TYPES: dict[str, GavelType] = {
    # ResNet-18 on CIFAR-10 ~ carma resnet18 on CIFAR-100 (same network, 100- vs 10-way head).
    "ResNet-18 (batch size 16)": GavelType(788, "resnet18_cifar100_20e_1", "cnn", "as bs32: peak is flat below bs64"),
    "ResNet-18 (batch size 32)": GavelType(788, "resnet18_cifar100_20e_1", "cnn", "carma resnet18_cifar100 bs32"),
    "ResNet-18 (batch size 64)": GavelType(796, "resnet18_cifar100_20e_2", "cnn", "carma resnet18_cifar100 bs64"),
    "ResNet-18 (batch size 128)": GavelType(858, "resnet18_cifar100_20e_3", "cnn", "carma resnet18_cifar100 bs128"),
    "ResNet-18 (batch size 256)": GavelType(982, "resnet18_cifar100_20e_3", "cnn", "bs128 + 2 x the bs64->bs128 step"),
    # ResNet-50 on ImageNet: the same workload as carma resnet/resnet2/resnet3.
    "ResNet-50 (batch size 16)": GavelType(2348, "resnet", "cnn", "bs32 - half the bs32->bs64 step"),
    "ResNet-50 (batch size 32)": GavelType(3934, "resnet", "cnn", "carma resnet50 bs32"),
    "ResNet-50 (batch size 64)": GavelType(7106, "resnet2", "cnn", "carma resnet50 bs64"),
    "ResNet-50 (batch size 128)": GavelType(13236, "resnet3", "cnn", "carma resnet50 bs128"),
    # Transformer (base, Multi30k): ~50M parameters -> ~0.8 GiB weights+grads+Adam, ~0.5 GiB
    # context, activations roughly linear in batch. Profile of the nearest profiled transformer.
    "Transformer (batch size 16)": GavelType(2000, "xlnet_base_cased_2", "transformer", "estimate"),
    "Transformer (batch size 32)": GavelType(2500, "xlnet_base_cased_2", "transformer", "estimate"),
    "Transformer (batch size 64)": GavelType(3500, "xlnet_base_cased_2", "transformer", "estimate"),
    "Transformer (batch size 128)": GavelType(5500, "xlnet_base_cased_2", "transformer", "estimate"),
    "Transformer (batch size 256)": GavelType(9500, "xlnet_base_cased_2", "transformer", "estimate"),
    # LM: 2-layer LSTM on WikiText-2 (~13M parameters, mostly embedding/decoder).
    "LM (batch size 5)": GavelType(1100, _LSTM_ESTIMATE, "rnn", "estimate"),
    "LM (batch size 10)": GavelType(1200, _LSTM_ESTIMATE, "rnn", "estimate"),
    "LM (batch size 20)": GavelType(1300, _LSTM_ESTIMATE, "rnn", "estimate"),
    "LM (batch size 40)": GavelType(1500, _LSTM_ESTIMATE, "rnn", "estimate"),
    "LM (batch size 80)": GavelType(1900, _LSTM_ESTIMATE, "rnn", "estimate"),
    # Recommendation: autoencoder on ML-20M (20k-item input rows, 4 B each, per sample);
    # utilization of the profiled recommender (dlrm: MLPs + embeddings, memory-bound, low SMACT).
    "Recommendation (batch size 512)": GavelType(1300, "dlrm", "mlp", "estimate"),
    "Recommendation (batch size 1024)": GavelType(1500, "dlrm", "mlp", "estimate"),
    "Recommendation (batch size 2048)": GavelType(1900, "dlrm", "mlp", "estimate"),
    "Recommendation (batch size 4096)": GavelType(2700, "dlrm", "mlp", "estimate"),
    "Recommendation (batch size 8192)": GavelType(4300, "dlrm", "mlp", "estimate"),
    # CycleGAN (batch 1, 256x256, two generators + two discriminators): an image-to-image CNN
    # like carma's UNet, whose profile it borrows.
    "CycleGAN": GavelType(4000, "UNet", "cnn", "estimate"),
    # A3C on Atari: a tiny conv policy net, GPU mostly idle, like carma's MNIST CNN.
    "A3C": GavelType(1776, "mnist_train", "cnn", "carma mnist_train (tiny CNN)"),
}

_FIELDS = 7


@cached_per_data_dir
def v100_throughputs() -> Mapping[tuple[str, int], float]:
    """Measured steps/s of each (job type, #GPUs) running alone on V100s."""
    path = data_file("interference", "gavel_physical_cluster_throughputs.json")
    table = json.loads(path.read_text())["v100"]
    return MappingProxyType({ast.literal_eval(key): entry["null"] for key, entry in table.items()})


def _v100_steps_per_s(measured: Mapping[tuple[str, int], float], job_type: str, gpus: int, where: str) -> float:
    if (job_type, gpus) in measured:
        return measured[(job_type, gpus)]
    smaller = [g for (t, g) in measured if t == job_type and g < gpus]
    if not smaller:
        raise TraceError(f"{where}: no V100 throughput for {job_type!r}")
    base = max(smaller)
    return measured[(job_type, base)] * gpus / base


def _batch_size(job_type: str) -> int | None:
    match = re.search(r"batch size (\d+)", job_type)
    return int(match.group(1)) if match else (1 if job_type == "CycleGAN" else None)


_BATCH_SIZES = {name: _batch_size(name) for name in GAVEL_TYPES}


def _trace_dir() -> Path:
    return data_file("traces", "gavel", "msr", "seed=0")


def gavel_traces() -> list[str]:
    """Names of the Gavel traces on disk (file stems)."""
    return sorted(p.stem for p in _trace_dir().glob("*.trace"))


@cached_per_data_dir
def _profiles() -> Mapping[str, UtilProfile]:
    workloads = carma_workloads()
    return MappingProxyType({name: t.util if isinstance(t.util, UtilProfile) else workloads[t.util].util
                             for name, t in GAVEL_TYPES.items()})


def _v100_to_a100() -> float:
    """Factor from a V100 run time to the A100-40GB reference time of ``TraceJob.duration_s``."""
    return gpu_type(_TRACE_GPU).relative_speed / gpu_type("A100-40GB").relative_speed


@cached_per_data_dir
def _jobs_of(name: str) -> tuple[TraceJob, ...]:
    path = _trace_dir() / f"{name}.trace"
    profiles, measured = _profiles(), v100_throughputs()
    v100_to_a100 = _v100_to_a100()
    jobs = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, start=1):
            where = f"{path}:{line_no}"
            fields = line.rstrip("\n").split("\t")
            if len(fields) != _FIELDS:
                raise TraceError(f"{where}: expected {_FIELDS} tab-separated fields, got {len(fields)}")
            job_type, _command, _steps_arg, _data_dir, steps, arrival, scale = fields
            kind = GAVEL_TYPES.get(job_type)
            if kind is None:
                raise TraceError(f"{where}: unknown job type {job_type!r}; known: {', '.join(GAVEL_TYPES)}")
            try:
                total_steps, arrival_s, gpus = int(steps), float(arrival), int(scale)
            except ValueError:
                raise TraceError(f"{where}: steps, arrival and scale factor must be numbers "
                                 f"(got {steps!r}, {arrival!r}, {scale!r})") from None
            if total_steps < 1 or gpus < 1 or arrival_s < 0:
                raise TraceError(f"{where}: steps and scale factor must be >= 1 and arrival >= 0")
            profile = profiles[job_type]
            jobs.append(TraceJob(
                job_id=f"{name}-{line_no - 1}",
                submit_s=arrival_s,
                workload=job_type,
                gpus=gpus,
                duration_s=total_steps / _v100_steps_per_s(measured, job_type, gpus, where) * v100_to_a100,
                peak_mib=kind.peak_mib,
                smact=profile.smact,
                smocc=profile.smocc,
                drama=profile.drama,
                gpus_per_node=gpus_per_node_for(gpus, NODE_GPUS),
                batch_size=_BATCH_SIZES[job_type],
                model_kind=kind.model_kind,
            ))
    return tuple(jobs)


def load_gavel(name: str) -> Trace:
    known = gavel_traces()
    if name not in known:
        raise TraceError(f"unknown gavel trace {name!r}; known: {', '.join(known)}")
    return Trace(
        name=f"gavel:{name}",
        jobs=list(_jobs_of(name)),
        cluster=GAVEL_CLUSTER,
        source=str(_trace_dir() / f"{name}.trace"),
        notes=[
            f"durations: steps / measured V100 throughput, as A100-40GB time (x{_v100_to_a100():.2f})",
            "memory/utilization: per job type from traces.gavel.GAVEL_TYPES (carma measurements or estimates)",
        ],
    )
