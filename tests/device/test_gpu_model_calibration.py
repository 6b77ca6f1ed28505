"""Calibration of the emulated GPU against real measurements (run with ``-s`` to see the table).

Every test prints ``model`` next to ``measured`` with the tolerance it asserts. Sources: the
shared data under ``../shared/data`` (read in place, never copied) and figures quoted from the
thesis (../shared/reference/thesis-collocation-and-memory-estimation.md, Ch. 4 and Table 4.2).
"""

from __future__ import annotations

import ast
import csv
import json
import statistics

import numpy as np
import pytest

from hier_sched.common.paths import shared_dir
from hier_sched.core.gpu import SharingMode
from hier_sched.core.gpu_types import gpu_type
from hier_sched.device import gpu_physics
from hier_sched.device.gpu_model import EmulatedGpu, GpuOutOfMemory, JobActivity, mig_slices

SHARED = shared_dir()
DATA = SHARED / "data"
A100 = gpu_type("A100-40GB")


def report(claim: str, model: float, measured: float, tolerance: float, *, relative: bool = True) -> None:
    """Print one calibration line and assert the tolerance."""
    error = (model - measured) / measured if relative else model - measured
    unit = "%" if relative else ""
    shown = error * 100 if relative else error
    tolerance_shown = tolerance * 100 if relative else tolerance
    print(f"  {claim:<58} model {model:8.3f}  measured {measured:8.3f}  "
          f"error {shown:+6.1f}{unit} (tolerance +-{tolerance_shown:g}{unit})")
    assert abs(error) <= tolerance, claim


def note(claim: str, model: float, expectation: str) -> None:
    print(f"  {claim:<58} model {model:8.3f}  thesis: {expectation}")


def solo_profiles() -> list[dict[str, str]]:
    with open(DATA / "workloads" / "solo_profiles.csv", newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["source_gpu_count"] == "1"]


def profile_activity(row: dict[str, str]) -> JobActivity:
    return JobActivity(float(row["smact_mean_full"]), float(row["smocc_mean_full"]), float(row["drama_mean_full"]))


def median_smact(prefixes: tuple[str, ...]) -> float:
    rows = [r for r in solo_profiles() if r["workload_id"].startswith(prefixes)]
    return statistics.median(float(r["smact_mean_full"]) for r in rows)


_RESNET50_IMAGENET = next(r for r in solo_profiles() if r["workload_id"] == "resnet50_imagenet_bs128_1gpu")
# ResNet152/ImageNet: SMACT 0.82 from thesis Table 4.2; SMOCC/DRAMA of its nearest measured relative.
RESNET152 = JobActivity(0.82, profile_activity(_RESNET50_IMAGENET).smocc, profile_activity(_RESNET50_IMAGENET).drama)
RECOMMENDER = JobActivity(0.05)  # thesis Table 4.2: "GPU util 5 %"
# The thesis' small workload (ResNet26/CIFAR-10, Fig. 4.1) and medium one (EfficientNet_s on ImageNet
# at 64x64) have no SMACT in the thesis; the closest solo profiles stand in for them.
SMALL = JobActivity(median_smact(("resnet18_cifar100", "resnet34_cifar100")))
MEDIUM = JobActivity(median_smact(("efficientnet_imagenet",)))  # thesis Fig. 4.2: EfficientNet_s


def collocated(activities: list[JobActivity], sharing: SharingMode = SharingMode.MPS) -> EmulatedGpu:
    gpu = EmulatedGpu("A100-40GB", sharing=sharing)
    for number, activity in enumerate(activities):
        gpu.attach(f"job{number}", activity)
    return gpu


def slowdowns(activities: list[JobActivity], sharing: SharingMode = SharingMode.MPS) -> list[float]:
    gpu = collocated(activities, sharing)
    return [gpu.slowdown(job) for job in gpu.residents]


# ----------------------------------------------------------------------------- ResNet152 scaling
def resnet152_rows() -> dict[int, tuple[float | None, int]]:
    """copies -> (hours to finish all copies or None, memory MiB) from the shared CSV."""
    rows = {}
    with open(DATA / "workloads" / "resnet152_collocation_scaling.csv", newline="") as handle:
        for row in csv.reader(handle):
            if row and row[0].endswith("ResNet152"):
                copies = int(row[0].split("X")[0])
                rows[copies] = (None if row[1].strip() == "-" else float(row[1]), int(row[3]))
    return rows


def test_resnet152_collocation_time_and_memory():
    rows = resnet152_rows()
    solo_hours, solo_mib = rows[1]
    print("\nResNet152 on one A100-40GB under MPS (resnet152_collocation_scaling.csv)")
    for copies in (2, 3):
        hours, mib = rows[copies]
        gpu = collocated([RESNET152] * copies)
        for job in gpu.residents:
            gpu.allocate_peak(job, solo_mib)
        finish = solo_hours * max(gpu.slowdown(job) for job in gpu.residents)
        report(f"{copies}x time to finish all copies (h)", finish, hours, 0.05)
        report(f"{copies}x memory used (MiB)", gpu.memory_used_mib, mib, 0.005)
    _, mib_7x = rows[7]
    gpu = EmulatedGpu("A100-40GB")
    fitted = 0
    with pytest.raises(GpuOutOfMemory):
        for copy in range(7):
            gpu.attach(f"r{copy}", RESNET152)
            gpu.allocate_peak(f"r{copy}", solo_mib)
            fitted += 1
    print(f"  7x needs {mib_7x} MiB > {A100.memory_mib} MiB: model fits {fitted} copies, the next one OOMs")
    assert fitted < 7


# ----------------------------------------------------------------------------- thesis Table 4.2
TABLE_4_2 = {  # hours: (recommender, ResNet152); sequential total 6.41 h
    "solo": (5.36, 1.05),
    SharingMode.MPS: (5.57, 1.10),
    SharingMode.STREAMS: (6.09, 1.11),
}
TABLE_4_2_SEQUENTIAL_H = 6.41
TABLE_4_2_MIG_RESNET_H = 1.40  # ResNet on a 3g compute instance sharing the memory instance
TABLE_4_2_UTILIZATION = 0.81


def test_table_4_2_recommender_with_resnet152():
    print("\nThesis Table 4.2: recommender (SMACT 0.05) + ResNet152 (0.82) on one A100")
    solo_recommender, solo_resnet = TABLE_4_2["solo"]
    for sharing in (SharingMode.MPS, SharingMode.STREAMS):
        recommender_h, resnet_h = TABLE_4_2[sharing]
        factor_recommender, factor_resnet = slowdowns([RECOMMENDER, RESNET152], sharing)
        report(f"{sharing.value}: recommender time (h)", solo_recommender * factor_recommender, recommender_h, 0.03)
        report(f"{sharing.value}: ResNet152 epoch time (h)", solo_resnet * factor_resnet, resnet_h, 0.03)
        model_total = max(solo_recommender * factor_recommender, solo_resnet * factor_resnet)
        report(f"{sharing.value}: total time change vs sequential (points)",
               model_total / TABLE_4_2_SEQUENTIAL_H - 1, recommender_h / TABLE_4_2_SEQUENTIAL_H - 1,
               0.03, relative=False)
    smact = collocated([RECOMMENDER, RESNET152]).utilization()[0]
    report("aggregate SMACT", smact, TABLE_4_2_UTILIZATION, 0.05, relative=False)
    # MIG: the model's Amdahl slice law is far more pessimistic for ResNet152 on a 3g compute
    # instance than this one measurement (a known gap); what must hold is that MIG is the slower choice.
    mig_h = solo_resnet * gpu_physics.slice_slowdown(RESNET152.smact, 3 * A100.mig_sms_per_slice / A100.sm_count)
    note("MIG (3g compute instance): ResNet152 epoch time (h)", mig_h,
         f"{TABLE_4_2_MIG_RESNET_H} h (known gap: the model stretches all of its SM-active time)")
    assert mig_h > TABLE_4_2[SharingMode.MPS][1]


# ----------------------------------------------------------------------------- thesis Ch. 4 findings
def test_thesis_chapter_4_collocation_findings():
    print(f"\nThesis Ch. 4.3 (small workload SMACT {SMALL.smact:.2f}, medium {MEDIUM.smact:.2f}, "
          f"large = ResNet152 {RESNET152.smact:.2f})")
    two_small = max(slowdowns([SMALL] * 2))
    note("2-way small, MPS: slowdown", two_small, "two models in roughly the time of one")
    assert two_small <= 1.15
    three_medium = max(slowdowns([MEDIUM] * 3))
    note("3-way medium, MPS: slowdown", three_medium, "+50-110 % epoch time")
    assert 1.5 <= three_medium <= 2.1
    seven_small = max(slowdowns([SMALL] * 7))
    note("7-way small, MPS: slowdown", seven_small, "2-2.5x")
    assert 2.0 <= seven_small <= 2.5
    large_pair_gain = sum(1 / f for f in slowdowns([RESNET152] * 2))
    note("2-way large, MPS: combined throughput", large_pair_gain, "large jobs gain little")
    assert 1.0 < large_pair_gain <= 1.3
    large_streams = max(slowdowns([RESNET152] * 2, SharingMode.STREAMS))
    note("2-way large, streams: slowdown", large_streams, "about as slow as in sequence (2.0)")
    assert 1.85 <= large_streams <= 2.2
    seven_mig = []
    for slice_ in mig_slices("A100-40GB", ("1g.5gb",) * 7):
        slice_.attach("small", SMALL)
        seven_mig.append(slice_.slowdown("small"))
    note("7-way small on 1g.5gb slices: slowdown", max(seven_mig),
         f"slightly slower than MPS ({seven_small:.2f}); model: within 15 %")
    assert abs(max(seven_mig) / seven_small - 1) <= 0.15
    big_slices = mig_slices("A100-40GB", ("3g.20gb", "3g.20gb"))
    for slice_ in big_slices:
        slice_.attach("large", RESNET152)
    mig_gain = sum(1 / s.slowdown("large") for s in big_slices)
    note("2-way large on 3g.20gb slices: combined throughput", mig_gain,
         "not advantageous (~1); thesis: a little better than naive, model: a little worse")
    assert mig_gain <= 1.1


def test_collocation_pays_while_aggregate_smact_is_below_80_percent():
    """Thesis guideline: collocation is highly beneficial while aggregate SMACT <= 80 %."""
    activities = [profile_activity(r) for r in solo_profiles()]
    gains_below, gains_above = [], []
    for first in activities:
        for second in activities:
            gpu = collocated([first, second])
            gain = sum(1 / gpu.slowdown(job) for job in gpu.residents)
            (gains_below if gpu.utilization()[0] <= 0.8 else gains_above).append(gain)
    print(f"\n  pairs of solo profiles with aggregate SMACT <= 0.8: {len(gains_below)}, min combined "
          f"throughput {min(gains_below):.2f}; above 0.8: {len(gains_above)}, "
          f"median {statistics.median(gains_above):.2f}")
    assert min(gains_below) >= 1.7
    assert statistics.median(gains_above) < min(gains_below)


# ----------------------------------------------------------------------------- constants refit
def _fit_rows(cases):
    """(fluid, measured, D, O_i, (n-1)^2) for each (smacts, index of the job, measured slowdown)."""
    rows = []
    for smacts, index, measured in cases:
        share = gpu_physics.water_fill(smacts)[index]
        fluid = smacts[index] / share if share < smacts[index] else 1.0
        total = sum(smacts)
        rows.append((fluid, measured, total, total - smacts[index], (len(smacts) - 1) ** 2))
    return rows


def test_sharing_constants_are_the_least_squares_fit_of_the_measurements():
    rows = resnet152_rows()
    solo_h = rows[1][0]
    (solo_rec, solo_res), (mps_rec, mps_res), (naive_rec, naive_res) = (
        TABLE_4_2["solo"], TABLE_4_2[SharingMode.MPS], TABLE_4_2[SharingMode.STREAMS])
    mps = _fit_rows([
        ([0.82] * 2, 0, rows[2][0] / solo_h),
        ([0.82] * 3, 0, rows[3][0] / solo_h),
        ([0.05, 0.82], 0, mps_rec / solo_rec),
        ([0.05, 0.82], 1, mps_res / solo_res),
        ([SMALL.smact] * 7, 0, 2.25),  # thesis: 7-way small 2-2.5x
    ])
    design = np.array([[r[2], r[4]] for r in mps])
    target = np.array([r[1] / r[0] - 1 for r in mps])
    (alpha, gamma), *_ = np.linalg.lstsq(design, target, rcond=None)
    print(f"\n  MPS refit alpha {alpha:.4f} gamma {gamma:.4f}; stored {gpu_physics.MPS_CALIBRATION}")
    assert alpha == pytest.approx(gpu_physics.MPS_CALIBRATION.total_cost, abs=0.003)
    assert gamma == pytest.approx(gpu_physics.MPS_CALIBRATION.process_cost, abs=0.002)
    streams = _fit_rows([
        ([0.05, 0.82], 0, naive_rec / solo_rec),
        ([0.05, 0.82], 1, naive_res / solo_res),
        ([0.82] * 2, 0, 2.0),  # thesis: naive collocation of large jobs ~ running them in sequence
    ])
    design = np.array([[r[2], r[3]] for r in streams])
    target = np.array([r[1] / r[0] - 1 - gamma * r[4] for r in streams])
    (alpha_s, beta_s), *_ = np.linalg.lstsq(design, target, rcond=None)
    print(f"  streams refit alpha {alpha_s:.4f} beta {beta_s:.4f}; stored {gpu_physics.STREAMS_CALIBRATION}")
    assert alpha_s == pytest.approx(gpu_physics.STREAMS_CALIBRATION.total_cost, abs=0.003)
    assert beta_s == pytest.approx(gpu_physics.STREAMS_CALIBRATION.wait_cost, abs=0.003)


# ----------------------------------------------------------------------------- Gavel pairs
def gavel_pair_gains(cluster: str = "v100_unconsolidated") -> list[float]:
    """Combined normalized throughput of every feasible single-GPU pair Gavel measured."""
    with open(DATA / "interference" / "gavel_physical_cluster_throughputs.json") as handle:
        table = json.load(handle)[cluster]
    gains = []
    for job, row in table.items():
        if ast.literal_eval(job)[1] != 1:
            continue
        for other, pair in row.items():
            if other == "null" or other not in table or pair == [0.0, 0.0]:
                continue  # [0, 0] = the pair did not fit in memory
            gains.append(pair[0] / row["null"] + pair[1] / table[other]["null"])
    return gains


def on_slower_gpu(activity: JobActivity, relative_speed: float) -> JobActivity:
    """The same job on a GPU ``relative_speed`` times as fast: its GPU phases stretch, host ones do not."""
    stretched = activity.smact / relative_speed
    return JobActivity(stretched / (1 - activity.smact + stretched))


def model_pair_gains(activities: list[JobActivity], peaks: list[float], sharing: SharingMode) -> list[float]:
    gains = []
    for first, first_peak in zip(activities, peaks):
        for second, second_peak in zip(activities, peaks):
            if first_peak + second_peak > A100.memory_mib:
                continue  # does not fit: excluded, as Gavel's infeasible pairs are
            gpu = collocated([first, second], sharing)
            gains.append(sum(1 / gpu.slowdown(job) for job in gpu.residents))
    return gains


def describe(gains: list[float]) -> tuple[float, float, list[float]]:
    ordered = sorted(gains)
    quantiles = [ordered[int(q * (len(ordered) - 1))] for q in (0.1, 0.25, 0.5, 0.75, 0.9)]
    return statistics.median(ordered), sum(g < 1 for g in ordered) / len(ordered), quantiles


def test_pair_throughput_distribution_against_gavel():
    gavel_median, gavel_lose, gavel_q = describe(gavel_pair_gains())
    print("\nPairs sharing one GPU: combined normalized throughput (1 = no gain)")
    print(f"  Gavel V100 measured ({len(gavel_pair_gains())} pairs): median {gavel_median:.2f}, "
          f"lose {gavel_lose:.0%}, p10-p90 {[round(q, 2) for q in gavel_q]}")
    # the data is what FIELD_NOTES quotes
    assert gavel_median == pytest.approx(1.37, abs=0.01) and gavel_lose == pytest.approx(0.22, abs=0.01)
    rows = solo_profiles()
    peaks = [float(r["gpu_memory_peak_mib_peak_full"]) for r in rows]
    results = {}
    for label, activities in (
        ("A100 (solo_profiles)", [profile_activity(r) for r in rows]),
        ("same jobs on a V100 (0.55x)", [on_slower_gpu(profile_activity(r), gpu_type("V100-32GB").relative_speed)
                                         for r in rows]),
    ):
        for sharing in (SharingMode.MPS, SharingMode.STREAMS):
            median, lose, quantiles = results[label, sharing] = describe(model_pair_gains(activities, peaks, sharing))
            print(f"  model {label}, {sharing.value:<7}: median {median:.2f}, lose {lose:.0%}, "
                  f"p10-p90 {[round(q, 2) for q in quantiles]}")
    # The stated gap: the model is more optimistic than Gavel (light A100 profiles dominate, no
    # host-side contention, no pairs fighting over one bottleneck besides SM time); moving the same
    # jobs to a slower GPU fattens the losing tail, the median barely moves.
    a100_median, a100_lose, a100_quantiles = results["A100 (solo_profiles)", SharingMode.MPS]
    assert a100_median > gavel_median and a100_lose <= gavel_lose
    assert results["same jobs on a V100 (0.55x)", SharingMode.MPS][2][0] < a100_quantiles[0]


# ----------------------------------------------------------------------------- power
def test_power_model_against_the_dcgm_series():
    with open(DATA / "telemetry" / "dcgm-series" / "run_12f6a.json") as handle:
        series = json.load(handle)
    power = np.array(series["DCGMI - Power Usage"], dtype=float)
    smact = np.array(series["DCGMI - SN Actuie"], dtype=float)  # SMACT, typo in the file
    busy = power > 150.0  # per-second power is two-level: ~78 W waiting, ~250 W running kernels
    wait_w, busy_w = float(np.median(power[~busy])), float(power[busy].mean())
    window = 120  # power is instantaneous, SMACT an interval average: compare window means
    count = len(power) // window
    power_w = power[: count * window].reshape(count, window).mean(axis=1)
    smact_w = smact[: count * window].reshape(count, window).mean(axis=1)
    busy_share_w = busy[: count * window].reshape(count, window).mean(axis=1)
    busy_per_smact = float(smact_w @ busy_share_w / (smact_w @ smact_w))
    dynamic = A100.max_power_w - A100.idle_power_w
    stored = gpu_physics.POWER_CALIBRATION
    model = np.array([gpu_physics.power_w(A100.idle_power_w, A100.max_power_w, s, has_processes=True)
                      for s in smact_w])
    rmse = float(np.sqrt(np.mean((model - power_w) ** 2)))
    print(f"\nA100 power vs DCGM run_12f6a ({count} windows of {window} s)")
    print(f"  refit: wait {wait_w:.1f} W, busy {busy_w:.1f} W, busy share {busy_per_smact:.3f} x SMACT; stored "
          f"{A100.idle_power_w + dynamic * stored.wait_level:.1f} W, "
          f"{A100.idle_power_w + dynamic * stored.busy_level:.1f} W, {stored.busy_per_smact:.3f}")
    print(f"  {'window power rmse (W)':<58} model {rmse:8.3f}  "
          f"(tolerance 6 W, {rmse / power_w.mean():.1%} of the mean)")
    assert rmse <= 6.0
    report("energy of the whole run (J)", float(model.sum() * window), float(power_w.sum() * window), 0.02)
    report("idle power before the run (W)", A100.idle_power_w, float(power[:3].min()), 0.02)
    report("busiest second vs cap (W)", A100.max_power_w, float(power.max()), 0.05)
    assert A100.idle_power_w + dynamic * stored.wait_level == pytest.approx(wait_w, abs=1.0)
    assert A100.idle_power_w + dynamic * stored.busy_level == pytest.approx(busy_w, abs=1.0)
    assert stored.busy_per_smact == pytest.approx(busy_per_smact, abs=0.01)
