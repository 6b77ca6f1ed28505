"""Clusters of several GPU types in the core: admission per type, placement per type (filter,
protection of big GPUs, speed and interference), peaks learned per (job, GPU type)."""

from __future__ import annotations

import random

import pytest

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.events import (
    JobTicket, Launch, NodeJoined, Reject, RunEnded, Submitted, event_from_record, to_record,
)
from hier_sched.core.gpu import GpuState, Risk
from hier_sched.core.gpu_types import GPU_TYPES
from hier_sched.core.learning import MEASURED_MARGIN
from hier_sched.core.placement import PlacementConfig, PlacementRequest
from hier_sched.core.presets import preset
from hier_sched.core.scheduler import Scheduler

A100, H100 = "A100-40GB", "H100-80GB"


def node(name: str, kind: str, used: list[float], smact: float = 0.0) -> list[GpuState]:
    """GPUs of ``kind`` with the used memory given (a GPU in use hosts some other job)."""
    total = float(GPU_TYPES[kind].memory_mib)
    return [GpuState(name, i, total, u, gpu_type=kind, resident_jobs=("other",) if u else (),
                     risk=Risk(smact=smact if u else 0.0)) for i, u in enumerate(used)]


def index(*nodes: list[GpuState]) -> ClusterIndex:
    return ClusterIndex.from_snapshots({gpus[0].node: gpus for gpus in nodes})


def scheduler(shape: dict[str, tuple[str, int]], **placement) -> Scheduler:
    s = Scheduler(preset("auto", **placement))
    s.apply([NodeJoined(n, (float(GPU_TYPES[kind].memory_mib),) * gpus, (kind,) * gpus)
             for n, (kind, gpus) in shape.items()], 0.0)
    return s


def ticket(job_id: str, need: float = 3000.0, **kw) -> JobTicket:
    return JobTicket(job_id, job_id, **{"need_mib": need, "signature": job_id, **kw})


def launches(commands) -> dict[str, Launch]:
    return {c.job_id: c for c in commands if isinstance(c, Launch)}


def rejects(commands) -> dict[str, str]:
    return {c.job_id: c.reason for c in commands if isinstance(c, Reject)}


# ---------------------------------------------------------------- admission
def test_a_job_is_admitted_when_one_allowed_type_holds_its_need_there_and_refused_naming_the_types():
    s = scheduler({"a": (A100, 2), "h": (H100, 2)})
    out = s.apply([Submitted(ticket("big", 60000.0)),
                   Submitted(ticket("big-a100", 60000.0, gpu_types=("A100*",))),
                   Submitted(ticket("per-type", 30000.0, needs=((A100, 41000.0), (H100, 41500.0)),
                                    gpu_types=("A100*",))),
                   Submitted(ticket("v100", gpu_types=("V100*",)))], 1.0)
    refused = rejects(out)
    assert "big" not in refused  # the H100s hold 60 GB
    assert "A100-40GB needs 60000 MiB per GPU" in refused["big-a100"] and "40536 MiB" in refused["big-a100"]
    assert "H100" not in refused["big-a100"]  # only the types it may run on are named
    assert "A100-40GB needs 41000 MiB per GPU" in refused["per-type"]  # the need on that type, not need_mib
    assert "V100* matches none of the cluster's GPU types (A100-40GB, H100-80GB)" in refused["v100"]
    assert s.gpu_types_present() == [A100, H100]


def test_a_single_type_cluster_keeps_the_old_refusal_words():
    s = scheduler({"a": (A100, 2)})
    (reason,) = rejects(s.apply([Submitted(ticket("big", 60000.0))], 1.0)).values()
    assert reason == "memory_mib: needs 60000 MiB per GPU on 1 GPU(s) of 1 node(s); the largest GPU has 40536 MiB"


def test_node_joined_records_without_types_still_read():
    record = to_record(NodeJoined("a", (40536.0,)))
    del record["gpu_types"]  # a log written before nodes reported their types
    assert event_from_record(record) == NodeJoined("a", (40536.0,))
    typed = NodeJoined("a", (40536.0,), (A100,))
    assert event_from_record(to_record(typed)) == typed and typed.gpu_type == A100


# ---------------------------------------------------------------- placement
def test_the_type_filter_ranks_a_types_rows_exactly_as_the_whole_ranking_does():
    """``candidate_rows(gpu_type=t)`` is the unfiltered answer with the other types' rows left out (and cut at
    ``limit``, the first ``limit`` of them)."""
    cfgs = [PlacementConfig(policy=p) for p in ("magm", "best-fit", "first-fit", "lug", "exclusive")]
    for seed in range(60):
        rng = random.Random(seed)
        nodes = []
        for i in range(rng.randint(2, 12)):
            kind = rng.choice([A100, H100, "V100-16GB"])
            total = GPU_TYPES[kind].memory_mib
            nodes.append(node(f"n{i}", kind, [rng.choice([0.0, 0.0, rng.uniform(0, total)]) for _ in range(rng.randint(1, 4))]))
        cluster = index(*nodes)
        req = PlacementRequest("j", rng.randint(1, 3), rng.choice([None, 2000.0, 12000.0, 30000.0]))
        cfg = rng.choice(cfgs)
        everything = cluster.candidate_rows(req, cfg)
        for kind in (A100, H100, "V100-16GB", "T4"):
            of_kind = [r for r in everything if cluster.type_of(r) == kind]
            assert cluster.candidate_rows(req, cfg, gpu_type=kind) == of_kind
            assert cluster.candidate_rows(req, cfg, limit=2, gpu_type=kind) == of_kind[:2]


@pytest.mark.parametrize("type_aware", [True, False])
def test_a_job_restricted_to_a100_never_lands_on_an_h100_and_a_big_one_lands_on_the_h100(type_aware):
    s = scheduler({"h": (H100, 2), "a": (A100, 2)}, type_aware=type_aware)
    cluster = index(node("h", H100, [0, 0]), node("a", A100, [0, 30000.0]))
    out = s.step([Submitted(ticket(f"a100-{i}", gpu_types=("A100*",))) for i in range(6)]
                 + [Submitted(ticket("big", 60000.0))], cluster, 1.0).commands
    started = launches(out)
    assert started["big"].placements[0].node == "h"
    assert {started[j].placements[0].node for j in started if j.startswith("a100")} == {"a"}


def test_the_request_carries_the_need_on_the_type_it_was_placed_on():
    s = scheduler({"a": (A100, 1), "h": (H100, 1)})
    cluster = index(node("a", A100, [0]), node("h", H100, [0]))
    out = s.step([Submitted(ticket("j", 10000.0, needs=((A100, 10000.0), (H100, 11000.0))))], cluster, 1.0).commands
    (launch,) = launches(out).values()
    assert launch.placements[0].node == "h"  # the faster type
    assert launch.request.need_mib == 11000.0 and launch.placements[0].reserved_mib >= 11000.0


@pytest.mark.parametrize("type_aware", [True, False])
def test_small_jobs_leave_the_only_gpus_big_enough_to_a_waiting_big_job(type_aware):
    """H100 first in cluster order, one of its GPUs busy: the 2-GPU 60 GB job waits for both.
    Aware placement keeps the idle H100 from the 3 GB jobs (they take the A100s, and the third
    waits for them); type-agnostic placement hands it to a small job."""
    s = scheduler({"h": (H100, 2), "a": (A100, 2)}, type_aware=type_aware)
    cluster = index(node("h", H100, [0, 75000.0]), node("a", A100, [0, 0]))
    out = s.step([Submitted(ticket("big", 60000.0, gpus=2))]
                 + [Submitted(ticket(f"small-{i}")) for i in range(3)], cluster, 1.0).commands
    started = launches(out)
    on_h100 = [j for j, launch in started.items() if launch.placements[0].node == "h"]
    assert "big" not in started and {"small-0", "small-1"} <= set(started)
    if type_aware:
        assert on_h100 == [] and "small-2" not in started
        assert "H100-80GB GPUs are kept for waiting jobs that only they can hold" in s.reason("small-2")
    else:
        assert on_h100  # the H100 is first in cluster order


def test_without_a_waiting_big_job_a_small_job_takes_the_faster_type():
    s = scheduler({"a": (A100, 2), "h": (H100, 2)})
    out = s.step([Submitted(ticket("small"))], index(node("a", A100, [0, 0]), node("h", H100, [0, 0])), 1.0).commands
    assert launches(out)["small"].placements[0].node == "h"


@pytest.mark.parametrize("smact, where", [(0.9, "y"), (0.1, "x")])
def test_an_idle_slower_type_wins_when_sharing_the_faster_one_would_slow_the_job_more(smact, where):
    """x: an A100-80GB (speed 1.05) shared with a job at SMACT 0.7; y: an idle A100-40GB (1.0).
    A busy job (0.9) would run at about half speed on x: y finishes it sooner; a light one (0.1)
    loses little on x."""
    s = scheduler({"x": ("A100-80GB", 1), "y": (A100, 1)})
    cluster = index(node("x", "A100-80GB", [10000.0], smact=0.7), node("y", A100, [0]))
    out = s.step([Submitted(ticket("j", smact=smact))], cluster, 1.0).commands
    assert launches(out)["j"].placements[0].node == where


# ---------------------------------------------------------------- learning
def test_a_peak_is_learned_for_the_type_it_ran_on_only():
    s = scheduler({"a": (A100, 1), "h": (H100, 1)})
    cluster = index(node("a", A100, [0]), node("h", H100, [0]))
    first = ticket("first", 5000.0, signature="same-job", learn_peak=True)
    (launch,) = launches(s.step([Submitted(first)], cluster, 1.0).commands).values()
    assert launch.placements[0].node == "h"
    s.apply([RunEnded("first", 1, None, 0, 20000.0)], 2.0)
    s.apply([Submitted(ticket("again", 5000.0, signature="same-job", learn_peak=True))], 3.0)
    again = s.job_queue["again"]
    assert again.need_on(H100) == pytest.approx(20000.0 * (1 + MEASURED_MARGIN))
    assert again.need_on(A100) == 5000.0  # never ran there: the estimate
    assert "measured peak" in s.jobs["again"].record.estimate_source
