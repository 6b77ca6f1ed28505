"""Live: the head of a 2-node emulated cluster (started with `hier-sched up`, GCS fault tolerance
on a Redis of the test's own) is killed as a machine that dies and started again on the same
ports, as Kubernetes restarts a head pod. The worker's job runs on through it and keeps its
progress; the head's own job is requeued; the queue comes back from its log on the new head;
nothing is lost or run twice (docs/cluster.md, "When the head restarts")."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

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
