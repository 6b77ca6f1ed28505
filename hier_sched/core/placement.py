"""Placement on one node: gates, then a score, then k GPUs — or "wait" with the reasons.

Every policy of the thesis (FIELD_NOTES §1) is one ``Policy`` value: which gates apply and how
GPUs are ranked. MAGM and best-fit are the same free-memory score in opposite directions; LUG
ranks by the SMACT risk; first-fit by index; round-robin by distance from a cursor the caller
keeps. ``exclusive`` only ever takes idle GPUs. With ``exclusive_first`` (the thesis' default)
every policy takes idle GPUs before it collocates.

The functions are pure: time arrives as ``now_s``, the round-robin cursor as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hier_sched.core.gpu import GpuState, Risk, SharingMode
from hier_sched.core.policies import Policy, policy
from hier_sched.core.units import gib

__all__ = [
    "verify_placement",
    "UtilGate",
    "PlacementConfig",
    "PlacementRequest",
    "Verdict",
    "NodeRoom",
    "node_room",
    "place_on_node",
    "assess_node",
    "memory_requirement",
    "estimate_requirement",
]


@dataclass(frozen=True, slots=True)
class UtilGate:
    """Blocks a GPU when ``SMACT >= smact and (SMOCC >= smocc or DRAMA >= drama)``.

    Thesis thresholds 0.80 / 0.45 / 0.40; AEGIS (2026) found 0.50 / 0.20 / 0.40 better."""

    smact: float = 0.80
    smocc: float = 0.45
    drama: float = 0.40

    def blocks(self, risk: Risk) -> bool:
        return risk.smact >= self.smact and (risk.smocc >= self.smocc or risk.drama >= self.drama)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    policy: str = "magm"
    util_gate: UtilGate = field(default_factory=UtilGate)
    margin_mib: float = 2048.0  # added to an estimate (fragmentation, allocator growth)
    no_estimate_mib: float = 5120.0  # required free memory when a job has no estimate
    free_reserve_mib: float = 512.0  # decisions use memory.free - 512 MiB
    launch_grace_s: float = 30.0  # a GPU that just got a job is not offered again for this long
    exclusive_first: bool = True
    max_jobs_per_gpu: int = 8
    # Optional utilization-estimate gate: the GPU's SMACT risk plus the job's estimated solo
    # SMACT must not exceed this (None: off). Demands add up until the SMs are saturated; past
    # 1.0 every resident slows down, so a budget near 1 collocates only what fits alongside.
    # Only used when the job carries a utilization estimate.
    smact_budget: float | None = None
    # Rank GPUs that host a multi-GPU (synchronous) job after all others: slowing one of its
    # GPUs slows the whole job, so collocating there costs more than it seems.
    spare_multi_gpu_jobs: bool = False
    # Give each collocated job an MPS pinned-memory limit of what the gate asked for, so a job
    # that outgrows its estimate fails itself instead of a neighbour (the thesis ran without).
    mps_memory_limit: bool = True
    # On a cluster of several GPU types: the fastest type first, big GPUs kept for the jobs only
    # they hold (``type_choice``); False: types tried in cluster order (type-agnostic, to compare).
    type_aware: bool = True

    # The registered ``Policy`` of ``policy`` (resolved once: aliases too, and an unknown name fails here).
    rules: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rules = policy(self.policy)
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "policy", rules.name)
        for name in ("margin_mib", "no_estimate_mib", "free_reserve_mib", "launch_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (got {getattr(self, name)})")


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What one job asks of one node."""

    job_id: str
    gpus: int = 1
    need_mib: float | None = None  # memory estimate per GPU; None: no estimate
    smact: float | None = None  # utilization estimate (solo SMACT), if any
    exclusive: bool = False  # idle GPUs only (exclusive policy, last recovery step)
    # Recovery: the free memory a GPU must show, replacing estimate + margin.
    min_free_mib: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    gpus: tuple[int, ...] = ()
    reserved_mib: float = 0.0
    exclusive: bool = False
    reasons: tuple[str, ...] = ()
    next_rr_cursor: int = 0

    @property
    def placed(self) -> bool:
        return bool(self.gpus)


def memory_requirement(req: PlacementRequest, cfg: PlacementConfig) -> tuple[float, float]:
    """(free memory a GPU must show, memory to reserve for the job) per GPU."""
    if req.min_free_mib is not None:
        reserve = req.need_mib if req.need_mib is not None else req.min_free_mib
        return req.min_free_mib, reserve
    return estimate_requirement(req.need_mib, cfg)


def estimate_requirement(need_mib: float | None, cfg: PlacementConfig) -> tuple[float, float]:
    """``memory_requirement`` of a job on its estimate (no recovery step): ``need_mib`` per GPU,
    or None without an estimate."""
    if need_mib is None:
        return cfg.no_estimate_mib, cfg.no_estimate_mib
    return need_mib + cfg.margin_mib, need_mib


def _usable_free(gpu: GpuState, cfg: PlacementConfig) -> float:
    return gpu.memory_free_mib - cfg.free_reserve_mib


def place_on_node(
    req: PlacementRequest,
    gpus: Sequence[GpuState],
    cfg: PlacementConfig,
    now_s: float,
    rr_cursor: int = 0,
    *,
    explain: bool = True,
) -> Verdict:
    """Choose ``req.gpus`` GPUs of one node for a job, or explain why it must wait.

    ``explain=False`` leaves a refusal's reasons empty: a planner trying many nodes for one job
    asks for the words only of the node it reports (formatting them is most of a refusal's cost)."""
    return assess_node(req, gpus, cfg, now_s, rr_cursor, explain=explain)[0]


def assess_node(
    req: PlacementRequest,
    gpus: Sequence[GpuState],
    cfg: PlacementConfig,
    now_s: float,
    rr_cursor: int = 0,
    *,
    explain: bool = False,
) -> tuple[Verdict, NodeRoom | None]:
    """``place_on_node``, and with a refusal the node's room (``node_room``) from the same pass
    over its GPUs: a planner learns why the node refuses one job and what it could give any other."""
    pol = cfg.rules
    fresh, launched = _grace_split(gpus, cfg, now_s)
    in_grace = len(launched)
    grace_note = (f"{in_grace} GPU(s) in post-launch grace",) if in_grace and explain else ()
    need_free, reserve = memory_requirement(req, cfg)

    idle = [g for g in fresh if not g.resident_jobs]  # (``GpuState.idle``, inlined: a cycle assesses dozens of nodes)
    if len(idle) >= req.gpus and (req.exclusive or not pol.collocates or cfg.exclusive_first):
        chosen = idle[: req.gpus]
        # alone on its GPUs, a job reserves at most the GPUs (a recovery's need may exceed them)
        reserve = min(reserve, min(g.memory_total_mib for g in chosen))
        return Verdict(tuple(g.index for g in chosen), reserve, True, ("idle GPUs",), rr_cursor), None
    if req.exclusive or not pol.collocates:
        verdict = Verdict(reasons=(f"needs {req.gpus} idle GPU(s), {len(idle)} free",) + grace_note,
                          next_rr_cursor=rr_cursor) if explain else _refused(rr_cursor)
        return verdict, _room(fresh, launched, len(idle), cfg, pol, now_s)

    passing: list[GpuState] = []
    rejected: list[str] = []
    open_free: list[float] = []
    memory_gated = pol.memory_gate or req.min_free_mib is not None
    budget = cfg.smact_budget if req.smact is not None else None
    for g in fresh:
        gate = _closed(g, cfg, pol)
        if gate is None:
            free = g.memory_free_mib - cfg.free_reserve_mib  # ``_usable_free``
            open_free.append(free)
            if memory_gated and free < need_free:
                gate = "memory"
            elif budget is not None and g.resident_jobs and g.risk.smact + req.smact > budget:
                gate = "budget"
            else:
                passing.append(g)
                continue
        if explain:
            rejected.append(_refusal(gate, g, cfg, need_free))
    if len(passing) < req.gpus:
        verdict = Verdict(reasons=(f"{len(passing)}/{req.gpus} GPU(s) pass the gates",) + tuple(rejected) + grace_note,
                          next_rr_cursor=rr_cursor) if explain else _refused(rr_cursor)
        open_free.sort(reverse=True)
        return verdict, NodeRoom(len(idle), tuple(open_free), now_s, min(launched, default=math.inf))

    chosen, cursor = _rank(pol, passing, req.gpus, cfg, rr_cursor, len(gpus))
    return Verdict(tuple(chosen), reserve, False, (f"{pol.name}: collocated",), cursor), None


_REFUSALS: dict[int, Verdict] = {}


def _refused(rr_cursor: int) -> Verdict:
    """A refusal without words (one shared value per cursor: a planning cycle makes dozens)."""
    verdict = _REFUSALS.get(rr_cursor)
    if verdict is None:
        verdict = _REFUSALS[rr_cursor] = Verdict(next_rr_cursor=rr_cursor)
    return verdict


def verify_placement(req: PlacementRequest, gpus: Sequence[GpuState], chosen: Sequence[int], cfg: PlacementConfig,
                     now_s: float) -> str | None:
    """Does the planned choice still pass the gates on a fresh snapshot? None when it does, else
    why not. The node runs this before it launches what the global queue planned on an older
    snapshot: the same gates, on exactly the chosen GPUs."""
    wanted = set(chosen)
    verdict = place_on_node(req, [g for g in gpus if g.index in wanted], cfg, now_s)
    if verdict.placed and set(verdict.gpus) == wanted:
        return None
    return "; ".join(verdict.reasons) or "the planned GPUs no longer fit"


def _grace_split(gpus: Sequence[GpuState], cfg: PlacementConfig, now_s: float) -> tuple[list[GpuState], list[float]]:
    """(the GPUs out of their post-launch grace, the launch times of those in it): a GPU that
    just got a job is not offered again until its allocations show."""
    fresh: list[GpuState] = []
    launched: list[float] = []
    for g in gpus:
        t = g.last_launch_s
        if t is not None and now_s - t < cfg.launch_grace_s:
            launched.append(t)
        else:
            fresh.append(g)
    return fresh, launched


def _closed(g: GpuState, cfg: PlacementConfig, pol: Policy) -> str | None:
    """The gate that keeps every new job off GPU ``g``, whatever it asks; None when it is open."""
    residents = g.resident_jobs
    if not residents:  # idle: the sharing and utilization gates pass it
        return "jobs" if cfg.max_jobs_per_gpu <= 0 else None
    if g.sharing in _NOT_SHARED:
        return "sharing"
    if len(residents) >= cfg.max_jobs_per_gpu:
        return "jobs"
    if pol.util_gate and cfg.util_gate.blocks(g.risk):
        return "utilization"
    return None


_NOT_SHARED = (SharingMode.MIG, SharingMode.NONE)


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """The most any job could get on one node now, whatever it asks: ``place_on_node`` places a
    job of k GPUs only if ``idle >= k`` or k GPUs are open with the free memory the gate asks
    (``open_free[k - 1]``). A planner trying many jobs on the same snapshots skips, with this
    bound, the nodes that must refuse and asks ``place_on_node`` about the rest."""

    idle: int  # idle GPUs out of their post-launch grace
    open_free: tuple[float, ...]  # usable free MiB of the GPUs out of grace that no gate closes, largest first
    at_s: float = 0.0  # when it was measured
    # The earliest launch time of the GPUs left out for their post-launch grace (inf: none), the
    # first of them to leave it: a planner asks every cycle whether dozens of rooms still hold.
    grace_since_s: float = math.inf

    def holds_at(self, now_s: float, cfg: PlacementConfig) -> bool:
        """Whether the same snapshots still have this room at ``now_s`` (no GPU left its grace)."""
        return now_s >= self.at_s and now_s - self.grace_since_s < cfg.launch_grace_s

    def may_fit(self, k: int, need_free: float | None, collocate: bool) -> bool:
        """False when ``place_on_node`` surely refuses a job of ``k`` GPUs that needs ``need_free``
        usable MiB on each (None: no memory gate); ``collocate``: it may share GPUs."""
        if self.idle >= k:
            return True
        if not collocate or len(self.open_free) < k:
            return False
        return need_free is None or self.open_free[k - 1] >= need_free


def node_room(gpus: Sequence[GpuState], cfg: PlacementConfig, now_s: float) -> NodeRoom:
    pol = cfg.rules
    fresh, launched = _grace_split(gpus, cfg, now_s)
    return _room(fresh, launched, sum(not g.resident_jobs for g in fresh), cfg, pol, now_s)


def _room(fresh: list[GpuState], launched: list[float], idle: int, cfg: PlacementConfig, pol: Policy,
          now_s: float) -> NodeRoom:
    open_free = [_usable_free(g, cfg) for g in fresh if _closed(g, cfg, pol) is None]
    open_free.sort(reverse=True)
    return NodeRoom(idle, tuple(open_free), now_s, min(launched, default=math.inf))


def _refusal(gate: str, g: GpuState, cfg: PlacementConfig, need_free: float) -> str:
    """Why ``gate`` refused GPU ``g``, in words."""
    if gate == "sharing":
        return f"gpu{g.index}: {g.sharing.value} does not collocate"
    if gate == "jobs":
        return f"gpu{g.index}: {len(g.resident_jobs)} jobs resident (max {cfg.max_jobs_per_gpu})"
    if gate == "utilization":
        return f"gpu{g.index}: utilization gate (SMACT {g.risk.smact:.2f}, SMOCC {g.risk.smocc:.2f}, DRAMA {g.risk.drama:.2f})"
    if gate == "memory":
        return f"gpu{g.index}: {gib(_usable_free(g, cfg))} usable < {gib(need_free)} needed"
    return f"gpu{g.index}: predicted SMACT over budget {cfg.smact_budget:.2f}"


def _rank(pol: Policy, passing: list[GpuState], k: int, cfg: PlacementConfig, cursor: int,
          n: int) -> tuple[list[int], int]:
    """Pick k GPUs among those passing the gates, in the policy's order."""
    key = pol.gpu_key
    if key is None:  # round-robin: on from the cursor
        ordered = sorted(passing, key=lambda g: ((g.index - cursor) % max(n, 1), g.index))
        chosen = [g.index for g in ordered[:k]]
        return chosen, (chosen[-1] + 1) % max(n, 1)
    if cfg.spare_multi_gpu_jobs:
        ordered = sorted(passing, key=lambda g: (g.multi_gpu_jobs > 0, *key(g)))
    else:
        ordered = sorted(passing, key=key)
    return [g.index for g in ordered[:k]], cursor
