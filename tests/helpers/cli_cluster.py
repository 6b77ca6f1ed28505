"""An emulated cluster started the way a user starts one (``hier-sched up``), in a private state
directory, and stopped with ``hier-sched down`` whatever happens: for the live tests that drive
the command line, the dashboard or Prometheus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from conftest import ROOT

HS = str(Path(sys.executable).parent / "hier-sched")


@contextmanager
def cli_cluster(state_dir: Path, *, nodes: int = 0, gpus_per_node: int = 0, node_specs: tuple[str, ...] = (),
                **env_extra: str) -> Iterator[dict[str, Any]]:
    """Yields ``{"env": the environment to run hier-sched and ray in, "info": hier-sched info --json}``.
    The nodes: ``nodes`` x ``gpus_per_node``, or one per ``node_specs`` entry (``up --node TYPE:N``).
    ``env_extra`` (e.g. ``RAY_metrics_report_interval_ms``) is inherited by ``ray start``. The
    environment names no ``RAY_ADDRESS``: a caller that sets one for its probes does so on a copy."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HIER_SCHED_STATE_DIR")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HIER_SCHED_STATE_DIR=str(state_dir), **env_extra)
    try:
        shape = ([arg for spec in node_specs for arg in ("--node", spec)] if node_specs
                 else ["--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node)])
        up = subprocess.run([HS, "up", "--emulated", *shape, "--time-scale", "0.01"], env=env, capture_output=True,
                            text=True, timeout=400)
        assert up.returncode == 0, up.stdout + up.stderr
        info = subprocess.run([HS, "info", "--json"], env=env, capture_output=True, text=True, timeout=120)
        yield {"env": env, "info": json.loads(info.stdout)}
    finally:
        subprocess.run([HS, "down"], env=env, capture_output=True, timeout=180)


def hs(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``hier-sched ARGS`` as a user runs it."""
    return subprocess.run([HS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def submit_spec(env: dict[str, str], directory: Path, name: str, *, workdir: Path = ROOT, **fields: Any) -> str:
    """Write a spec (``estimator: none`` and the repository as its workdir unless ``fields`` say
    otherwise) and submit it; its job id."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "estimator": "none", "workdir": str(workdir), **fields}))
    proc = hs(env, "submit", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def job_status(env: dict[str, str], job_id: str) -> dict[str, Any]:
    return json.loads(hs(env, "status", job_id, "--json").stdout)
