"""Live: the head of a 2-node emulated cluster (started with `hier-sched up`, GCS fault tolerance
on a Redis of the test's own) is killed as a machine that dies and started again on the same
ports, as Kubernetes restarts a head pod. The worker's job runs on through it and keeps its
progress; the head's own job is requeued; the queue comes back from its log on the new head;
nothing is lost or run twice (docs/cluster.md, "When the head restarts"). Then Ray itself drains a
node, as its autoscaler or KubeRay does on a spot node's notice: the queue drains it too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hier_sched.front.deploy import restart_head
from hier_sched.front.local_cluster import free_port
from tests.helpers.cli_cluster import cli_cluster, hs, job_status, submit_spec

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="Debian's redis-server is not installed "
                                "(`apt-get install --no-install-recommends redis-server`, README set-up)")


@pytest.fixture(scope="module")
def redis_address(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("redis") / "redis.log", "w")
    process = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_address):
    state = tmp_path_factory.mktemp("hs_head")
    with cli_cluster(state, nodes=2, gpus_per_node=1, RAY_REDIS_ADDRESS=redis_address) as c:
        yield state, c["env"]


def test_a_head_restart_keeps_the_workers_jobs_and_their_progress_and_loses_nothing(cluster, tmp_path, monkeypatch):
    state, env = cluster
    jobs = [submit_spec(env, tmp_path, f"long{i}", command=["true"], gpus=1, memory_mib=30000,
                        emulation={"peak_mib": 30000, "duration_s": 6000, "smact": 0.2}) for i in range(2)]
    deadline = time.time() + 60
    while not all((placed := {j: job_status(env, j) for j in jobs})[j]["state"] == "running" for j in jobs):
        assert time.time() < deadline, placed
        time.sleep(0.5)
    on_head = next(j for j, s in placed.items() if s["node"] == "node0")
    on_worker = next(j for j, s in placed.items() if s["node"] == "node1")
    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(state))
    monkeypatch.setenv("RAY_REDIS_ADDRESS", env["RAY_REDIS_ADDRESS"])  # the new head's GCS reads the cluster back
    back_in_s = restart_head(state)
    late = submit_spec(env, tmp_path, "late", command=["true"], gpus=1, memory_mib=30000,
                       emulation={"peak_mib": 30000, "duration_s": 500, "smact": 0.2})
    assert hs(env, "wait", *jobs, late, "--timeout", "300").returncode == 0, [job_status(env, j) for j in jobs]
    kept = job_status(env, on_worker)
    assert kept["attempts"] == 1 and kept["lost_runs"] == 0 and kept["node"] == "node1", kept  # never judged lost
    requeued = job_status(env, on_head)
    assert requeued["attempts"] == 2 and requeued["lost_runs"] == 1, requeued  # its machine died
    everything = json.loads(hs(env, "status", "--json").stdout)
    assert sorted(j["name"] for j in everything) == ["late", "long0", "long1"]  # nothing twice, nothing lost
    cluster_now = json.loads(hs(env, "info", "--json").stdout)
    assert sorted(n["name"] for n in cluster_now["nodes"]) == ["node0", "node1"]  # the head's node is back
    assert back_in_s < 120


def test_rays_own_drain_of_a_node_drains_it_in_the_queue_and_its_job_moves_after_a_checkpoint(cluster, tmp_path):
    """What Ray's autoscaler does to a busy node it scales down, or KubeRay on a spot node's
    termination notice: a drain in the GCS with a deadline (``ray drain-node``, the same call)."""
    _, env = cluster
    assert hs(env, "drain", "node0").returncode == 0  # the job goes to the worker (Ray drains no head)
    job = submit_spec(env, tmp_path, "spot", command=[sys.executable, "examples/train_checkpointed.py", "--steps",
                                                       "1000000"], gpus=1, memory_mib=3000,
                      checkpoint_dir=str(tmp_path / "ckpt"))
    deadline = time.time() + 120
    while (where := job_status(env, job))["state"] != "running" or not where["node"]:
        assert time.time() < deadline, where
        time.sleep(0.5)
    node = where["node"]
    assert node == "node1" and hs(env, "undrain", "node0").returncode == 0
    find = ("import json, ray; ray.init(address='auto', log_to_driver=False); "
            f"print([n['NodeID'] for n in ray.nodes() if n['Alive'] and 'hs_node_{node}' in n['Resources']][0])")
    node_id = subprocess.run([sys.executable, "-c", find], env={**env, "RAY_ADDRESS": _address(env)},
                             capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1]
    drained = subprocess.run([str(Path(sys.executable).parent / "ray"), "drain-node", "--address", _address(env),
                              "--node-id", node_id, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                              "--reason-message", "spot termination notice", "--deadline-remaining-seconds", "600"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert drained.returncode == 0, drained.stderr
    while (now := job_status(env, job))["node"] == node or now["checkpoints"] < 1:
        assert time.time() < deadline + 120, now
        time.sleep(0.5)
    nodes = {n["name"]: n["state"] for n in json.loads(hs(env, "info", "--json").stdout)["nodes"]}
    assert nodes[node] in ("draining", "drained") and now["state"] == "running" and now["attempts"] == 2, (nodes, now)
    hs(env, "cancel", job)


def _address(env) -> str:
    return json.loads(hs(env, "info", "--json").stdout)["ray_address"]
