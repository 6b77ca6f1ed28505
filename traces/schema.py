"""One trace format for every source: a list of ``TraceJob`` plus an optional cluster hint."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = ["TraceJob", "ClusterHint", "Trace", "TraceError"]


class TraceError(ValueError):
    """A trace that cannot be loaded; the message names the file and line where it can."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. Memory is per GPU; ``duration_s`` is the solo run time on the
    trace's reference GPU (A100-40GB unless the trace says otherwise)."""

    job_id: str
    submit_s: float
    workload: str  # model/config name, e.g. "resnet50-bs64" or the thesis' rad file stem
    gpus: int
    duration_s: float
    peak_mib: float  # the truth the emulated GPU enforces (oracle value)
    smact: float = 0.5  # solo means of the utilization profile
    smocc: float = 0.25
    drama: float = 0.2
    gpus_per_node: int | None = None  # gang shape; None: all GPUs on one node
    batch_size: int | None = None
    model_kind: str | None = None  # "cnn" | "transformer" | "mlp" | ...
    # Estimates recorded with the trace (MiB per GPU); None where the estimator failed or
    # none was recorded. The thesis wrote 40000 for "failed"; loaders keep that value.
    horus_mib: float | None = None
    faketensor_mib: float | None = None
    gpumemnet_mib: float | None = None
    gpu_milli: int | None = None  # openb: requested share of one GPU in 1/1000
    user: str = "default"
    priority: int = 0
    exit_code: int = 0  # how the job's process ends (a trace may record failed jobs)

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node if self.gpus_per_node else 1


@dataclass(frozen=True, slots=True)
class ClusterHint:
    """The cluster a trace was recorded on (a replay may override it)."""

    nodes: int
    gpus_per_node: int
    gpu_type: str = "A100-40GB"
    # Heterogeneous clusters (openb): per-node (gpus, gpu_type); overrides the two fields above.
    node_list: tuple[tuple[int, str], ...] = ()

    @classmethod
    def packed(cls, gpus: int, node_gpus: int, gpu_type: str = "A100-40GB") -> "ClusterHint":
        """``gpus`` GPUs in whole nodes of ``node_gpus``, the rest on one smaller node (a cluster
        smaller than a node is one node)."""
        if gpus <= node_gpus:
            return cls(nodes=1, gpus_per_node=gpus, gpu_type=gpu_type)
        full, rest = divmod(gpus, node_gpus)
        if not rest:
            return cls(nodes=full, gpus_per_node=node_gpus, gpu_type=gpu_type)
        node_list = ((node_gpus, gpu_type),) * full + ((rest, gpu_type),)
        return cls(nodes=full + 1, gpus_per_node=node_gpus, gpu_type=gpu_type, node_list=node_list)


@dataclass(slots=True)
class Trace:
    name: str
    jobs: list[TraceJob]
    cluster: ClusterHint | None = None
    source: str = ""  # file(s) it came from, for the report
    notes: list[str] = field(default_factory=list)
    # The GPU type ``duration_s`` was measured on: a replay on other GPUs scales durations by
    # their relative speed. None: durations are wall-clock times on whatever GPU ran the job
    # (openb), taken as they are.
    duration_gpu: str | None = "A100-40GB"
    # A trace of several tenants (``traces.tenants``): each tenant's quota in GPUs; a job's tenant
    # is its ``user``. Empty: the trace says nothing of quotas.
    tenant_gpus: Mapping[str, int] = field(default_factory=dict)

    def with_jittered_arrivals(self, seconds: float, seed: int) -> "Trace":
        """The same jobs, each submitted up to ``seconds`` earlier or later (uniform, seeded; never
        before 0): replaying a few of these shows whether a result is robust or luck of timing."""
        if seconds < 0:
            raise TraceError(f"jitter must be >= 0 seconds (got {seconds})")
        rng = random.Random(seed)
        jobs = [replace(j, submit_s=max(0.0, j.submit_s + rng.uniform(-seconds, seconds))) for j in self.jobs]
        jobs.sort(key=lambda j: j.submit_s)
        return replace(self, name=f"{self.name} (arrivals +-{seconds:g} s, seed {seed})", jobs=jobs)
