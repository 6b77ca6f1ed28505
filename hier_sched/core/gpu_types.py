"""The one table of per-GPU-type constants.

Both the emulated GPU (``gpu_model``) and the memory estimators read these numbers, so a
scheduler decision and the device it is tested against never disagree about, say, how big a
CUDA context is.

Sources (see DATA_SOURCES.md): memory sizes are what ``nvidia-smi --query-gpu=memory.total``
reports. ``cuda_context_mib`` is the *default* process baseline: what a PyTorch training process
holds besides its allocator's segments (CUDA context, cuBLAS/cuDNN handles and their kernels), as
nvidia-smi counts it. It is a property of the node's software stack more than of the GPU: with
CUDA's lazy module loading (CUDA >= 11.7; on by default with current drivers and PyTorch) the
context holds the kernels a process uses, a few hundred MiB (pytorch#107667); with eager loading
every kernel of every library, over 1 GB (GPUMemNet's A100 set-up: ~1,414 MiB). The defaults are
the lazy-loading regime of current stacks -- on an A100 the ~500 MiB gap between a just-initialised
process and its first tensor, the regime of the thesis' own A100 server, whose CIFAR jobs peaked
at 590 MiB in all --; a node measures its own at start-up (``node_actor.baseline_probe``), finished
jobs teach it, and it can be configured (``estimators.baseline``), and the trace path's safe bound
counts the top of the public range (FIELD_NOTES §2: 300-1,500 MiB) until it is measured;
idle and busy power for the A100 are read from the recorded DCGM series
``shared/data/telemetry/dcgm-series/run_12f6a.json`` (idle 53 W before the run starts; busy
seconds 211-293 W from p10 to p99, max 296 W, so the cap is 300 W -- see
``gpu_physics.POWER_CALIBRATION``);
the other types use their vendor TDPs. MIG profiles are NVIDIA's published A100/H100 tables;
``mig_sms_per_slice`` is the SM count of one MIG compute slice (A100: 7 x 14 = 98 of 108 SMs
are usable under MIG; H100: 7 x 16 = 112 of 132).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["GpuType", "GPU_TYPES", "gpu_type", "MigProfile", "allows", "check_gpu_type_patterns"]


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # e.g. "1g.5gb"
    compute_slices: int  # g: sevenths of the SMs
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_mib: int  # what nvidia-smi reports as memory.total
    sm_count: int
    cuda_context_mib: int  # default process baseline: CUDA context + cuBLAS/cuDNN handles (see above)
    cublas_workspace_mib: int  # default CUBLAS_WORKSPACE_CONFIG workspace, allocated lazily
    allocator_block_bytes: int  # PyTorch caching allocator rounding (512 B)
    small_segment_mib: int  # small-pool segment size (2 MiB)
    large_segment_mib: int  # large-pool minimum segment (20 MiB)
    idle_power_w: float
    max_power_w: float
    relative_speed: float  # throughput relative to an A100-40GB (solo durations are A100 figures)
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_sms_per_slice: int = 0  # SMs of one MIG compute slice ("1g"); 0 without MIG


_A100_40_MIG = (
    MigProfile("1g.5gb", 1, 4864),
    MigProfile("2g.10gb", 2, 9984),
    MigProfile("3g.20gb", 3, 19968),
    MigProfile("4g.20gb", 4, 19968),
    MigProfile("7g.40gb", 7, 40192),
)
_A100_80_MIG = (
    MigProfile("1g.10gb", 1, 9728),
    MigProfile("2g.20gb", 2, 19968),
    MigProfile("3g.40gb", 3, 40192),
    MigProfile("4g.40gb", 4, 40192),
    MigProfile("7g.80gb", 7, 80384),
)

GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("A100-40GB", 40536, 108, 510, 8, 512, 2, 20, 53.0, 300.0, 1.0, _A100_40_MIG, 14),
        GpuType("A100-80GB", 81920, 108, 510, 8, 512, 2, 20, 55.0, 300.0, 1.05, _A100_80_MIG, 14),
        GpuType("H100-80GB", 81559, 132, 530, 32, 512, 2, 20, 70.0, 700.0, 2.0, _A100_80_MIG, 16),
        GpuType("V100-32GB", 32510, 80, 420, 8, 512, 2, 20, 40.0, 250.0, 0.55),
        GpuType("V100-16GB", 16160, 80, 420, 8, 512, 2, 20, 40.0, 250.0, 0.55),
        GpuType("T4", 15360, 40, 380, 8, 512, 2, 20, 10.0, 70.0, 0.25),
        GpuType("P100", 16280, 56, 360, 8, 512, 2, 20, 30.0, 250.0, 0.3),
        GpuType("K80", 11441, 13, 300, 8, 512, 2, 20, 25.0, 150.0, 0.12),
        GpuType("RTX-3090", 24576, 82, 450, 8, 512, 2, 20, 25.0, 350.0, 0.8),
        # A10 (Alibaba openb nodes): 24 GB GDDR6 (nvidia-smi: 23028 MiB), 72 SMs, 150 W TDP; ~0.4x an
        # A100 in training (62.5 vs 156 TF32 tensor TFLOPS, 600 vs 1555 GB/s).
        GpuType("A10", 23028, 72, 450, 8, 512, 2, 20, 15.0, 150.0, 0.4),
    )
}


def gpu_type(name: str) -> GpuType:
    """Look a GPU type up by name; the error lists the known ones."""
    try:
        return GPU_TYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_TYPES))}"
        ) from None


def allows(patterns: tuple[str, ...] | list[str], name: str) -> bool:
    """Whether a job restricted to ``patterns`` (globs over type names, ``"A100*"``; none: any) may
    run on a GPU of type ``name``."""
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def check_gpu_type_patterns(patterns: list[str]) -> list[str]:
    """A spec's ``gpu_types``: a non-empty list of patterns, each naming at least one known type
    (a typo would otherwise leave the job waiting for GPUs that do not exist)."""
    if not patterns:
        raise ValueError(f"give at least one GPU type pattern, or leave gpu_types out (any type); "
                         f"known: {', '.join(sorted(GPU_TYPES))}")
    for p in patterns:
        if not any(fnmatchcase(name, p) for name in GPU_TYPES):
            raise ValueError(f"{p!r} matches no known GPU type; known: {', '.join(sorted(GPU_TYPES))}")
    return patterns
