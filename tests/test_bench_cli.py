"""``hier-sched bench decide`` and ``bench dispatch`` run at a small size and report what they
measured (no figures are asserted: measurements go to BENCHMARKS.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner

from hier_sched.front.cli import main


def test_bench_decide_reports_its_decisions_at_a_small_size():
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "16", "--queued", "40", "--repeat", "25",
                                       "--warmup", "600", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["decisions"] == 25 and figures["queued"] == 40 and figures["nodes"] == 2
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["gpus_busy"] > 0 and not figures["supply_exhausted"]
    assert "Scheduler.step" in figures["what"]


def test_bench_decide_refuses_gpus_that_do_not_split_into_nodes():
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "12", "--nodes-of", "8", "--json"])
    assert result.exit_code == 2 and "--gpus" in result.output and "nodes of 8" in result.output


@pytest.mark.ray
def test_bench_dispatch_runs_both_paths_on_its_own_cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([str(Path(sys.executable).with_name("hier-sched")), "bench", "dispatch", "--jobs", "6",
                           "--gpus-per-node", "1", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout)
    assert figures["states"] == {"succeeded": 6} and figures["gpus"] == 2
    assert figures["hier_sched_s"] > 0 and figures["plain_ray_s"] > 0
    assert abs(figures["ratio"] - figures["hier_sched_s"] / figures["plain_ray_s"]) < 0.01
