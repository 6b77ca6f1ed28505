"""PNG figures of a replay: what a person wants to see after a run.

* ``timeline.png`` — per-GPU memory in use and SMACT over time (small clusters), or the
  cluster's running jobs and queue length over time (large clusters);
* ``jct.png`` — distribution of waiting and completion times;
* ``compare.png`` — for ``--compare``: total time, energy and OOM crashes per policy, relative
  to exclusive.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_run", "plot_compare"]


def plot_run(sim, result, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_timeline(sim, result, out / "timeline.png"), _jct(sim, result, out / "jct.png")]
    return [p for p in written if p is not None]


def _timeline(sim, result, path: Path) -> Path | None:
    gpus = list(sim.cluster.all_gpus())
    title = f"{result.trace} — {result.policy} + {result.estimator} ({result.sharing})"
    if gpus and gpus[0].series is not None:
        fig, (ax_mem, ax_sm) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
        for g in gpus:
            if not g.series:
                continue
            t, mem, smact, _ = (np.array(c) for c in zip(*g.series))
            label = f"{g.node}/gpu{g.index}"
            ax_mem.step(t / 3600, mem / 1024, where="post", label=label, lw=1)
            ax_sm.step(t / 3600, smact, where="post", label=label, lw=1)
        cap = gpus[0].device.memory_total_mib / 1024
        ax_mem.axhline(cap, color="k", ls=":", lw=0.8)
        ax_mem.set_ylabel("GPU memory used (GiB)")
        ax_sm.set_ylabel("SMACT (aggregate)")
        ax_sm.set_ylim(0, 1.02)
        ax_sm.set_xlabel("time since first submission (h)")
        ax_mem.legend(ncol=4, fontsize=8, loc="upper right")
        ax_mem.set_title(title)
    else:
        starts = np.array(sorted(j.first_start_s for j in sim.jobs.values() if j.first_start_s is not None))
        ends = np.array(sorted(j.end_s for j in sim.jobs.values() if j.end_s is not None))
        submits = np.array(sorted(j.trace.submit_s for j in sim.jobs.values()))
        if ends.size == 0:
            return None
        grid = np.linspace(submits.min(), ends.max(), 800)
        running = np.searchsorted(starts, grid, "right") - np.searchsorted(ends, grid, "right")
        waiting = np.searchsorted(submits, grid, "right") - np.searchsorted(starts, grid, "right")
        fig, ax = plt.subplots(figsize=(11, 4.5))
        ax.plot(grid / 3600, running, label="started, not finished")
        ax.plot(grid / 3600, waiting, label="waiting for first start")
        ax.set_xlabel("time (h)")
        ax.set_ylabel("jobs")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _jct(sim, result, path: Path) -> Path | None:
    done = [j for j in sim.jobs.values() if j.state == "done"]
    if not done:
        return None
    jct = np.array([j.end_s - j.trace.submit_s for j in done]) / 60
    wait = jct - np.array([j.exec_s for j in done]) / 60
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for data, label in ((wait, "waiting"), (jct, "completion (JCT)")):
        xs = np.sort(data)
        ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=f"{label}: mean {data.mean():.0f} min")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("minutes")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{result.trace} — {result.policy} + {result.estimator}: {result.oom_crashes} OOM crashes")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(rows: list[tuple[str, object]], out_dir: str | Path) -> Path:
    """``rows``: (label, ReplayResult); the first row is the baseline (exclusive)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = rows[0][1]
    labels = [label for label, _ in rows]
    time_ratio = [r.makespan_s / base.makespan_s for _, r in rows]
    energy_ratio = [r.energy_mj / base.energy_mj if base.energy_mj else 0 for _, r in rows]
    ooms = [r.oom_crashes for _, r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 0.42 * len(rows) + 1.6), sharey=True)
    y = np.arange(len(rows))
    for ax, values, title, fmt in (
        (axes[0], time_ratio, "total trace time vs exclusive", "{:.2f}"),
        (axes[1], energy_ratio, "GPU energy vs exclusive", "{:.2f}"),
        (axes[2], ooms, "OOM crashes", "{:.0f}"),
    ):
        bars = ax.barh(y, values, color=["#888" if i == 0 else "#3b7dd8" for i in range(len(rows))])
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + fmt.format(v), va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        if "vs" in title:
            ax.axvline(1.0, color="k", lw=0.8, ls=":")
    axes[0].set_yticks(y, labels, fontsize=9)
    axes[0].invert_yaxis()
    fig.suptitle(f"{base.trace}: policies x estimators ({base.sharing}, {base.gpus} GPUs)")
    fig.tight_layout()
    path = out / "compare.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
