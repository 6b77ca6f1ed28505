"""Live, on a 3-node x 1-GPU emulated Ray cluster started with real `ray start` processes: a real
PyTorch DDP gang across two nodes, a real training job preempted at the end of its time slot and
resumed where it stopped, one moved off a drained node the same way, and a worker node taken away
while its job runs.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from hier_sched.front.connection import connect
from hier_sched.front.deploy import start_cluster, stop_cluster
from hier_sched.front.local_cluster import ClusterConfig, kill_local_node
from tests.helpers.cli_cluster import hs, job_status, submit_spec

SCALE = 0.01  # 1 wall second = 100 emulated seconds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("hs_gangs")
    env = {**os.environ, "HIER_SCHED_STATE_DIR": str(state), "RAY_AUTH_MODE": "disabled"}
    record = start_cluster(ClusterConfig(nodes=3, gpus_per_node=1, time_scale=SCALE, policy="auto", backend="emulated"),
                           directory=state)
    try:
        yield state, env, record
    finally:
        stop_cluster(state)


def test_a_real_ddp_gang_over_two_nodes_rendezvous_all_reduces_and_learns(cluster, tmp_path):
    _, env, _ = cluster
    job = submit_spec(env, tmp_path, "ddp", command=[sys.executable, "examples/ddp_train.py", "--steps", "40"],
                      gpus=2, gpus_per_node=1, memory_mib=2000)
    assert hs(env, "wait", job, "--timeout", "240").returncode == 0, (job_status(env, job), hs(env, "logs", job).stdout)
    record = job_status(env, job)
    assert len(record["ranks"]) == 2 and len({r["node"] for r in record["ranks"]}) == 2, record
    log = hs(env, "logs", job).stdout
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(rf"rank {rank} step \d+ loss ([\d.]+)", log)]
        assert len(losses) >= 4 and losses[-1] < losses[0] / 3, (rank, losses)
        assert f"rank {rank}: weights identical on every rank" in log
    assert "WORLD_SIZE" not in log and "rank 0 of 2" in log and "rank 1 of 2" in log


def test_a_real_training_job_preempted_at_its_slots_end_resumes_where_it_stopped(cluster, tmp_path):
    _, env, _ = cluster
    job = submit_spec(env, tmp_path, "slotted",
                      command=[sys.executable, "examples/train_checkpointed.py", "--steps", "1000000"], gpus=1,
                      memory_mib=3000, checkpoint_dir=str(tmp_path / "ckpt"),
                      slot={"length_s": 1500, "grace_s": 500})  # signalled 10 s (wall) into each 15 s slot
    deadline = time.time() + 300
    log = ""
    while time.time() < deadline:  # until it was preempted, checkpointed, and resumed for some steps
        log = hs(env, "logs", job).stdout
        resumed = re.search(r"resuming at step (\d+)", log)
        if resumed and re.search(rf"^step {int(resumed.group(1)) + 20} loss", log, re.M):
            break
        time.sleep(1)
    hs(env, "cancel", job)
    record = job_status(env, job)
    assert record["checkpoints"] >= 1 and record["preemptions"] >= 1, record
    saved = int(re.search(r"checkpoint signal: saved after step (\d+)", log).group(1))
    assert int(re.search(r"resuming at step (\d+)", log).group(1)) == saved + 1  # right after the save
    done = [int(s) for s in re.findall(r"^step (\d+) loss", log, re.M)]
    first_run, second_run = done[: done.index(saved) + 1], done[done.index(saved) + 1:]
    assert first_run == list(range(1, saved + 1)) and second_run[:20] == list(range(saved + 1, saved + 21))


def test_drain_moves_a_real_training_job_off_its_node_after_a_checkpoint_and_nothing_new_lands_there(cluster, tmp_path):
    state, env, _ = cluster
    job = submit_spec(env, tmp_path, "drained",
                      command=[sys.executable, "examples/train_checkpointed.py", "--steps", "1000000"], gpus=1,
                      memory_mib=3000, checkpoint_dir=str(tmp_path / "ckpt"))
    deadline = time.time() + 120
    while not re.search(r"^step 50 loss", hs(env, "logs", job).stdout, re.M) and time.time() < deadline:
        time.sleep(0.5)
    node = job_status(env, job)["node"]
    drained = hs(env, "drain", node, "--reason", "kernel upgrade")
    assert drained.returncode == 0 and f"{node}: draining: takes no new job; 1 job(s) still there ({job})" in drained.stdout
    newcomers = [submit_spec(env, tmp_path, f"new{i}", command=["true"], gpus=1, memory_mib=30000,
                             emulation={"peak_mib": 30000, "duration_s": 500, "smact": 0.2}) for i in range(2)]
    log = ""
    while not re.search(r"resuming at step \d+", log) and time.time() < deadline + 120:
        time.sleep(0.5)
        log = hs(env, "logs", job).stdout
    assert hs(env, "wait", *newcomers, "--timeout", "120").returncode == 0
    hs(env, "cancel", job)
    record = job_status(env, job)
    assert record["checkpoints"] == 1 and record["node"] != node, record
    assert f"node {node} drains (kernel upgrade)" in json.dumps(connect(state).call("history", job))
    saved = int(re.search(r"checkpoint signal: saved after step (\d+)", log).group(1))
    assert int(re.search(r"resuming at step (\d+)", log).group(1)) == saved + 1
    assert all(job_status(env, j)["node"] != node for j in newcomers)
    nodes = {n["name"]: n["state"] for n in json.loads(hs(env, "info", "--json").stdout)["nodes"]}
    assert nodes[node] == "drained" and list(nodes.values()).count("active") == 2, nodes
    assert hs(env, "undrain", node).returncode == 0
    assert json.loads(hs(env, "info", "--json").stdout)["nodes"] and all(
        n["state"] == "active" for n in json.loads(hs(env, "info", "--json").stdout)["nodes"])


def test_a_job_on_a_worker_node_that_dies_is_requeued_and_finishes_elsewhere(cluster, tmp_path):
    state, env, record = cluster
    # more than half a 40 GB GPU each: no two share one, so each of the three nodes runs one (at
    # 4,000 MiB the packing policy may put all three on node0 and node1, and none on node2)
    jobs = [submit_spec(env, tmp_path, f"long{i}", command=["true"], gpus=1, memory_mib=24000,
                         emulation={"peak_mib": 24000, "duration_s": 3000, "smact": 0.2}) for i in range(3)]
    deadline = time.time() + 60
    while time.time() < deadline:
        placed = {j: job_status(env, j) for j in jobs}
        if all(s["state"] == "running" for s in placed.values()):
            break
        time.sleep(0.5)
    assert {s["node"] for s in placed.values()} == {"node0", "node1", "node2"}, placed
    victim = next(j for j, s in placed.items() if s["node"] == "node2")
    kill_local_node(record.local_ray, 2, state / "nodes" / "node2")
    assert hs(env, "wait", *jobs, "--timeout", "240").returncode == 0, [job_status(env, j) for j in jobs]
    final = job_status(env, victim)
    assert final["attempts"] == 2 and final["node"] != "node2" and final["lost_runs"] == 1, final
    history = json.loads(hs(env, "status", "--json").stdout)
    assert len([j for j in history if j["name"] == final["name"]]) == 1  # requeued, not duplicated
