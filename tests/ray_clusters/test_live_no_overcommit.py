"""No GPU is ever booked beyond its capacity on a live emulated cluster, as the nodes show it.

A witness samples the node side every 0.5 s (``JobProcessSampler`` with capacities): the runs
whose processes are alive on this machine, and the reservations their run records hold, added up
per GPU. It is first shown to catch a GPU booked twice: beside a live job, a process of another job
with a run record that books the same GPU, as a node that lost count would leave them.
Then jobs of random shapes, every one declaring its true peak, arrive in bursts, among them the
issue's own scenario (a 2-GPU job and a 30,000 MiB job waiting for the GPUs two 30,000 MiB jobs
hold): the witness must see no GPU booked beyond its memory, and no job may crash with an OOM.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

import hier_sched as hs
from hier_sched.front.bench.chaos import JobProcessSampler, gpu_capacities
from hier_sched.front.connection import connect
from hier_sched.front.deploy import start_cluster, stop_cluster
from hier_sched.front.local_cluster import ClusterConfig

SCALE = 0.01  # an emulated 100 s take 1 s
SEED = int(os.environ.get("HIER_SCHED_TEST_SEED", "19"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("hs_overcommit")
    old = os.environ.get("HIER_SCHED_STATE_DIR")
    os.environ["HIER_SCHED_STATE_DIR"] = str(state)
    start_cluster(ClusterConfig(nodes=2, gpus_per_node=2, time_scale=SCALE, policy="auto", backend="emulated"),
                  directory=state)
    sampler = None
    try:
        scheduler = connect(state)
        sampler = JobProcessSampler(0.5, state_dirs=(state,), capacities=gpu_capacities(scheduler)).start()
        yield state, scheduler, sampler
    finally:
        if sampler is not None:
            sampler.stop()
        stop_cluster(state)
        if old is None:
            os.environ.pop("HIER_SCHED_STATE_DIR", None)
        else:
            os.environ["HIER_SCHED_STATE_DIR"] = old


def _job(name: str, gpus: int, mib: int, duration_s: float, **kw) -> hs.JobHandle:
    return hs.submit(["python", "-c", "print('x')"], est=mib, gpus=gpus, name=name,
                     emulation={"peak_mib": mib, "duration_s": duration_s, "smact": 0.5}, **kw)


def _running(handle: hs.JobHandle, timeout_s: float = 60.0) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = handle.status()
        if status["state"] == "running":
            return status
        time.sleep(0.2)
    raise AssertionError(f"{handle.job_id} did not start: {handle.status()}")


def test_the_witness_catches_a_gpu_booked_twice(cluster):
    """A second run booked onto the GPU a 30,000 MiB job runs on, as the node side would show it:
    a live process of another job with its run record (30,000 MiB on that GPU) beside the node's
    runs. The witness must see 60,000 MiB reserved on a 40,536 MiB GPU, and go quiet after."""
    state, scheduler, sampler = cluster
    resident = _job("resident", 1, 30000, 6000)
    status = _running(resident)
    node, gpu = status["node"], status["gpus"][0]
    before = sampler.seen.overbooked_samples
    intruder = "intruder-0badc0de"
    run_dir = state / "nodes" / node / "jobs" / intruder
    run_dir.mkdir(parents=True)
    (run_dir / "attempt1.json").write_text(json.dumps({"job_id": intruder, "attempt": 1, "placement": {
        "job_id": intruder, "node": node, "gpus": [gpu], "reserved_mib": 30000.0}}))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"--pid-file={run_dir}/attempt1.pid"],
                               env={**os.environ, "HIER_SCHED_JOB_ID": intruder}, start_new_session=True)
    try:
        deadline = time.time() + 30
        while sampler.seen.overbooked_samples == before and time.time() < deadline:
            time.sleep(0.2)
        assert sampler.seen.overbooked_samples > before
        seen = sampler.seen.overbooked[-1]
        assert (seen["node"], seen["gpu"], seen["reserved_mib"], seen["capacity_mib"]) == (node, gpu, 60000, 40536)
        assert sorted(seen["runs"]) == sorted([f"{resident.job_id}#1", f"{intruder}#1"])
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(run_dir)
        resident.cancel()
        hs.wait([resident], timeout=60)
    assert not sampler._overbooked(sampler.sample())  # quiet once the double booking is gone


def test_random_jobs_declaring_their_peak_never_book_a_gpu_beyond_its_capacity(cluster):
    _, scheduler, sampler = cluster
    rng = random.Random(SEED)
    sampler.seen.overbooked_samples, sampler.seen.overbooked = 0, []
    samples_before = sampler.seen.samples
    handles = []
    for r in range(2):  # the scenario: two fill the node's GPUs, a gang and a big job wait
        first = [_job(f"r{r}-a", 1, 30000, 300), _job(f"r{r}-b", 1, 30000, 300)]
        time.sleep(0.3)
        handles += first + [_job(f"r{r}-g", 2, 25000, 400), _job(f"r{r}-c", 1, 30000, 200)]
    for i in range(14):
        gpus, extra = rng.choice([(1, {}), (1, {}), (2, {}), (2, {"gpus_per_node": 1})])
        handles.append(_job(f"rand{i}", gpus, rng.randrange(4000, 30001, 500), rng.uniform(100, 500), **extra))
        time.sleep(rng.uniform(0.0, 1.0))
    states = hs.wait(handles, timeout=420)
    statuses = [h.status() for h in handles]
    assert sampler.seen.samples - samples_before >= 20  # the node side was watched the whole time
    assert sampler.seen.overbooked_samples == 0, (SEED, sampler.seen.overbooked)
    assert sum(s["oom_crashes"] for s in statuses) == 0, [(s["name"], s["oom_crashes"]) for s in statuses]
    assert set(states.values()) == {"succeeded"}, [(s["name"], s["state"], s["reason"]) for s in statuses]
