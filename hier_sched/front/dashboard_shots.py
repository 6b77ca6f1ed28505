"""``hier-sched dashboard-shots``: photographs of the Ray dashboard showing scheduled jobs.

Starts a local emulated cluster (2 nodes x 2 A100-40GB, time x0.01) in a temporary state
directory, submits a small scenario -- a short job that succeeds, one that exits 3 (a true
failure), five long jobs (four take a GPU each, the fifth joins one of them), then one too big
for any GPU while they run (queued, with a reason) -- waits until the picture is complete, and
has headless Chromium (``chromium --headless --screenshot``, Debian's package) save the
dashboard's Overview, Jobs and job-detail pages as PNGs. The job-detail page is the
scheduler's Ray job (``control``): its tasks are the jobs' attempts, its log tells what happened
to each job. Each page is also dumped as DOM text and checked for what it must show, so a page
that did not render fails the command instead of leaving an empty picture. Then ``down``.

    hier-sched dashboard-shots --out docs/img

docs/dashboard.md shows two of them.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

__all__ = ["dashboard_shots", "take_shots"]

_WINDOW = (1600, 1000)
_TALL_WINDOW = (1600, 2200)  # the job-detail page: its task table is below the log
_RENDER_BUDGET_MS = 20000  # Chromium's virtual time: the dashboard's requests land within it
_LONG_S = 60000.0  # emulated seconds: 10 min of wall clock at x0.01, longer than taking the pictures
_LONG = ("resnet50-bs64", "bert-base", "vit-small", "gpt2-small", "mobilenet-v3")


def _scenario() -> list[dict[str, Any]]:
    """The jobs: names say what each is for."""
    def job(name: str, peak: float, duration_s: float, command: list[str], gpus: int = 1) -> dict[str, Any]:
        return {"name": name, "command": command, "gpus": gpus, "memory_mib": peak, "estimator": "none",
                "emulation": {"peak_mib": peak, "duration_s": duration_s, "smact": 0.3}}

    ok = ["python", "-c", "print('training (emulated)')"]
    return [job("short-eval", 3000, 300, ok),
            job("exits-3", 3000, 300, ["python", "-c", "import sys; print('giving up'); sys.exit(3)"]),
            *(job(name, peak, _LONG_S, ok) for name, peak in zip(_LONG, (7106, 12000, 9000, 10000, 4000)))]


_TOO_BIG = {"name": "llama-7b-ft", "command": ["python", "-c", "print('fine-tuning (emulated)')"], "gpus": 1,
            "memory_mib": 38000, "estimator": "none", "emulation": {"peak_mib": 38000, "duration_s": 600, "smact": 0.5}}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise click.ClickException("no chromium on PATH: `apt-get install --no-install-recommends chromium`")
    return found


def _page(chromium: str, url: str, *, screenshot: Path | None, window: tuple[int, int] = _WINDOW) -> str:
    """The page's text after rendering (its DOM without tags: the log viewer colours numbers in
    spans of their own); with ``screenshot``, also a PNG of it."""
    profile = tempfile.mkdtemp(prefix="hs-chromium-")
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", f"--virtual-time-budget={_RENDER_BUDGET_MS}"]
    try:
        if screenshot is not None:
            subprocess.run([*argv, f"--screenshot={screenshot}", url], check=True, capture_output=True, timeout=120)
        dom = subprocess.run([*argv, "--dump-dom", url], check=True, capture_output=True, text=True,
                             timeout=120).stdout
        return html.unescape(re.sub(r"<[^>]*>", "", dom))
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _wait_for(scheduler: Any, ids: dict[str, str], wanted: dict[str, str], timeout_s: float = 300.0) -> None:
    """Until each job named in ``wanted`` is in that state."""
    deadline = time.time() + timeout_s
    while True:
        states = scheduler.call("states", list(ids.values()))
        by_name = {name: states[job_id] for name, job_id in ids.items()}
        if all(by_name[name] == state for name, state in wanted.items()):
            return
        if time.time() > deadline:
            raise click.ClickException(f"the scenario did not reach its picture within {timeout_s:.0f} s: {by_name}")
        time.sleep(1.0)


def _submit(scheduler: Any, specs: list[dict[str, Any]], ids: dict[str, str]) -> None:
    for spec in specs:
        answer = scheduler.submit(spec)
        if "error" in answer:
            raise click.ClickException(f"{spec['name']}: {answer['error']}")
        ids[spec["name"]] = answer["job_id"]


def take_shots(out: Path) -> list[Path]:
    """Run the scenario and write the PNGs to ``out``; returns their paths."""
    from hier_sched.front.connection import connect, disconnect
    from hier_sched.front.deploy import start_cluster, stop_cluster
    from hier_sched.front.local_cluster import ClusterConfig

    chromium = _chromium()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hs-shots-") as tmp:
        state = Path(tmp)
        record = start_cluster(ClusterConfig(nodes=2, gpus_per_node=2, time_scale=0.01),
                               directory=state)
        try:
            scheduler = connect(state, command="hier-sched dashboard-shots")
            ids: dict[str, str] = {}
            _submit(scheduler, _scenario(), ids)
            _wait_for(scheduler, ids, {"short-eval": "succeeded", "exits-3": "failed", **dict.fromkeys(_LONG, "running")})
            _submit(scheduler, [_TOO_BIG], ids)
            time.sleep(3)  # a few ticks: it was looked at, and has its reason
            _wait_for(scheduler, ids, {"llama-7b-ft": "queued", **dict.fromkeys(_LONG, "running")})
            base = record.dashboard_url
            pages = {"overview": (f"{base}/#/overview", ["GPU", "hs_node0_gpu0_mem_mib"], _WINDOW),
                     "jobs": (f"{base}/#/jobs", [str(record.scheduler_job)], _WINDOW),
                     # its log: what happened to each job, and why the last one waits (control.Narrator)
                     "job-detail": (f"{base}/#/jobs/{record.scheduler_job}",
                                    [f"{ids['exits-3']} failed", f"{ids['short-eval']} succeeded",
                                     f"{ids['resnet50-bs64']} running", f"{ids['llama-7b-ft']} queued"],
                                    _TALL_WINDOW)}
            written = []
            for name, (url, must_show, window) in pages.items():
                png = out / f"dashboard-{name}.png"
                text = _page(chromium, url, screenshot=png, window=window)
                if missing := [m for m in must_show if m not in text]:
                    raise click.ClickException(f"the {name} page ({url}) does not show {missing}; see {png}")
                written.append(png)
            return written
        finally:
            disconnect()
            stop_cluster(state)


@click.command("dashboard-shots")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/dashboard"),
              show_default=True, help="where the PNGs go")
def dashboard_shots(out: Path) -> None:
    """Screenshots of the Ray dashboard (Overview, Jobs, job detail) with scheduled jobs on it.

    Starts its own local emulated cluster (2 nodes x 2 GPUs) and stops it; needs Debian's
    chromium. See docs/dashboard.md.
    """
    for png in take_shots(out):
        click.echo(png)


if __name__ == "__main__":
    sys.exit(dashboard_shots())
