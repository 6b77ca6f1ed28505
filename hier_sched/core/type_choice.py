"""Which GPU type a job tries first on a cluster of several types (heterogeneity-aware placement).

The rule, Gavel's effective-throughput idea reduced to what the planner knows at no cost:

1. Only the types the job may run on (``gpu_types``) whose GPUs can hold its need *on that type*
   (``need_on``, plus the gate's margin) are tried; a gang's ranks are placed on one type.
2. Keep the big GPUs for the jobs only they can hold: a type is *protected* from a job that also
   fits a type with smaller GPUs when the other waiting jobs that fit only GPUs at least that big
   need more of them than would stay idle once this job took its GPUs. The job does not use a
   protected type this cycle: it runs on the smaller GPUs, or waits for them.
3. Otherwise the fastest type first (``GpuType.relative_speed``: the job finishes soonest there;
   the work to do is the same on every type, so speed alone ranks them); ties: the smaller GPU
   first, which keeps the bigger ones free.
4. Interference: when the first type's placement would share its GPUs with running jobs, a later
   unprotected type with enough idle GPUs is taken instead if its speed beats the first type's
   speed divided by the expected slowdown of sharing (``sharing_cost.shared_slowdowns``, the
   calibrated model).

Type-agnostic placement (``PlacementConfig.type_aware=False``, for comparisons) keeps rule 1 and
tries the types in the cluster's order. A cluster of one type never comes here (``queueing``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hier_sched.core.gpu import GpuState, SharingMode
from hier_sched.core.gpu_types import GPU_TYPES, allows
from hier_sched.core.sharing_cost import MPS_CALIBRATION, STREAMS_CALIBRATION, shared_slowdowns

__all__ = ["TypeChoice", "UNKNOWN_SMACT"]

# A job without a utilization estimate is taken to keep half of the SMs busy when it shares.
UNKNOWN_SMACT = 0.5


def _speed(gpu_type: str) -> float:
    kind = GPU_TYPES.get(gpu_type)
    return kind.relative_speed if kind is not None else 1.0


class TypeChoice:
    """One planning cycle's view of the cluster's GPU types: their memory, their idle GPUs, and
    the GPUs the waiting jobs that need big GPUs ask for (updated as the cycle places jobs)."""

    def __init__(self, types: Sequence[str], capacity: dict[str, float], idle: dict[str, int],
                 waiting: Iterable, margin_mib: float, type_aware: bool):
        self.types = list(types)
        self.capacity = capacity
        self.idle = dict(idle)
        self.margin_mib = margin_mib
        self.type_aware = type_aware
        # the smallest GPU each waiting job fits -> the GPUs those jobs ask for (protection)
        self._smallest_fit: dict[str, float] = {}
        self._demand: dict[float, int] = {}
        if type_aware:
            for job in waiting:
                fits = self.feasible(job)
                if fits:
                    smallest = min(capacity[t] for t in fits)
                    self._smallest_fit[job.job_id] = smallest
                    self._demand[smallest] = self._demand.get(smallest, 0) + job.gpus

    def feasible(self, job) -> list[str]:
        """The types the job may run on and whose GPUs can hold its need there (rule 1)."""
        out = []
        for t in self.types:
            if not allows(job.gpu_types, t):
                continue
            need = job.need_on(t)
            if need is None or need + self.margin_mib <= self.capacity[t]:
                out.append(t)
        return out

    def order(self, job) -> tuple[list[str], list[str]]:
        """The types to try, first first, and the types kept from the job this cycle (rules 1-3)."""
        fits = self.feasible(job)
        if not self.type_aware or len(fits) < 2:
            return fits, []
        smallest = min(self.capacity[t] for t in fits)
        kept = [t for t in fits if self._protected(job, t, smallest)]
        return sorted((t for t in fits if t not in kept), key=lambda t: (-_speed(t), self.capacity[t])), kept

    def _protected(self, job, gpu_type: str, smallest_fit: float) -> bool:
        cap = self.capacity[gpu_type]
        if smallest_fit >= cap:
            return False  # nothing smaller holds this job: these GPUs are its own to take
        own = job.gpus if self._smallest_fit.get(job.job_id, 0.0) >= cap else 0
        demand = sum(g for c, g in self._demand.items() if c >= cap) - own
        idle_big = sum(n for t, n in self.idle.items() if self.capacity[t] >= cap)
        return demand > 0 and idle_big - job.gpus < demand

    def better_idle_type(self, job, placed_on: str, shared: Sequence[GpuState], sharing: SharingMode,
                         later: Sequence[str]) -> str | None:
        """Rule 4: a later type (of ``order``'s, so not kept from the job) with enough idle GPUs
        where the job runs faster than sharing ``shared`` (the GPUs of its placement on
        ``placed_on``) would let it; None if none."""
        if not self.type_aware or not any(g.resident_jobs for g in shared):
            return None
        calibration = STREAMS_CALIBRATION if sharing is SharingMode.STREAMS else MPS_CALIBRATION
        smact = job.smact if job.smact is not None else UNKNOWN_SMACT
        slowdown = max(shared_slowdowns([g.risk.smact, smact], calibration)[-1] for g in shared)
        effective = _speed(placed_on) / slowdown
        for t in later:
            if self.idle.get(t, 0) >= job.gpus and _speed(t) > effective:
                return t
        return None

    def placed(self, job, gpu_type: str, idle_taken: int) -> None:
        """The cycle placed ``job`` on ``gpu_type``, taking ``idle_taken`` idle GPUs there."""
        self.idle[gpu_type] = self.idle.get(gpu_type, 0) - idle_taken
        smallest = self._smallest_fit.pop(job.job_id, None)
        if smallest is not None:
            self._demand[smallest] -= job.gpus
