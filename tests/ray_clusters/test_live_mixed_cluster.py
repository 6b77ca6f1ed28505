"""Live, on a mixed emulated cluster started as users start it (``hier-sched up --emulated --node
A100-40GB:2 --node H100-80GB:2``): each node reports its own GPU type, a 60 GB job runs on the
H100, a job restricted to ``A100*`` never lands on the H100, and small jobs do not take the only
GPUs big enough for a waiting big job.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.cli_cluster import cli_cluster, hs, job_status, submit_spec


A100_NODE, H100_NODE = "node0", "node1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cli_cluster(tmp_path_factory.mktemp("hs_mixed"), node_specs=("A100-40GB:2", "H100-80GB:2")) as c:
        yield c


def emulated(env, directory, name: str, peak_mib: int, duration_s: float, **fields) -> str:
    return submit_spec(env, directory, name, command=["python", "-c", "print('training')"], memory_mib=peak_mib,
                       emulation={"peak_mib": peak_mib, "duration_s": duration_s, "smact": 0.4}, **fields)


def wait(env, *jobs: str, timeout: int = 240) -> None:
    proc = hs(env, "wait", *jobs, "--timeout", str(timeout), timeout=timeout + 60)
    assert proc.returncode == 0, [job_status(env, j) for j in jobs]


def test_info_lists_each_nodes_own_gpu_type(cluster):
    assert {n["name"]: (n["gpu_type"], n["gpus"]) for n in cluster["info"]["nodes"]} == {
        A100_NODE: ("A100-40GB", 2), H100_NODE: ("H100-80GB", 2)}


def test_a_60_gb_job_runs_on_the_h100_and_an_a100_only_job_never_does(cluster, tmp_path):
    env = cluster["env"]
    big = emulated(env, tmp_path, "big", 60000, 300)
    restricted = [emulated(env, tmp_path, f"a100-only-{i}", 3000, 300, gpu_types=["A100*"]) for i in range(4)]
    wait(env, big, *restricted)
    assert job_status(env, big)["node"] == H100_NODE
    assert {job_status(env, j)["node"] for j in restricted} == {A100_NODE}
    path = tmp_path / "too-big.yaml"
    path.write_text("name: too-big\ncommand: [python, -c, pass]\nmemory_mib: 60000\ngpu_types: [\"A100*\"]\n")
    proc = hs(env, "submit", str(path))
    assert proc.returncode != 0 and "A100-40GB needs 60000 MiB per GPU" in proc.stdout + proc.stderr


def test_small_jobs_do_not_crowd_out_the_only_gpus_big_enough_for_a_waiting_big_job(cluster, tmp_path):
    env = cluster["env"]
    blocker = emulated(env, tmp_path, "blocker", 70000, 12000)  # one H100 GPU, about 60 s (H100: twice an A100)
    deadline = time.time() + 60
    while job_status(env, blocker)["state"] != "running":
        assert time.time() < deadline, job_status(env, blocker)
        time.sleep(0.5)
    big = emulated(env, tmp_path, "big-pair", 60000, 300, gpus=2)  # both H100 GPUs: waits for the blocker
    time.sleep(2)  # (the queue has seen it waiting)
    # each about 20 s on an A100: seen running between two rounds of `status` calls on a busy machine
    small = [emulated(env, tmp_path, f"small-{i}", 3000, 3000) for i in range(4)]
    seen_on: dict[str, set[str]] = {A100_NODE: set(), H100_NODE: set()}  # while the pair waits
    while job_status(env, blocker)["state"] == "running":
        for j in small:
            record = job_status(env, j)
            if record["state"] == "running":
                seen_on[record["node"]].add(j)
        time.sleep(0.5)
    wait(env, big, *small, timeout=300)
    assert not seen_on[H100_NODE], "small jobs took the idle H100 GPU the waiting 60 GB pair needs"
    assert seen_on[A100_NODE], "no small job ran while the pair waited: the test proved nothing"
    assert job_status(env, big)["node"] == H100_NODE
