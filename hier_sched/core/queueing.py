"""One scheduling cycle: order the queue, place jobs (single-node and gangs), say why others wait.

``plan_cycle`` is the whole decision the live global queue and the simulator make each time
something changes. It is pure: the GPU snapshots, the queue and ``now_s`` come in; placements
and reasons go out. Nothing is applied to the cluster here — the shell launches the
placements and feeds the consequences back as new snapshots.

Ordering: ``queued_job.queue_key``. ``strict_fifo`` (the thesis) stops at the first job that cannot start; backfilling lets later
jobs pass it. So that a big job (a gang, a whole-GPU job, an exclusive recovery) is not starved
by a stream of small ones, a head that has waited ``head_wait_limit_s`` gets GPUs *held*: the
GPUs expected to drain first (learned run times, ``runtimes``) take no new job, so they empty as
their residents finish, while backfilling goes on everywhere else. The hold is sticky (the owner
keeps it on the job) so the drained GPUs are not handed to someone else.

Cost: a cycle costs what it decides, not the length of the queue or the size of the cluster. The
owner keeps the queue sorted (``queue_key``); the cycle stops at a strict-FIFO head or at the
backfill depth (the rest share one reason, ``WaitReasons``); each node's room for any job
(``node_room``) is learnt once per cycle, and kept across cycles until the shell reports a
change of the node's snapshots (``ClusterIndex.changed``), so the nodes that must refuse are
skipped; refusals are put in words only when read. ``tests/core/test_core_plan_equivalence.py``
checks all of it against the plain algorithm, and ``hier-sched bench decide`` measures it
(BENCHMARKS.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.cycle_view import CycleView
from hier_sched.core.gpu import GpuState, Placement
from hier_sched.core.gpu_types import allows
from hier_sched.core.placement import (
    PlacementConfig, PlacementRequest, assess_node, memory_requirement,
    place_on_node,
)
from hier_sched.core.queued_job import QueueConfig, QueuedJob, queue_key, queue_order
from hier_sched.core.quotas import Charge
from hier_sched.core.recovery import recovery_requirement
from hier_sched.core.type_choice import TypeChoice
from hier_sched.core.units import gib
from hier_sched.core.wait_reasons import NO_NODE_HAS, SMALLER_FAILED, WaitReasons

__all__ = [
    "QueuedJob", "QueueConfig", "CyclePlan", "WaitReasons", "QuotaGate", "OpenGate", "OPEN_GATE", "plan_cycle", "queue_key",
    "queue_order", "placement_request", "note_blocked_head", "held_reason", "NO_NODE_HAS",
]

_NEXT_CYCLE = "this cycle started its {} jobs (starts_per_cycle); the next one goes on"


class QuotaGate(Protocol):
    """What each job's team queue allows in one cycle (``team_queue_part``). ``given``: what this
    cycle has given each queue's jobs so far. ``refuses_nobody``: ``refusal`` is always None."""

    refuses_nobody: bool

    def refusal(self, job: QueuedJob, given: Mapping[str, Charge]) -> str | None:
        """Why the job's queue refuses it now (it then waits for quota, not for GPUs), or None."""

    def count_placed(self, job: QueuedJob, given: dict[str, Charge]) -> None:
        """The cycle placed the job: its queue holds what it charges from now on."""


class OpenGate:
    """One open queue (no team queues configured): every job may start."""

    refuses_nobody = True

    def refusal(self, job: QueuedJob, given: Mapping[str, Charge]) -> str | None:
        return None

    def count_placed(self, job: QueuedJob, given: dict[str, Charge]) -> None:
        pass


OPEN_GATE = OpenGate()

@dataclass(slots=True)
class CyclePlan:
    placements: list[tuple[QueuedJob, tuple[Placement, ...]]] = field(default_factory=list)
    waiting: WaitReasons = field(default_factory=WaitReasons)
    rr_cursor: int = 0
    holds: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = field(default_factory=dict)
    head: str | None = None  # the first job in queue order that could not start


def note_blocked_head(head: QueuedJob, plan: "CyclePlan", now_s: float) -> bool:
    """Start the head's waiting clock (the aging limit of backfilling) when it did not start,
    and keep the GPUs this cycle held for it, so the next cycle holds the same ones. Returns
    whether either changed (what a shell that keeps a log must write: ``events.HeadWaiting``)."""
    held = plan.holds.get(head.job_id, ())
    changed = head.waiting_since_s is None or held != head.held
    if head.waiting_since_s is None:
        head.waiting_since_s = now_s
    head.held = held
    return changed


def placement_request(job: QueuedJob, gpu_total_mib: float, qcfg: QueueConfig,
                      gpu_type: str | None = None) -> PlacementRequest:
    """What the job asks of a node now (of a node of ``gpu_type``, when given: its need there,
    and ``gpu_total_mib`` is that type's GPU memory): its estimate, or the recovery step after
    OOM crashes."""
    need = job.need_mib if gpu_type is None or not job.needs else job.need_on(gpu_type)
    min_free, must_idle = recovery_requirement(
        job.oom_count, need, job.observed_peak_mib, gpu_total_mib, qcfg.recovery
    )
    if job.recovering and job.observed_peak_mib is not None:
        need = max(need or 0.0, job.observed_peak_mib)
    return PlacementRequest(
        job.job_id, job.per_node, need, job.smact, exclusive=job.exclusive or must_idle, min_free_mib=min_free
    )


def launch_request(job: QueuedJob, cluster: ClusterIndex, node: str, qcfg: QueueConfig) -> PlacementRequest:
    """The request a placement of ``job`` on ``node`` was planned with (``plan_cycle``)."""
    if len(cluster.type_names) < 2:
        sole = cluster.type_names[0] if cluster.type_names else None
        return placement_request(job, cluster.gpu_total_mib, qcfg, sole)
    gpu_type = cluster.type_of(cluster.pos[node])
    return placement_request(job, cluster.type_capacity[gpu_type], qcfg, gpu_type)


def plan_cycle(
    queue: Sequence[QueuedJob],
    cluster: ClusterIndex,
    cfg: PlacementConfig,
    qcfg: QueueConfig,
    now_s: float,
    *,
    rr_cursor: int = 0,
    expected_end: Mapping[str, float] | None = None,
    ordered: bool = False,
    quotas: QuotaGate = OPEN_GATE,
) -> CyclePlan:
    """Decide which queued jobs start now and where. ``expected_end`` (optional) maps running
    jobs to when they are expected to finish (learned from earlier runs of the same job); it
    lets a hold pick the GPUs that will drain first. ``ordered``: ``queue`` is already in queue
    order (``queue_key``), as a queue owner that keeps it sorted passes it; the plan's wait
    reasons then read that list later, so an owner that changes it reports each change to
    ``plan.waiting.queue_changed``. ``quotas``: a job its team queue's quota refuses waits for quota,
    not for GPUs: it is skipped (never the head), with the quota's reason."""
    plan = CyclePlan(rr_cursor=rr_cursor)
    given: dict[str, Charge] = {}  # queue -> what this cycle gave its jobs (``quotas``)
    # (bound once: asked of every job looked at, unless the gate refuses nobody)
    refusal, count_placed = (None if quotas.refuses_nobody else quotas.refusal), quotas.count_placed
    view = CycleView(cluster)
    if not ordered:
        queue = queue_order(queue, qcfg.gangs_first)
    total = cluster.gpu_total_mib
    # One GPU type (the thesis' clusters): every job that may run on it takes the one path below.
    # Several: a job tries its types in ``type_choice``'s order (``_place_typed``).
    sole = cluster.type_names[0] if len(cluster.type_names) == 1 else None
    types: TypeChoice | None = None
    if len(cluster.type_names) > 1:
        types = TypeChoice(cluster.type_names, cluster.type_capacity, cluster.idle_by_type(),
                           queue[:qcfg.backfill_depth + 1], cfg.margin_mib, cfg.type_aware)

    mixed = types is not None
    # (GPU type, nodes, per_node, exclusive) -> least need_free that failed on that type this
    # cycle: ``_place_typed`` skips a type where a job of a shape no bigger failed (as below)
    typed_failed: dict[tuple[str, int, int, bool], float] = {}

    def typed(job: QueuedJob) -> bool:
        return mixed or (bool(job.gpu_types) and not allows(job.gpu_types, sole or ""))

    limit = qcfg.starts_per_cycle
    # Jobs start in queue order until one cannot: the head.
    for position, head in enumerate(queue):
        if limit is not None and len(plan.placements) >= limit:
            plan.waiting.set_rest(queue, position, _NEXT_CYCLE.format(limit))
            return plan
        if refusal is not None and (why := refusal(head, given)) is not None:
            plan.waiting[head.job_id] = (why,)
            continue
        if typed(head):
            placements, reasons, plan.rr_cursor, req = _place_typed(head, view, cfg, now_s, plan.rr_cursor, qcfg, types,
                                                                    typed_failed)
        else:
            req = placement_request(head, total, qcfg, sole)
            placements, reasons, plan.rr_cursor = _place_job(head, req, view, cfg, now_s, plan.rr_cursor, qcfg)
        if not placements:
            break
        _reserve(plan, view, head, placements, now_s)
        count_placed(head, given)
    else:
        return plan
    plan.head = head.job_id
    plan.waiting[head.job_id] = reasons
    if qcfg.strict_fifo:
        plan.waiting.set_rest(queue, position + 1, "behind the head of the queue")
        return plan
    blocked_since = head.waiting_since_s if head.waiting_since_s is not None else now_s
    if now_s - blocked_since >= qcfg.head_wait_limit_s:
        # a hold stays where it was, unless its node was drained or lost since
        kept = head.held and all(view.cluster.offers(n) for n, _ in head.held)
        hold = head.held if kept else _gpus_to_hold(head, view, expected_end or {})
        view.hold(hold, head.job_id, now_s)
        plan.holds[head.job_id] = hold
        plan.waiting[head.job_id] += (held_reason(hold),)
    window_end = position + 1 + qcfg.backfill_depth
    if len(queue) > window_end:
        plan.waiting.set_rest(queue, window_end, "beyond the backfill depth")

    # Backfilling: the next jobs start where they fit, except that a job waits when a job of a
    # shape no bigger failed this cycle: as many nodes or fewer, as many GPUs per node or fewer,
    # as much free memory or less, and exclusive only if it is. ``backfill_depth`` jobs (256) are
    # looked at in every cycle, so this loop is kept lean.
    # (nodes, per_node, exclusive) -> least need_free that failed (jobs placed by type: not compared)
    failed = {} if typed(head) else {(head.nodes, req.gpus, req.exclusive): memory_requirement(req, cfg)[0]}
    bounds: dict[tuple[int, int, bool], float] = {}  # the same key -> least failed need_free of a shape no bigger
    reasons_of = plan.waiting.own  # written directly: once per job looked at
    smaller_failed = plan.waiting.smaller_failed
    margin_mib, no_estimate_mib = cfg.margin_mib, cfg.no_estimate_mib
    for job in queue[position + 1:window_end]:
        if limit is not None and len(plan.placements) >= limit:
            reasons_of[job.job_id] = (_NEXT_CYCLE.format(limit),)
            continue
        if refusal is not None and (why := refusal(job, given)) is not None:
            reasons_of[job.job_id] = (why,)
            continue
        if mixed or (job.gpu_types and not allows(job.gpu_types, sole or "")):  # (``typed``, inlined: hot loop)
            placements, reasons, plan.rr_cursor, _ = _place_typed(job, view, cfg, now_s, plan.rr_cursor, qcfg, types,
                                                                  typed_failed)
            if placements:
                _reserve(plan, view, job, placements, now_s)
                count_placed(job, given)
            else:
                reasons_of[job.job_id] = reasons
            continue
        if job.oom_count:  # recovering: the request is the recovery step's
            req = placement_request(job, total, qcfg, sole)
            need_free, _ = memory_requirement(req, cfg)
            exclusive = req.exclusive
        else:  # on its estimate (``estimate_requirement``, inlined); the request is built only if the job is tried
            need = job.need_on(sole or "") if job.needs else job.need_mib
            need_free = no_estimate_mib if need is None else need + margin_mib
            exclusive = job.exclusive
        per_node = job.gpus_per_node  # (``job.nodes``, ``job.per_node``, inlined: this loop is hot)
        kind = (job.gpus // per_node, per_node, exclusive) if per_node else (1, job.gpus, exclusive)
        bound = bounds.get(kind)
        if bound is None:
            bound = bounds[kind] = min((need for (n, g, e), need in failed.items()
                                        if n <= kind[0] and g <= kind[1] and (e or not exclusive)), default=math.inf)
        if need_free >= bound:
            smaller_failed.append(job)
            continue
        if not job.oom_count:
            req = placement_request(job, total, qcfg, sole)
        placements, reasons, plan.rr_cursor = _place_job(job, req, view, cfg, now_s, plan.rr_cursor, qcfg)
        if placements:
            _reserve(plan, view, job, placements, now_s)
            count_placed(job, given)
            continue
        if need_free < failed.get(kind, math.inf):
            failed[kind] = need_free
            bounds.clear()
        reasons_of[job.job_id] = reasons
    return plan


def _reserve(plan: CyclePlan, view: CycleView, job: QueuedJob, placements: tuple[Placement, ...], now_s: float) -> None:
    for p in placements:
        view.reserve(p, now_s)
    plan.placements.append((job, placements))


def _gpus_to_hold(job: QueuedJob, view: CycleView, expected_end: Mapping[str, float],
                  nodes_looked_at: int = 16) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The GPUs likely to drain first. A GPU drains when its last resident ends: known from
    ``expected_end``, else unknown (after every known one). Among the nodes with the most free
    memory in their ``per_node``-th best GPU, take the ``job.nodes`` whose ``per_node``-th GPU
    drains first, and on each its first-draining GPUs (ties: fewer residents, more free memory)."""
    free = view.cluster.free
    k = min(job.per_node, free.shape[1])
    kth = -np.sort(-free, axis=1)[:, k - 1]
    ranked = []
    for row in np.argsort(-kth, kind="stable")[: max(nodes_looked_at, job.nodes)]:
        if kth[row] == -np.inf:
            break
        name = view.cluster.names[row]
        gpus = sorted(view.gpus(name), key=lambda g: (_drains_at(g, expected_end), len(g.resident_jobs),
                                                      -g.memory_free_mib, g.index))[:k]
        if len(gpus) == k:
            ranked.append((_drains_at(gpus[-1], expected_end), len(ranked), name, tuple(sorted(g.index for g in gpus))))
    ranked.sort()
    return tuple((name, gpus) for _, _, name, gpus in ranked[: job.nodes])


def _drains_at(gpu: GpuState, expected_end: Mapping[str, float]) -> float:
    return max((expected_end.get(j, float("inf")) for j in gpu.resident_jobs), default=0.0)


def _describe(hold: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    return ", ".join(f"{node} GPU {','.join(map(str, gpus))}" for node, gpus in hold) or "nothing"


def held_reason(hold: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """Why a head past its wait limit waits, without saying how long: this clock is the
    scheduler's (emulated on emulated clusters), and the shells show how long in the user's."""
    return f"waited past the head's limit: holding {_describe(hold)} for it"


def _place_typed(
    job: QueuedJob,
    view: CycleView,
    cfg: PlacementConfig,
    now_s: float,
    rr_cursor: int,
    qcfg: QueueConfig,
    types: TypeChoice | None,
    failed: dict[tuple[str, int, int, bool], float],
) -> tuple[tuple[Placement, ...], tuple[str, ...] | Callable[[], tuple[str, ...]], int, PlacementRequest | None]:
    """``_place_job`` on a cluster of several GPU types (or for a job that may not run on the one
    type there): the job's types in ``TypeChoice`` order, each with the request for that type,
    all ranks of a gang on one type. A type where a job of a shape no bigger failed this cycle
    (``failed``, which this keeps) is skipped, as backfilling skips such jobs on one type. Also
    returns the request of the placement found (of the first type tried, without one)."""
    cluster = view.cluster
    order, kept = types.order(job) if types is not None else ([], [])
    note = (f"the {', '.join(kept)} GPUs are kept for waiting jobs that only they can hold",) if kept else ()
    if not order:
        why = note or (f"{NO_NODE_HAS} a GPU type it may run on ({', '.join(job.gpu_types) or 'any'}) "
                       "that holds its need",)
        return (), why, rr_cursor, None
    first_reasons: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    first_req = None
    for i, gpu_type in enumerate(order):
        req = placement_request(job, cluster.type_capacity[gpu_type], qcfg, gpu_type)
        need_free = memory_requirement(req, cfg)[0]
        shape = (gpu_type, job.nodes, req.gpus, req.exclusive)
        if any(t == gpu_type and n <= shape[1] and g <= shape[2] and (e or not req.exclusive) and need <= need_free
               for (t, n, g, e), need in failed.items()):
            if first_req is None:
                first_reasons, first_req = SMALLER_FAILED, req
            continue
        placements, reasons, cursor = _place_job(job, req, view, cfg, now_s, rr_cursor, qcfg, gpu_type)
        if not placements:
            failed[shape] = min(need_free, failed.get(shape, math.inf))
        if placements:
            assert types is not None
            shared = [g for p in placements for g in view.gpus(p.node) if g.index in p.gpus]
            faster = types.better_idle_type(job, gpu_type, shared, cluster.sharing, order[i + 1:])
            if faster is not None:
                alt_req = placement_request(job, cluster.type_capacity[faster], qcfg, faster)
                alt, _, alt_cursor = _place_job(job, alt_req, view, cfg, now_s, rr_cursor, qcfg, faster)
                if alt:
                    placements, cursor, req, gpu_type = alt, alt_cursor, alt_req, faster
                    shared = [g for p in alt for g in view.gpus(p.node) if g.index in p.gpus]
            types.placed(job, gpu_type, sum(1 for g in shared if g.idle))
            return placements, (), cursor, req
        if first_req is None:
            first_reasons, first_req = reasons, req
    if note:
        first_reasons = partial(_noted, first_reasons, note)
    return (), first_reasons, rr_cursor, first_req


def _noted(reasons: tuple[str, ...] | Callable[[], tuple[str, ...]], note: tuple[str, ...]) -> tuple[str, ...]:
    return (reasons() if callable(reasons) else reasons) + note


def _place_job(
    job: QueuedJob,
    req: PlacementRequest,
    view: CycleView,
    cfg: PlacementConfig,
    now_s: float,
    rr_cursor: int,
    qcfg: QueueConfig,
    gpu_type: str | None = None,
) -> tuple[tuple[Placement, ...], tuple[str, ...] | Callable[[], tuple[str, ...]], int]:
    """All-or-nothing: a gang gets ``job.nodes`` distinct nodes or nothing (of ``gpu_type`` only,
    when given). Without a placement, why: the words, or the question that gets them
    (``WaitReasons``)."""
    chosen: list[Placement] = []
    cursor = rr_cursor
    need_free, _ = memory_requirement(req, cfg)
    pol = cfg.rules
    collocate = pol.collocates and not req.exclusive
    gated_need = need_free if pol.memory_gate or req.min_free_mib is not None else None
    rows = view.cluster.candidate_rows(req, cfg, limit=qcfg.nodes_tried, gpu_type=gpu_type)
    names = view.cluster.names
    known, met = view.known, view.met
    k = req.gpus
    for row in rows:
        room = known.get(row)
        if room is None and row not in met:
            room = view.recall(row, cfg, now_s)
        if room is None:
            name = names[row]
            verdict, room = assess_node(req, view.gpus(name), cfg, now_s, cursor)
            if room is not None:
                view.learn(row, room, cfg)
        elif room.may_fit(k, gated_need, collocate):
            name = names[row]
            verdict = place_on_node(req, view.gpus(name), cfg, now_s, cursor, explain=False)
        else:  # (most candidates of the jobs after the head: their rooms are known and too small)
            continue
        if not verdict.placed:
            continue
        cursor = verdict.next_rr_cursor
        chosen.append(
            Placement(job.job_id, name, verdict.gpus, verdict.reserved_mib, verdict.exclusive, cfg.policy, verdict.reasons[0])
        )
        if len(chosen) == job.nodes:
            return tuple(chosen), (), cursor
    prefix = (f"gang: {len(chosen)}/{job.nodes} nodes available",) if chosen else ()  # a partial gang reserves nothing
    # The reason reported is the last candidate's that refused (its words do not depend on the cursor).
    taken = {p.node for p in chosen}
    refused = next((names[row] for row in reversed(rows) if names[row] not in taken), None)
    if refused is None:
        wanted = "idle GPU(s)" if req.exclusive else f"GPU(s) with {gib(need_free)} usable"
        if gpu_type is not None:
            wanted += f" of type {gpu_type}"
        return (), prefix + (f"{NO_NODE_HAS} {req.gpus} {wanted}",), rr_cursor
    return (), partial(_refusal_words, prefix, req, refused, tuple(view.gpus(refused)), cfg, now_s), rr_cursor


def _refusal_words(prefix: tuple[str, ...], req: PlacementRequest, node: str, gpus: tuple[GpuState, ...],
                   cfg: PlacementConfig, now_s: float) -> tuple[str, ...]:
    """Why ``node`` (in the state ``gpus`` it had then) refused ``req``, in words."""
    return prefix + (f"{node}: " + "; ".join(place_on_node(req, gpus, cfg, now_s).reasons),)
