"""PNG figures of a replay: what a person wants to see after a run.

A single replay is drawn beside the same trace on the same cluster with exclusive GPUs (one job
per GPU, no estimate), as the thesis' Figs. 6.13-6.15 compare exclusive with MAGM:

* ``gpu_memory.png``, ``gpu_smact.png``, ``gpu_power.png`` — per GPU over time, exclusive left,
  the chosen policy right, axes shared (so the shorter run ends earlier on the same time axis).
  Up to 8 GPUs one row per GPU; up to 16 (the simulator records per-GPU series up to there) a
  heat map, GPUs as rows;
* ``timeline.png`` — instead of those on larger clusters: jobs running and waiting over time;
* ``jct_cdf.png`` — distribution of job completion and waiting times, both runs;
* ``compare.png`` — for ``--compare``: total time and energy relative to exclusive, and OOM
  crashes, per policy x estimator run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hier_sched.common.plot_style import BASELINE, CHOSEN, HIGHLIGHT, figure_style, save

import matplotlib.pyplot as plt  # noqa: E402  (after plot_style chose the Agg backend)
from matplotlib.ticker import StrMethodFormatter  # noqa: E402

__all__ = ["Run", "plot_run", "plot_compare"]

_MAX_LINE_ROWS = 8  # more GPUs than this: a heat map, not one row of lines per GPU


@dataclass(frozen=True, slots=True)
class Run:
    """One finished replay as the figures need it: its simulator, summary and a panel label."""

    sim: object
    result: object
    label: str


def run_label(result, *, exclusive: bool = False) -> str:
    if exclusive:
        return "exclusive GPUs (one job per GPU)"
    estimate = "no estimate" if result.estimator == "none" else f"{result.estimator} estimator"
    return f"{result.policy} policy, {estimate}, {result.sharing.upper()}"


def plot_run(sim, result, out_dir: str | Path, baseline: tuple[object, object] | None = None) -> list[Path]:
    """Figures of one replay; ``baseline`` is (simulator, result) of the exclusive run of the
    same trace and cluster, drawn beside it (left)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [Run(sim, result, run_label(result))]
    if baseline is not None:
        runs.insert(0, Run(baseline[0], baseline[1], run_label(baseline[1], exclusive=True)))
    written: list[Path | None] = []
    with figure_style():
        if all(g.series is not None for r in runs for g in r.sim.cluster.all_gpus()):
            for metric in _METRICS:
                written.append(_per_gpu(runs, metric, out / f"gpu_{metric.key}.png"))
        else:
            written.append(_timeline(runs, out / "timeline.png"))
        written.append(_jct_cdf(runs, out / "jct_cdf.png"))
    return [p for p in written if p is not None]


# ---------------------------------------------------------------------------- per-GPU series
@dataclass(frozen=True, slots=True)
class _Metric:
    key: str  # file name part
    column: int  # in SimGpu.series rows (t, memory MiB, SMACT, power W)
    title: str
    unit: str
    scale: float  # series value -> plotted unit

    def ceiling(self, sim) -> tuple[float, str] | None:
        """The GPU's limit for this metric, drawn as a dotted line."""
        g = next(sim.cluster.all_gpus())
        if self.key == "memory":
            return g.device.memory_total_mib / 1024, "capacity"
        if self.key == "smact":
            return 1.0, None
        return g.device.gpu_type.max_power_w, "board limit"


_METRICS = (
    _Metric("memory", 1, "GPU memory in use", "GiB", 1 / 1024),
    _Metric("smact", 2, "SM activity (SMACT)", "fraction of time the SMs are busy", 1.0),
    _Metric("power", 3, "GPU power draw", "W", 1.0),
)


def _t0(sim) -> float:
    return min((j.trace.submit_s for j in sim.jobs.values()), default=0.0)


def _steps(g, metric: _Metric, t0: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """One GPU's step series in hours since ``t0``, closed at ``end_s``."""
    rows = np.array(g.series, dtype=float).reshape(-1, 4)
    t = np.maximum(rows[:, 0] - t0, 0.0) / 3600
    v = rows[:, metric.column] * metric.scale
    return np.append(t, (end_s - t0) / 3600), np.append(v, v[-1] if v.size else 0.0)


def _per_gpu(runs: list[Run], metric: _Metric, path: Path) -> Path | None:
    gpus = [list(r.sim.cluster.all_gpus()) for r in runs]
    n = len(gpus[0])
    if n == 0 or not any(g.series for g in gpus[0]):
        return None
    spans = [(_t0(r.sim), r.sim.makespan_end) for r in runs]
    hours = max(end - t0 for t0, end in spans) / 3600
    if hours <= 0:  # nothing ran
        return None
    title = f"{runs[-1].result.trace}: {metric.title} per GPU"
    if n > _MAX_LINE_ROWS:
        return _heatmap(runs, gpus, spans, hours, metric, title, path)
    fig, axes = plt.subplots(n, len(runs), figsize=(6.2 * len(runs), 1.0 + 1.3 * n), sharex=True, sharey=True,
                             squeeze=False)
    for col, (run, run_gpus, (t0, end)) in enumerate(zip(runs, gpus, spans)):
        colour = BASELINE if col == 0 and len(runs) > 1 else CHOSEN
        ceiling = metric.ceiling(run.sim)
        for row, g in enumerate(run_gpus):
            ax = axes[row, col]
            t, v = _steps(g, metric, t0, end)
            ax.step(t, v, where="post", color=colour, lw=1.2)
            ax.fill_between(t, v, step="post", color=colour, alpha=0.25, lw=0)
            if ceiling is not None:
                ax.axhline(ceiling[0], color="k", ls=":", lw=0.9)
            ax.axvline((end - t0) / 3600, color=colour, ls="--", lw=0.9)
            if col == len(runs) - 1:  # the right edge has no tick labels to collide with
                ax.yaxis.set_label_position("right")
                ax.set_ylabel(f"{g.node}\ngpu{g.index}", rotation=0, ha="left", va="center", fontsize=10)
        r = run.result
        axes[0, col].set_title(f"{run.label}\n{r.makespan_s / 3600:.2f} h, {r.energy_mj:.1f} MJ, {r.oom_crashes} OOM",
                               fontsize=11)
        axes[-1, col].set_xlabel("hours since the first submission")
    axes[0, 0].set_xlim(0, hours * 1.02)
    axes[0, 0].set_ylim(bottom=0)
    ceiling = metric.ceiling(runs[0].sim)
    top = max([ceiling[0] if ceiling else 0.0] + [np.max(_steps(g, metric, t0, end)[1])
                                                     for rg, (t0, end) in zip(gpus, spans) for g in rg])
    axes[0, 0].set_ylim(0, top * 1.08)
    fig.supylabel(f"{metric.title} ({metric.unit})", fontsize=11)
    note = "dashed: the run's last completion" + (f"; dotted: {ceiling[1]}" if ceiling and ceiling[1] else "")
    fig.suptitle(f"{title}\n{note}", fontsize=12)
    fig.tight_layout()
    return save(fig, path)


def _heatmap(runs, gpus, spans, hours, metric: _Metric, title: str, path: Path) -> Path:
    grid = np.linspace(0, hours, 600)
    n = len(gpus[0])
    fig, axes = plt.subplots(1, len(runs), figsize=(6.2 * len(runs), 1.8 + 0.28 * n), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")  # room for the colour bar and titles
    ceiling = metric.ceiling(runs[0].sim)
    vmax = ceiling[0] if ceiling else None
    image = None
    for ax, run, run_gpus, (t0, end) in zip(axes[0], runs, gpus, spans):
        rows = []
        for g in run_gpus:
            t, v = _steps(g, metric, t0, end)
            idx = np.clip(np.searchsorted(t, grid, "right") - 1, 0, len(v) - 1)
            rows.append(np.where(grid <= (end - t0) / 3600, v[idx], np.nan))
        image = ax.imshow(np.array(rows), aspect="auto", interpolation="nearest", cmap="cividis", vmin=0, vmax=vmax,
                          extent=(0, hours, n - 0.5, -0.5))  # cividis: readable with any colour vision
        ax.set_yticks(range(n), [f"{g.node}/gpu{g.index}" for g in run_gpus], fontsize=8)
        r = run.result
        ax.set_title(f"{run.label}\n{r.makespan_s / 3600:.2f} h, {r.energy_mj:.1f} MJ, {r.oom_crashes} OOM",
                     fontsize=11)
        ax.set_xlabel("hours since the first submission")
        ax.grid(False)
    fig.colorbar(image, ax=axes[0].tolist(), label=f"{metric.title} ({metric.unit})")
    fig.suptitle(f"{title} (blank: the run had ended)")
    return save(fig, path)


# ---------------------------------------------------------------------------- cluster timeline
def _timeline(runs: list[Run], path: Path) -> Path | None:
    fig, (ax_run, ax_wait) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, layout="constrained")
    drew = False
    for i, run in enumerate(runs):
        jobs = run.sim.jobs.values()
        starts = np.array(sorted(j.first_start_s for j in jobs if j.first_start_s is not None))
        ends = np.array(sorted(j.end_s for j in jobs if j.end_s is not None))
        submits = np.array(sorted(j.trace.submit_s for j in jobs))
        if ends.size == 0:
            continue
        drew = True
        t0 = submits.min()
        grid = np.linspace(t0, ends.max(), 800)
        running = np.searchsorted(starts, grid, "right") - np.searchsorted(ends, grid, "right")
        waiting = np.searchsorted(submits, grid, "right") - np.searchsorted(starts, grid, "right")
        style = dict(color=BASELINE, ls="--") if i == 0 and len(runs) > 1 else dict(color=CHOSEN)
        label = f"{run.label}, {run.result.makespan_s / 3600:.1f} h"
        ax_run.plot((grid - t0) / 3600, running, label=label, lw=1.4, **style)
        ax_wait.plot((grid - t0) / 3600, waiting, label=label, lw=1.4, **style)
    if not drew:
        plt.close(fig)
        return None
    ax_run.set_ylabel("jobs started, not finished")
    ax_wait.set_ylabel("jobs waiting for a first start")
    ax_wait.set_xlabel("hours since the first submission")
    fig.legend(*ax_run.get_legend_handles_labels(), loc="outside lower center", ncol=len(runs))
    fig.suptitle(f"{runs[-1].result.trace} on {runs[-1].result.gpus} GPUs: jobs over time")
    return save(fig, path)


# ---------------------------------------------------------------------------- JCT distribution
def _short(run: Run) -> str:
    return "exclusive" if run.label.startswith("exclusive") else run.result.policy


def _jct_cdf(runs: list[Run], path: Path) -> Path | None:
    fig, (ax_jct, ax_wait) = plt.subplots(1, 2, figsize=(12, 5.2), sharey=True, layout="constrained")
    stats: dict[object, list[str]] = {ax_jct: [], ax_wait: []}
    for i, run in enumerate(runs):
        done = [j for j in run.sim.jobs.values() if j.state == "done"]
        if not done:
            continue
        jct = np.array([j.end_s - j.trace.submit_s for j in done]) / 60
        wait = np.maximum(jct - np.array([j.exec_s for j in done]) / 60, 0.0)
        style = dict(color=BASELINE, ls="--") if i == 0 and len(runs) > 1 else dict(color=CHOSEN)
        frac = np.arange(1, len(done) + 1) / len(done)
        for ax, values in ((ax_jct, jct), (ax_wait, wait)):
            ax.step(np.sort(values), frac, where="post", lw=1.6, label=run.label, **style)
            stats[ax].append(f"{_short(run)}: median {np.median(values):.0f}, mean {values.mean():.0f} min")
    if not stats[ax_jct]:
        plt.close(fig)
        return None
    ax_jct.set_xscale("log")
    ax_jct.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax_jct.set_xlabel("job completion time, submission to end (min, log scale)")
    ax_jct.set_ylabel("fraction of completed jobs")
    ax_wait.set_xscale("symlog", linthresh=1)
    ax_wait.set_xlim(left=0)
    ax_wait.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax_wait.set_xlabel("time spent waiting (min; linear below 1, log above)")
    for ax, name in ((ax_jct, "completion time (JCT)"), (ax_wait, "waiting time")):
        ax.set_ylim(0, 1.02)
        ax.set_title("\n".join([name, *stats[ax]]), fontsize=11)
    fig.legend(*ax_jct.get_legend_handles_labels(), loc="outside lower center", ncol=len(runs))
    r = runs[-1].result
    fig.suptitle(f"{r.trace}: distribution over the completed jobs")
    return save(fig, path)


# ---------------------------------------------------------------------------- --compare
def plot_compare(rows: list[tuple[str, object]], out_dir: str | Path) -> Path:
    """``rows``: (label, ReplayResult); the first row is the baseline (exclusive)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = rows[0][1]
    labels = [label for label, _ in rows]
    time_ratio = [r.makespan_s / base.makespan_s if base.makespan_s else 0.0 for _, r in rows]
    energy_ratio = [r.energy_mj / base.energy_mj if base.energy_mj else 0.0 for _, r in rows]
    ooms = [r.oom_crashes for _, r in rows]
    colours = [BASELINE if i == 0 else HIGHLIGHT if label.startswith("ours") else CHOSEN
               for i, label in enumerate(labels)]
    with figure_style():
        fig, axes = plt.subplots(1, 3, figsize=(15, 0.45 * len(rows) + 1.9), sharey=True,
                                 gridspec_kw={"width_ratios": (1.2, 1.2, 0.8)})
        y = np.arange(len(rows))
        for ax, values, title, fmt in (
            (axes[0], time_ratio, "total trace time\n(x exclusive; lower is better)", "{:.2f}"),
            (axes[1], energy_ratio, "GPU energy\n(x exclusive; lower is better)", "{:.2f}"),
            (axes[2], ooms, "OOM crashes\n(count)", "{:.0f}"),
        ):
            bars = ax.barh(y, values, color=colours, height=0.7)
            for bar, v in zip(bars, values):
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + fmt.format(v), va="center",
                        fontsize=9, bbox=dict(facecolor="white", edgecolor="none", pad=0.3))
            ax.set_title(title, fontsize=11)
            ax.set_xlim(0, max(max(values), 1.0) * 1.18)
            ax.grid(axis="y", visible=False)
            if "x exclusive" in title:
                ax.axvline(1.0, color="k", lw=0.9, ls=":")
        axes[0].set_yticks(y, labels, fontsize=10)
        axes[0].invert_yaxis()
        fig.suptitle(f"{base.trace}: policies x estimators, {base.gpus} GPUs, {base.sharing}"
                     f" (exclusive: {base.makespan_s / 3600:.2f} h, {base.energy_mj:.1f} MJ)")
        fig.tight_layout()
        return save(fig, out / "compare.png")
