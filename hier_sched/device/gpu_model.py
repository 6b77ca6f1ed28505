"""The emulated GPU: the calibrated "silicon" both the simulator and the live node actor drive.

Pure code (no clock, no Ray, no environment): the replay engine calls it on a virtual clock, the
live node keeps its ``to_state()`` dict in a file shared by real processes. Physics and every
calibration constant are in ``gpu_physics``; the address space is ``gpu_memory.MemoryLedger``.

API::

    gpu = EmulatedGpu("A100-40GB", index=0, uuid="GPU-0", sharing=SharingMode.MPS)
    gpu.attach(job_id, JobActivity(smact, smocc, drama), mem_limit_mib=None, pid=0)
        # process start: its CUDA context (GpuType.cuda_context_mib) becomes its first segment;
        # GpuOutOfMemory if even that does not fit, GpuBusy on an occupied MIG slice / NONE GPU
    gpu.allocate(job_id, mib)           # one contiguous segment (rounded up to 2 MiB pages)
    gpu.allocate_peak(job_id, peak_mib) # warm-up: segments up to the nvidia-smi peak (context incl.)
    gpu.detach(job_id) -> freed MiB     # process exit: its segments become holes
    gpu.residents -> (job_id, ...);  gpu.activity(job_id) -> JobActivity
    gpu.memory_total_mib / memory_used_mib / memory_free_mib / largest_free_block_mib
    gpu.job_memory_mib(job_id)          # what nvidia-smi lists for that process
    gpu.utilization() -> (smact, smocc, drama)   # device readings, saturating in [0, 1]
    gpu.slowdown(job_id) -> float >= 1  # factor on the job's solo duration from sharing only
    gpu.power_w() -> W;  gpu.sample(energy_j=...) -> GpuSample
    gpu.to_state() -> dict;  EmulatedGpu.from_state(d)   # msgpack-able, lossless
    mig_slices(gpu_type, ("3g.20gb", "2g.10gb", ...)) -> tuple of isolated slice devices

OOM semantics are a real GPU's: the *allocating* process gets ``GpuOutOfMemory`` (its message
contains "CUDA out of memory", like PyTorch's) and keeps what it already holds until the caller
detaches it (the process exits); neighbours keep all their memory. With ``mem_limit_mib`` (MPS
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) a process that would exceed its own limit fails itself even
if the device has room. ``slowdown`` covers sharing only: a simulator divides by
``gpu_type.relative_speed`` for the device generation (solo figures are A100 figures).

Speed: aggregate values (slowdowns, utilization, power) are computed once per change of the
resident set and cached, so the per-event queries of a large replay are dictionary lookups.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hier_sched.core.gpu import GpuSample, SharingMode
from hier_sched.core.gpu_types import GPU_TYPES, GpuType, MigProfile, gpu_type as lookup_gpu_type
from hier_sched.core.job_warmup import WARMUP_S
from hier_sched.device import gpu_physics
from hier_sched.device.gpu_memory import MemoryLedger

__all__ = ["GpuOutOfMemory", "GpuBusy", "JobActivity", "EmulatedGpu", "mig_slices", "LARGE_BLOCK_SHARE", "WARMUP_S",
           "warmup_s", "training_rate"]

_KIB_PER_MIB = 1024
_STATE_VERSION = 1
# allocate_peak: the share of a job's non-context memory reserved as one block first (weights,
# gradients and optimizer state are allocated early and live long); the rest comes in equal
# activation-sized pieces. Deterministic sizes make fragmentation reproducible.
LARGE_BLOCK_SHARE = 0.5


class GpuOutOfMemory(Exception):
    """An allocation of one process did not fit; only that process is affected."""

    def __init__(self, job_id: str, requested_mib: float, free_mib: float, largest_free_mib: float,
                 allocated_mib: float, limit_mib: float | None = None):
        self.job_id = job_id
        self.requested_mib = requested_mib
        self.free_mib = free_mib
        self.largest_free_mib = largest_free_mib
        self.allocated_mib = allocated_mib  # what the job held when the allocation failed
        self.limit_mib = limit_mib  # set when the job's own MPS memory limit refused it
        cause = (f"its limit of {limit_mib:.0f} MiB" if limit_mib is not None
                 else f"{free_mib:.0f} MiB free, largest free block {largest_free_mib:.0f} MiB")
        super().__init__(
            f"CUDA out of memory. Job {job_id!r} tried to allocate {requested_mib:.0f} MiB "
            f"holding {allocated_mib:.0f} MiB ({cause})"
        )

    @property
    def wanted_mib(self) -> float:
        """What the process tried to hold when it failed: the least its next run needs, and
        what a node reports as the observed peak of a crashed job."""
        return self.allocated_mib + self.requested_mib

    def __reduce__(self):  # keep the fields across pickling (Ray, multiprocessing)
        return (type(self), (self.job_id, self.requested_mib, self.free_mib, self.largest_free_mib,
                             self.allocated_mib, self.limit_mib))


class GpuBusy(RuntimeError):
    """A second process on a device that runs one at a time (a MIG slice, or sharing NONE)."""


@dataclass(frozen=True, slots=True)
class JobActivity:
    """A job's solo DCGM utilization profile on a whole GPU (fractions of time, 0..1)."""

    smact: float
    smocc: float = 0.0
    drama: float = 0.0

    def __post_init__(self) -> None:
        for name in ("smact", "smocc", "drama"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"JobActivity.{name} must be a fraction in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class _Resident:
    activity: JobActivity
    limit_kib: int | None
    pid: int


def _to_kib(mib: float, what: str) -> int:
    if not (isinstance(mib, (int, float)) and math.isfinite(mib) and mib > 0):
        raise ValueError(f"{what} must be a positive number of MiB, got {mib!r}")
    return math.ceil(mib * _KIB_PER_MIB - 1e-6)


class EmulatedGpu:
    """One emulated device (a whole GPU or one MIG slice): memory ledger plus physics."""

    __slots__ = ("gpu_type", "index", "uuid", "sharing", "mig_profile", "_mig", "compute_share",
                 "bandwidth_share", "_ledger", "_residents", "_page_kib", "_slowdowns", "_utilization",
                 "_power")

    def __init__(self, gpu_type: str | GpuType = "A100-40GB", *, index: int = 0, uuid: str = "",
                 sharing: SharingMode | str | None = None, mig_profile: str | None = None):
        self.gpu_type = lookup_gpu_type(gpu_type) if isinstance(gpu_type, str) else gpu_type
        self.index = index
        self.uuid = uuid or f"GPU-emulated-{index}"
        self.sharing = SharingMode(sharing) if sharing is not None else (
            SharingMode.MIG if mig_profile else SharingMode.MPS)
        if (self.sharing is SharingMode.MIG) != (mig_profile is not None):
            raise ValueError("a MIG slice needs both sharing=MIG and a mig_profile (use mig_slices())")
        self.mig_profile = mig_profile
        self._mig = _find_profile(self.gpu_type, mig_profile) if mig_profile else None
        if self._mig is None:
            memory_mib, self.compute_share, self.bandwidth_share = self.gpu_type.memory_mib, 1.0, 1.0
        else:
            memory_mib = self._mig.memory_mib
            self.compute_share = self._mig.compute_slices * self.gpu_type.mig_sms_per_slice / self.gpu_type.sm_count
            self.bandwidth_share = self._mig.memory_mib / max(p.memory_mib for p in self.gpu_type.mig_profiles)
        self._ledger = MemoryLedger(memory_mib * _KIB_PER_MIB)
        self._residents: dict[str, _Resident] = {}
        self._page_kib = self.gpu_type.small_segment_mib * _KIB_PER_MIB
        self._invalidate()

    # ----------------------------------------------------------------- processes and memory
    @property
    def residents(self) -> tuple[str, ...]:
        return tuple(self._residents)

    def activity(self, job_id: str) -> JobActivity:
        return self._resident(job_id).activity

    def attach(self, job_id: str, activity: JobActivity, *, mem_limit_mib: float | None = None,
               pid: int = 0) -> None:
        """A process starts on this device: it gets its CUDA context or fails with OOM."""
        if job_id in self._residents:
            raise ValueError(f"job {job_id!r} is already attached to GPU {self.uuid}")
        if not isinstance(activity, JobActivity):
            raise TypeError(f"activity of job {job_id!r} must be a JobActivity, got {type(activity).__name__}")
        if self._residents and self.sharing in (SharingMode.MIG, SharingMode.NONE):
            raise GpuBusy(f"GPU {self.uuid} ({self.sharing.value}) already runs {next(iter(self._residents))!r}")
        limit_kib = _to_kib(mem_limit_mib, "mem_limit_mib") if mem_limit_mib is not None else None
        context_kib = self.gpu_type.cuda_context_mib * _KIB_PER_MIB
        if limit_kib is not None and context_kib > limit_kib:
            raise self._oom(job_id, context_kib, held_kib=0, limit_kib=limit_kib)
        if self._ledger.reserve(job_id, context_kib) is None:
            raise self._oom(job_id, context_kib, held_kib=0)
        self._residents[job_id] = _Resident(activity, limit_kib, pid)
        self._invalidate()

    def allocate(self, job_id: str, mib: float) -> None:
        """Reserve one contiguous segment for the job, rounded up to whole 2 MiB pages."""
        self._reserve(job_id, self._pages(_to_kib(mib, "allocation")))

    def allocate_peak(self, job_id: str, peak_mib: float, *, chunks: int = 4) -> None:
        """Grow the job to its nvidia-smi peak (context included): one large block of
        ``LARGE_BLOCK_SHARE`` of the rest, then ``chunks`` equal pieces (the last rounds up)."""
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        self._resident(job_id)
        missing_kib = _to_kib(peak_mib, "peak_mib") - self._ledger.owned_kib(job_id)
        if missing_kib <= 0:
            return
        large = self._pages(math.floor(missing_kib * LARGE_BLOCK_SHARE))
        piece = (missing_kib - large) // chunks // self._page_kib * self._page_kib
        sizes = [large] + [piece] * (chunks - 1)
        sizes.append(self._pages(missing_kib - sum(sizes)))
        for size in sizes:
            if size > 0:
                self._reserve(job_id, size)

    def detach(self, job_id: str) -> float:
        """The process exits: all its segments are freed (MiB freed; 0 for an unknown job)."""
        if self._residents.pop(job_id, None) is None:
            return 0.0
        freed = self._ledger.release_owner(job_id) / _KIB_PER_MIB
        self._invalidate()
        return freed

    def job_memory_mib(self, job_id: str) -> float:
        return self._ledger.owned_kib(job_id) / _KIB_PER_MIB

    @property
    def memory_total_mib(self) -> float:
        return self._ledger.total_kib / _KIB_PER_MIB

    @property
    def memory_used_mib(self) -> float:
        return self._ledger.used_kib / _KIB_PER_MIB

    @property
    def memory_free_mib(self) -> float:
        return self._ledger.free_kib / _KIB_PER_MIB

    @property
    def largest_free_block_mib(self) -> float:
        return self._ledger.largest_free_kib / _KIB_PER_MIB

    # ----------------------------------------------------------------- physics (cached)
    def slowdown(self, job_id: str) -> float:
        """Factor (>= 1) on the job's solo time given the current residents and sharing mode."""
        if self._slowdowns is None:
            self._slowdowns = self._compute_slowdowns()
        try:
            return self._slowdowns[job_id]
        except KeyError:
            raise ValueError(f"job {job_id!r} is not attached to GPU {self.uuid}") from None

    def utilization(self) -> tuple[float, float, float]:
        """Device SMACT, SMOCC, DRAMA (of the slice, for a MIG slice), saturating in [0, 1]."""
        if self._utilization is None:
            self._utilization = self._compute_utilization()
        return self._utilization

    def power_w(self) -> float:
        if self._power is None:
            self._power = self._compute_power()
        return self._power

    def sample(self, *, energy_j: float = 0.0) -> GpuSample:
        """One reading as NVML/DCGM would give it (``energy_j``: the caller's integrated counter)."""
        smact, smocc, drama = self.utilization()
        return GpuSample(
            index=self.index, uuid=self.uuid, memory_total_mib=self.memory_total_mib,
            memory_used_mib=self.memory_used_mib, smact=smact, smocc=smocc, drama=drama,
            power_w=self.power_w(), energy_j=energy_j,
            processes=tuple((r.pid, self.job_memory_mib(j)) for j, r in self._residents.items()),
        )

    # ----------------------------------------------------------------- persistence
    def to_state(self) -> dict:
        """A plain, msgpack-able dict from which ``from_state`` rebuilds this device exactly."""
        registered = GPU_TYPES.get(self.gpu_type.name)
        return {
            "version": _STATE_VERSION,
            "gpu_type": self.gpu_type.name if registered == self.gpu_type else asdict(self.gpu_type),
            "index": self.index,
            "uuid": self.uuid,
            "sharing": self.sharing.value,
            "mig_profile": self.mig_profile,
            "residents": [[job, r.activity.smact, r.activity.smocc, r.activity.drama, r.limit_kib, r.pid]
                          for job, r in self._residents.items()],
            "segments": [list(segment) for segment in self._ledger.segments()],
        }

    @classmethod
    def from_state(cls, state: dict) -> EmulatedGpu:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported emulated-GPU state version {state.get('version')!r} (want {_STATE_VERSION})")
        kind = state["gpu_type"]
        if isinstance(kind, dict):
            kind = GpuType(**{**kind, "mig_profiles": tuple(MigProfile(**p) for p in kind["mig_profiles"])})
        gpu = cls(kind, index=state["index"], uuid=state["uuid"], sharing=state["sharing"],
                  mig_profile=state["mig_profile"])
        for job, smact, smocc, drama, limit_kib, pid in state["residents"]:
            gpu._residents[job] = _Resident(JobActivity(smact, smocc, drama), limit_kib, pid)
        segments = [(owner, start, size) for owner, start, size in state["segments"]]
        strays = {owner for owner, _, _ in segments} - set(gpu._residents)
        if strays:
            raise ValueError(f"emulated-GPU state has memory of jobs that are not resident: {sorted(strays)}")
        gpu._ledger = MemoryLedger.from_segments(gpu._ledger.total_kib, segments)
        return gpu

    def __repr__(self) -> str:
        slice_ = f" {self.mig_profile}" if self.mig_profile else ""
        return (f"EmulatedGpu({self.gpu_type.name}{slice_} #{self.index}, {self.sharing.value}, "
                f"{self.memory_used_mib:.0f}/{self.memory_total_mib:.0f} MiB, residents={list(self._residents)})")

    # ----------------------------------------------------------------- internals
    def _resident(self, job_id: str) -> _Resident:
        try:
            return self._residents[job_id]
        except KeyError:
            raise ValueError(f"job {job_id!r} is not attached to GPU {self.uuid}") from None

    def _pages(self, kib: int) -> int:
        return -(-kib // self._page_kib) * self._page_kib

    def _reserve(self, job_id: str, size_kib: int) -> None:
        resident = self._resident(job_id)
        held = self._ledger.owned_kib(job_id)
        if resident.limit_kib is not None and held + size_kib > resident.limit_kib:
            raise self._oom(job_id, size_kib, held, limit_kib=resident.limit_kib)
        if self._ledger.reserve(job_id, size_kib) is None:
            raise self._oom(job_id, size_kib, held)
        # memory does not change slowdowns or utilization: no cache to invalidate

    def _oom(self, job_id: str, size_kib: int, held_kib: int, limit_kib: int | None = None) -> GpuOutOfMemory:
        return GpuOutOfMemory(
            job_id, size_kib / _KIB_PER_MIB, self.memory_free_mib, self.largest_free_block_mib,
            held_kib / _KIB_PER_MIB, None if limit_kib is None else limit_kib / _KIB_PER_MIB,
        )

    def _invalidate(self) -> None:
        self._slowdowns: dict[str, float] | None = None
        self._utilization: tuple[float, float, float] | None = None
        self._power: float | None = None

    def _compute_slowdowns(self) -> dict[str, float]:
        jobs = list(self._residents)
        if self._mig is not None:
            return {job: gpu_physics.slice_slowdown(r.activity.smact, self.compute_share)
                    for job, r in self._residents.items()}
        if self.sharing is SharingMode.NONE:
            return dict.fromkeys(jobs, 1.0)
        calibration = (gpu_physics.MPS_CALIBRATION if self.sharing is SharingMode.MPS
                       else gpu_physics.STREAMS_CALIBRATION)
        factors = gpu_physics.shared_slowdowns([self._residents[j].activity.smact for j in jobs], calibration)
        return dict(zip(jobs, factors))

    def _compute_utilization(self) -> tuple[float, float, float]:
        activities = [r.activity for r in self._residents.values()]
        if self._mig is None:
            union = gpu_physics.overlap_union
            return (union([a.smact for a in activities]), union([a.smocc for a in activities]),
                    union([a.drama for a in activities]))
        if not activities:
            return (0.0, 0.0, 0.0)
        # a slice reads its own counters: the job's work, stretched by its slowdown, over the slice
        job = activities[0]
        stretch = gpu_physics.slice_slowdown(job.smact, self.compute_share)
        return (min(1.0, job.smact / (self.compute_share * stretch)),
                min(1.0, job.smocc / (self.compute_share * stretch)),
                min(1.0, job.drama / (self.bandwidth_share * stretch)))

    def _compute_power(self) -> float:
        kind = self.gpu_type
        smact = self.utilization()[0]
        if self._mig is None:
            return gpu_physics.power_w(kind.idle_power_w, kind.max_power_w, smact,
                                       has_processes=bool(self._residents))
        # a slice draws its compute share of the board: sum over a full layout = one GPU
        share = self._mig.compute_slices / 7
        return gpu_physics.power_w(kind.idle_power_w * share, kind.max_power_w * share,
                                   smact * self.compute_share / share, has_processes=bool(self._residents))


def _find_profile(kind: GpuType, name: str) -> MigProfile:
    if not kind.mig_profiles or not kind.mig_sms_per_slice:
        raise ValueError(f"GPU type {kind.name} does not support MIG")
    for profile in kind.mig_profiles:
        if profile.name == name:
            return profile
    known = ", ".join(p.name for p in kind.mig_profiles)
    raise ValueError(f"GPU type {kind.name} has no MIG profile {name!r}; known: {known}")


def mig_slices(gpu_type: str | GpuType, profiles: tuple[str, ...] | list[str], *, index: int = 0,
               uuid: str = "") -> tuple[EmulatedGpu, ...]:
    """Split one GPU into isolated MIG slices (one job each), checking the layout fits the GPU:
    at most 7 compute slices and the full GPU's MIG memory in total."""
    kind = lookup_gpu_type(gpu_type) if isinstance(gpu_type, str) else gpu_type
    if not profiles:
        raise ValueError("a MIG layout needs at least one profile")
    chosen = [_find_profile(kind, name) for name in profiles]
    compute = sum(p.compute_slices for p in chosen)
    memory = sum(p.memory_mib for p in chosen)
    full_memory = max(p.memory_mib for p in kind.mig_profiles)
    if compute > 7 or memory > full_memory:
        raise ValueError(f"MIG layout {list(profiles)} needs {compute}/7 compute slices and "
                         f"{memory}/{full_memory} MiB; it does not fit one {kind.name}")
    base = uuid or f"GPU-emulated-{index}"
    return tuple(EmulatedGpu(kind, index=index, uuid=f"MIG-{base}/{position}", sharing=SharingMode.MIG,
                             mig_profile=p.name) for position, p in enumerate(chosen))


# A job reaches its peak allocation after its warm-up (``WARMUP_S`` by default), at most half of a
# short job.
_WARMUP_CAP_FRACTION = 0.5


def warmup_s(duration_s: float | None, warmup: float = WARMUP_S) -> float:
    """Seconds from launch to the job's peak allocation (simulator and emulated job alike)."""
    return min(warmup, _WARMUP_CAP_FRACTION * duration_s) if duration_s else warmup


def training_rate(gpus: "list[EmulatedGpu]", job_id: str, reference_speed: float | None) -> float:
    """Solo-seconds of work per second for a job on ``gpus``: the slowest GPU's generation
    relative to the one its duration was measured on (``reference_speed``; None: durations are
    in this cluster's own speed), divided by the worst collocation slowdown among its GPUs (a
    synchronous job runs at the pace of its slowest GPU)."""
    speed = 1.0 if reference_speed is None else min(g.gpu_type.relative_speed for g in gpus) / reference_speed
    return speed / max(g.slowdown(job_id) for g in gpus)

