"""Predicted vs measured peak memory, per model family (``hier-sched estimators evaluate --plots DIR``).

One PNG per family, one panel per estimator, axes shared: the measured peak (the truth) across,
the estimate up; the line y = x and a +-10 % band around it, so an estimator's misses read at a
glance (under the band: the job would be placed with too little memory; above: GPU memory wasted).
Axes turn logarithmic where the values span more than a factor of 20.

The families are the data ``evaluate`` scores:

* ``estimates_mlp.png``, ``estimates_cnn.png`` — GPUMemNet's synthetic MLPs and CNNs, held-out
  20 % (``data.split_of``); CNN rows that crashed with OOM have no measured peak and are left out;
* ``estimates_transformer.png`` — the thesis' transformer workloads (BERT, GPT-2, XLNet), measured
  on an A100-40GB (the shared data has no GPUMemNet transformer rows with measured labels);
* ``estimates_real.png`` — the thesis' other real workloads (CNNs, DLRM, Mask R-CNN).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hier_sched.common.plot_style import CHOSEN, HIGHLIGHT, OKABE_ITO, figure_style, save

import matplotlib.pyplot as plt  # noqa: E402  (after plot_style chose the Agg backend)
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, StrMethodFormatter  # noqa: E402

__all__ = ["Family", "evaluation_families", "plot_families", "write_evaluation_plots"]

BAND = 0.10  # the +-10 % band drawn around y = x
_TRANSFORMER_FAMILIES = ("bert", "gpt2", "xlnet")  # workload family name prefixes


@dataclass(frozen=True, slots=True)
class Family:
    """Measured peaks of one family and each estimator's values for the same rows (MiB)."""

    key: str  # file name part
    title: str
    measured_mib: np.ndarray
    estimates_mib: dict[str, np.ndarray]
    failed_mib: float | None = None  # a recorded "estimator failed" value, drawn apart
    note: str = ""  # what was left out, and why
    labels: list[str] = field(default_factory=list)  # per row, for families small enough to name points


def evaluation_families() -> list[Family]:
    """The rows ``evaluate`` scores, per family, with every estimator's values."""
    return [_gpumemnet("mlp"), _gpumemnet("cnn"), *_real_workloads()]


def _gpumemnet(kind: str) -> Family:
    from estimators.data import load_kind
    from estimators.features import LayerTable, feature_matrix
    from estimators.formulas import horus_memory
    from estimators.ml import predict_rows

    rows, _ = load_kind(kind)
    held_out = [r for r in rows if r.split == "test"]
    test = [r for r in held_out if r.fits]
    pred = predict_rows(kind, feature_matrix(LayerTable.from_descriptions([r.description for r in test])))
    oom = len(held_out) - len(test)
    return Family(
        kind, f"GPUMemNet synthetic {kind.upper()}s, held-out rows",
        np.array([r.peak_mib for r in test]),
        {"Horus (formula)": np.array([horus_memory(r.description).peak_mib for r in test]),
         "GPUMemNet-style buckets (upper edge)": pred.bucket_mib,
         "ours ML (point)": pred.point_mib,
         "ours ML (safe: reserved)": pred.high_mib},
        note=f"{oom} rows that crashed with OOM have no measured peak: not shown" if oom else "",
    )


def _real_workloads() -> list[Family]:
    from estimators.evaluate import _workload_rows
    from estimators.workloads import FAILED_MIB, canonical_workload, estimate_for_workload

    rows = _workload_rows()
    recorded = {"Horus (thesis)": "horus_est_mib", "FakeTensor (thesis)": "faketensor_est_mib",
                "GPUMemNet (thesis)": "gpumemnet_est_mib"}
    families = []
    for key, title, keep in (
        ("transformer", "Transformer workloads of the thesis traces (BERT, GPT-2, XLNet)", True),
        ("real", "Other real workloads of the thesis traces (CNNs, DLRM, Mask R-CNN)", False),
    ):
        chosen = [r for r in rows if canonical_workload(r["rad_file"]).family.startswith(_TRANSFORMER_FAMILIES) == keep]
        estimates = {name: np.array([float(r[column]) for r in chosen]) for name, column in recorded.items()}
        estimates["ours (auto)"] = np.array([
            estimate_for_workload(r["rad_file"], int(r["batch_size"]),
                                  {"horus": float(r["horus_est_mib"]), "faketensor": float(r["faketensor_est_mib"]),
                                   "gpumemnet": float(r["gpumemnet_est_mib"])}).peak_mib for r in chosen])
        families.append(Family(key, title + ", measured on an A100-40GB",
                               np.array([float(r["oracle_peak_mem_mib"]) for r in chosen]), estimates,
                               failed_mib=float(FAILED_MIB),
                               labels=[f"{canonical_workload(r['rad_file']).family}@{r['batch_size']}" for r in chosen]))
    return families


def write_evaluation_plots(out_dir: str | Path) -> list[Path]:
    return plot_families(evaluation_families(), out_dir)


def plot_families(families: list[Family], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with figure_style():
        return [_plot_family(f, out / f"estimates_{f.key}.png") for f in families if f.measured_mib.size]


def _axis_range(measured: np.ndarray) -> tuple[float, float, bool]:
    """(low, high, log) around the measured values: an estimator's wild misses must not squash
    the others' panels, so the scale follows the truth and misses beyond it sit on the edge."""
    low, high = float(measured.min()), float(measured.max())
    if high / max(low, 1.0) > 20:
        return low / 3, high * 3, True
    return 0.0, high * 1.5, False


def _plot_family(family: Family, path: Path) -> Path:
    names = list(family.estimates_mib)
    true = family.measured_mib
    lo, hi, log = _axis_range(true)
    fig, axes = plt.subplots(1, len(names), figsize=(4.1 * len(names), 5.2), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    line = np.geomspace(lo, hi, 200) if log else np.linspace(lo, hi, 200)
    many = true.size > 100
    for i, (ax, name) in enumerate(zip(axes[0], names)):
        pred = family.estimates_mib[name]
        failed = pred >= family.failed_mib if family.failed_mib is not None else np.zeros(pred.size, bool)
        above, below = ~failed & (pred > hi), ~failed & (pred < lo)
        shown = ~failed & ~above & ~below
        colour = HIGHLIGHT if name.startswith("ours") else CHOSEN
        ax.fill_between(line, line * (1 - BAND), line * (1 + BAND), color="#bbbbbb", alpha=0.5, lw=0,
                        label=f"within ±{BAND:.0%} of measured")
        ax.plot(line, line, color="k", lw=1.0, label="estimate = measured")
        ax.scatter(true[shown], pred[shown], s=9 if many else 32, alpha=0.35 if many else 0.9, color=colour,
                   edgecolors="none" if many else "white", linewidths=0.5, zorder=3,
                   label="our estimate" if name.startswith("ours") else "another estimator's estimate")
        edge_top, edge_bottom = (hi / 1.06, lo * 1.06) if log else (hi - 0.012 * hi, lo + 0.012 * hi)
        for mask, y, marker, label in ((above, edge_top, "^", "estimate above the scale"),
                                       (below, edge_bottom, "v", "estimate below the scale")):
            if mask.any():
                ax.scatter(true[mask], np.full(mask.sum(), y), s=22, marker=marker, color=OKABE_ITO[4],
                           alpha=0.6, edgecolors="none", label=label, zorder=4, clip_on=False)
        if failed.any():
            ax.scatter(true[failed], np.full(failed.sum(), min(family.failed_mib, edge_top)), s=45, marker="x",
                       color=OKABE_ITO[3], zorder=4, clip_on=False,
                       label=f"estimator failed ({family.failed_mib:.0f} MiB: the whole GPU)")
        ratio = pred / true
        stats = f"±{BAND:.0%}: {np.mean(np.abs(ratio - 1) <= BAND):.0%} · under by >{BAND:.0%}: {np.mean(ratio < 1 - BAND):.0%}"
        apart = ", ".join(f"{n} {what}" for n, what in ((int(above.sum() + below.sum()), "off the scale"),
                                                         (int(failed.sum()), "failed")) if n)
        ax.set_title(f"{name}\n{stats}\n{apart}", fontsize=11)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain MiB numbers, few enough not to collide
            axis.set_major_locator(LogLocator(subs=(1, 3)) if log else MaxNLocator(4))
            axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured peak (MiB)")
        if i == 0:
            ax.set_ylabel("estimated peak (MiB)")
    handles: dict[str, object] = {}
    for ax in axes[0]:  # one legend for the figure: every kind of mark once
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(len(handles), 3),
               fontsize=10, markerscale=1.5)
    scale = "log axes" if log else "linear axes"
    fig.suptitle(f"{family.title}: {true.size} rows, {scale}" + (f"\n{family.note}" if family.note else ""))
    return save(fig, path)
