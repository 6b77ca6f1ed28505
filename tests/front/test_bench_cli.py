"""Every ``hier-sched bench`` command runs at a small size and reports what it measured, with
``--json`` as JSON alone on standard output (no figures are asserted: measurements go to
BENCHMARKS.md). ``bench chaos`` runs in tests/ray_clusters/test_chaos.py, ``bench control-plane`` (which
starts Ray) in tests/ray_clusters/test_node_set.py; ``bench estimates`` needs a running cluster: it runs
in tests/ray_clusters/test_live_estimating.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner

from hier_sched.front.bench.cli import bench
from hier_sched.front.cli import main


@pytest.mark.parametrize("queues", [[], ["--team-queues", "3"]], ids=["one queue", "team queues"])
def test_bench_decide_reports_its_decisions_at_a_small_size(queues):
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "16", "--queued", "40", "--repeat", "25",
                                       "--warmup", "600", *queues, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["decisions"] == 25 and figures["queued"] == 40 and figures["nodes"] == 2
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["gpus_busy"] > 0 and not figures["supply_exhausted"]
    assert "Scheduler.step" in figures["what"]


BENCHES = ("chaos", "control-plane", "decide", "dispatch", "estimates", "gpu-model", "queue", "robustness", "simulator", "traces", "wal")


def test_every_bench_is_a_command_of_the_group():
    assert set(bench.commands) == set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_each_bench_explains_its_options(name):
    result = CliRunner().invoke(main, ["bench", name, "--help"])
    assert result.exit_code == 0 and "--json" in result.output, result.output


SMALL_RUNS = {  # the bench's arguments at a small size, and what its JSON must hold
    "wal": (["wal", "--records", "20", "--fsync-sample", "5", "--repeats", "1"],
            lambda r: [run["records"] for run in r["runs"]] == [20]),
    "queue restart": (["queue", "restart", "--jobs", "30", "--jobs", "60", "--repeat", "1"],
                      lambda r: [row["jobs"] for row in r] == [30, 60]),
    "queue memory": (["queue", "memory", "--jobs", "30"], lambda r: r["queued_after_restart"] == 30),
    "simulator": (["simulator", "--jobs", "400"], lambda r: r[0]["jobs"] == 400 and r[0]["events"] > 0),
    "robustness": (["robustness", "--trace", "carma:philly_mix-90-tasks", "--seeds", "1"],
                   lambda r: r[0]["trace"] == "carma:philly_mix-90-tasks" and len(r[0]["ours_to_oracle_magm"]) == 1),
    "traces": (["traces", "carma:philly_mix-90-tasks"],
               lambda r: r["traces"][0]["jobs"] == 90 and r["import_traces_s"] > 0),
    "gpu-model": (["gpu-model", "--residents", "2", "--repeat", "1"], lambda r: r["us_per_call"]["sample()"] > 0),
}


@pytest.mark.parametrize("args, check", SMALL_RUNS.values(), ids=SMALL_RUNS)
def test_each_bench_prints_only_json_with_json(args, check):
    result = CliRunner().invoke(main, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    assert check(json.loads(result.stdout))


def test_bench_decide_refuses_gpus_that_do_not_split_into_nodes():
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "12", "--nodes-of", "8", "--json"])
    assert result.exit_code == 2 and "--gpus" in result.output and "nodes of 8" in result.output


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)  # its own cluster, and the command may take 600 s
def test_bench_dispatch_runs_both_paths_on_its_own_cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([str(Path(sys.executable).with_name("hier-sched")), "bench", "dispatch", "--jobs", "6",
                           "--gpus-per-node", "1", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout)
    assert figures["states"] == {"succeeded": 6} and figures["gpus"] == 2
    assert figures["hier_sched_s"] > 0 and figures["plain_ray_s"] > 0
    assert abs(figures["ratio"] - figures["hier_sched_s"] / figures["plain_ray_s"]) < 0.01
    # where the scheduler's time went: its actors, the fork servers, Ray's workers holding the jobs
    assert figures["ray_workers_started"]["hier_sched"] >= 1
    assert {"ray::GlobalQueue", "ray::NodeActor", "python -m node_actor.fork_server"} <= set(figures["hier_sched_cpu_s"])


@pytest.mark.parametrize("cmdline,kind", [
    (["ray::IDLE"], "ray::IDLE"), (["ray::NodeActor(node0: 4x A100-40GB emulated).exchange"], "ray::NodeActor"),
    (["ray::NodeActor.exchange"], "ray::NodeActor"),  # a method running: its kind is its actor's
    (["/usr/bin/raylet", "--node_ip_address=x"], "raylet"),
    (["/venv/bin/python3", "-m", "node_actor.fork_server", "--directory", "d"], "python -m node_actor.fork_server"),
    (["/venv/bin/python", "/venv/lib/ray/_private/log_monitor.py", "--x"], "python log_monitor.py"), ([], "?")])
def test_dispatch_names_each_kind_of_process_it_counts_cpu_for(cmdline, kind):
    from hier_sched.front.bench.dispatch import _kind

    assert _kind(cmdline) == kind
