"""What the scheduler knows about a GPU: raw device readings and the placement snapshot.

``GpuSample`` is one reading of one device, as any backend (emulated, NVML, DCGM) produces it.
``GpuState`` is what placement decides on: memory, the monitoring window's risk scores,
who is resident and when the GPU last received a job. Both are plain values: no clock, no Ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from hier_sched.core.frozen_values import fast_builder
from hier_sched.core.wire import pickled_by_fields

__all__ = ["SharingMode", "GpuSample", "Risk", "GpuState", "Placement", "gpu_state", "unused_reservation_mib"]


class SharingMode(str, Enum):
    """How collocated processes share a GPU."""

    MPS = "mps"  # NVIDIA Multi-Process Service: concurrent kernels, the thesis' winner
    STREAMS = "streams"  # plain time-slicing between CUDA contexts
    MIG = "mig"  # isolated slices; one job per slice
    NONE = "none"  # no sharing: every job gets whole GPUs


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one device (a backend's output, before any windowing)."""

    index: int
    uuid: str
    memory_total_mib: float
    memory_used_mib: float
    smact: float = 0.0  # DCGM 1002, fraction of time an SM had a warp resident
    smocc: float = 0.0  # DCGM 1003, warps resident / max warps
    drama: float = 0.0  # DCGM 1005, fraction of cycles the DRAM interface was busy
    power_w: float = 0.0
    energy_j: float = 0.0  # cumulative counter since the device booted
    processes: tuple[tuple[int, float], ...] = ()  # (pid, used MiB)

    @property
    def memory_free_mib(self) -> float:
        return max(0.0, self.memory_total_mib - self.memory_used_mib)


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class Risk:
    """Risk scores of the monitoring window (see ``monitoring.risk_score``)."""

    smact: float = 0.0
    smocc: float = 0.0
    drama: float = 0.0


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class GpuState:
    """The snapshot placement works on; one per GPU (or per MIG slice)."""

    node: str
    index: int
    memory_total_mib: float
    memory_used_mib: float
    gpu_type: str = "A100-40GB"
    uuid: str = ""
    risk: Risk = field(default_factory=Risk)
    power_w: float = 0.0
    resident_jobs: tuple[str, ...] = ()
    # Residents that train on several GPUs at once: a synchronous job runs at the pace of its
    # slowest GPU, so slowing one of its GPUs slows all of them.
    multi_gpu_jobs: int = 0
    sharing: SharingMode = SharingMode.MPS
    mig_profile: str | None = None  # set when this state is one MIG slice
    last_launch_s: float | None = None  # when a job was last started here (post-launch grace)
    # Memory reserved for the resident jobs that they do not hold (yet): ``unused_reservation_mib``.
    # Placement subtracts it from free.
    pending_mib: float = 0.0
    # The attempt of each resident run, in the order of ``resident_jobs`` (0 or missing: not
    # known). A job's next attempt is a different run: a late snapshot that still shows the
    # attempt before it must not pass for it (``ClusterIndex.shows``).
    resident_attempts: tuple[int, ...] = ()

    @property
    def memory_free_mib(self) -> float:
        return max(0.0, self.memory_total_mib - self.memory_used_mib - self.pending_mib)

    @property
    def idle(self) -> bool:
        return not self.resident_jobs

    def with_job(self, job_id: str, reserved_mib: float, now_s: float, attempt: int = 0) -> "GpuState":
        """The state after placing ``job_id`` (its run ``attempt``, 0: not known) here (used while
        planning several jobs per cycle)."""
        return gpu_state(
            self.node, self.index, self.memory_total_mib, self.memory_used_mib, self.gpu_type, self.uuid,
            self.risk, self.power_w, self.resident_jobs + (job_id,), self.multi_gpu_jobs, self.sharing,
            self.mig_profile, now_s, self.pending_mib + reserved_mib, self._attempts() + (attempt,),
        )

    def _attempts(self) -> tuple[int, ...]:
        """``resident_attempts``, as long as ``resident_jobs`` (0 where not known)."""
        known = self.resident_attempts
        return known + (0,) * (len(self.resident_jobs) - len(known))

    def runs(self) -> tuple[tuple[str, int], ...]:
        """The resident runs: (job id, attempt), attempt 0 where not known."""
        return tuple(zip(self.resident_jobs, self._attempts()))

    def shows_run(self, job_id: str, attempt: int) -> bool:
        return run_shown(self.runs(), job_id, attempt)


gpu_state = fast_builder(GpuState)  # ``GpuState(...)``, ~4x faster: a replay builds millions


def run_shown(runs: Iterable[tuple[str, int]], job_id: str, attempt: int) -> bool:
    """Whether ``runs`` (job id, attempt; 0: not known) show run ``attempt`` of ``job_id``. A late
    snapshot may still show the attempt before: that run is not this one, and its memory is not
    this one's reservation."""
    return any(job == job_id and shown in (attempt, 0) for job, shown in runs)


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job goes: a node and one or more GPU indices on it (gangs: one per node)."""

    job_id: str
    node: str
    gpus: tuple[int, ...]
    reserved_mib: float  # per GPU: estimate + margin (what the memory gate checked)
    exclusive: bool = False
    policy: str = ""
    reason: str = ""


def unused_reservation_mib(reservations: Iterable[tuple[float, float]]) -> float:
    """What a GPU has reserved for its resident jobs and they do not hold now: per job, given as
    (reserved MiB, MiB it holds on this GPU), its reservation less what it holds, never below 0.

    Placement counts this as used, so a resident job occupies ``max(reserved, held)`` for its
    whole run: a job that has not reached its peak yet (its process is still starting, it loads
    data, it is between phases) keeps the room it was promised, and the reservations on a GPU
    never add up beyond what it holds (RELIABILITY.md, "Never overcommit"). The one rule for
    ``GpuState.pending_mib``, in the node's monitor and in the simulator alike."""
    return sum(max(0.0, reserved - held) for reserved, held in reservations)
