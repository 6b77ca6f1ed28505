"""End to end on a live 2-node emulated Ray cluster, driven through the CLI and the Python API.

One cluster for the module (``up`` in a private state dir, ``down`` at the end: only its own
processes are stopped). Time scale 0.01: an emulated 1000 s job takes 10 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from hier_sched.front.connection import connect
from hier_sched.front.deploy import start_cluster, stop_cluster
from hier_sched.front.local_cluster import ClusterConfig, local_ray_alive
from node_actor.emulated_device import EmulatedNodeDevices

HS = str(Path(sys.executable).with_name("hier-sched"))
SCALE = 0.01
# (declared MiB, true peak MiB) of the 12-job mix; the last one declares far too little
MIX = [(3934, 3934), (7106, 7106), (13236, 13236), (6684, 6684), (11760, 11760), (21864, 21864), (666, 666),
       (858, 858), (1776, 1776), (5918, 5918), (11106, 11106), (2000, 20000)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("hs_state")
    env = {**os.environ, "HIER_SCHED_STATE_DIR": str(state), "RAY_AUTH_MODE": "disabled"}
    old = os.environ.get("HIER_SCHED_STATE_DIR")
    os.environ["HIER_SCHED_STATE_DIR"] = str(state)  # for the in-process Python API
    record = start_cluster(ClusterConfig(nodes=2, gpus_per_node=4, time_scale=SCALE, policy="auto", backend="emulated"),
                           directory=state)
    try:
        yield state, env
    finally:
        stop_cluster(state)
        assert not local_ray_alive(record.local_ray)  # every process of the Ray cluster `up` started is gone
        if old is None:
            os.environ.pop("HIER_SCHED_STATE_DIR", None)
        else:
            os.environ["HIER_SCHED_STATE_DIR"] = old


def _hs(env, *args, timeout=300):
    return subprocess.run([HS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _write_spec(directory: Path, name: str, **fields) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "gpus": 1, **fields}))
    return path


def _status(env, job_id=None):
    proc = _hs(env, "status", *([job_id] if job_id else []), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class CapacityWatch:
    """Samples every emulated GPU of the cluster while a test runs: the most any GPU held."""

    def __init__(self, state: Path):
        self.dirs = sorted(state.glob("nodes/*/devices"))
        self.worst = 0.0  # max over samples of used / total
        self.most_residents = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.1):
            for d in self.dirs:
                for s in EmulatedNodeDevices.open(d).samples():
                    self.worst = max(self.worst, s.memory_used_mib / s.memory_total_mib)
                    self.most_residents = max(self.most_residents, len(s.processes))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_mix_with_a_mis_estimated_job_all_succeed_through_the_cli(cluster, tmp_path):
    state, env = cluster
    specs = [_write_spec(tmp_path, f"mix{i}", command=["python", "-c", "print('hello')"], memory_mib=declared,
                         estimator="none", emulation={"peak_mib": peak, "duration_s": 600 + 97 * i, "smact": 0.3 + 0.04 * i})
             for i, (declared, peak) in enumerate(MIX, 1)]
    with CapacityWatch(state) as watch:
        submits = [subprocess.Popen([HS, "submit", str(p), "--json"], env=env, stdout=subprocess.PIPE, text=True)
                   for p in specs]
        ids = [json.loads(p.communicate(timeout=120)[0])["job_id"] for p in submits]
        waited = _hs(env, "wait", *ids, "--timeout", "240")
    jobs = {j["job_id"]: j for j in _status(env)}
    summary = [(jobs[i]["name"], jobs[i]["state"], jobs[i]["attempts"], jobs[i]["oom_crashes"], jobs[i]["reason"]) for i in ids]
    assert waited.returncode == 0, (waited.stdout, waited.stderr, summary)
    assert all(jobs[i]["state"] == "succeeded" for i in ids), summary
    liar = jobs[ids[-1]]
    assert liar["oom_crashes"] >= 1 and liar["attempts"] >= 2, liar
    assert liar["observed_peak_mib"] >= 20000
    print(f"most memory ever held on one GPU: {watch.worst:.1%}; most processes on one GPU: {watch.most_residents}")
    assert watch.worst <= 1.0
    assert watch.most_residents >= 2  # jobs really were collocated
    log = _hs(env, "logs", ids[-1])
    assert "torch.OutOfMemoryError: CUDA out of memory" in log.stdout and "hello" in log.stdout


def test_spec_that_fits_no_gpu_is_rejected_at_submit(cluster, tmp_path):
    _, env = cluster
    huge = _hs(env, "submit", str(_write_spec(tmp_path, "huge", command=["true"], memory_mib=50000)), "--json")
    assert huge.returncode == 2
    assert "memory_mib" in huge.stderr and "largest GPU has 40536" in huge.stderr
    wide = _hs(env, "submit", str(_write_spec(tmp_path, "wide", command=["true"], gpus=5, memory_mib=1000)))
    assert wide.returncode == 2 and "gpus: 5 GPUs on one node, but the largest node has 4" in wide.stderr
    bad = _hs(env, "submit", str(_write_spec(tmp_path, "bad", command="python train.py")))
    assert bad.returncode == 2 and "command: must be a list of strings" in bad.stderr
    gang = _hs(env, "submit", str(_write_spec(tmp_path, "gang", command=["true"], gpus=12, gpus_per_node=4,
                                             memory_mib=1000)))
    assert gang.returncode == 2 and "gang shape: needs 3 nodes, the cluster has 2" in gang.stderr
    assert all(j["name"] not in ("huge", "wide", "bad", "gang") for j in _status(env))  # nothing invalid is queued


def test_missing_command_fails_the_job_with_the_reason_not_the_actor(cluster, tmp_path):
    _, env = cluster
    job = json.loads(_hs(env, "submit", str(_write_spec(tmp_path, "missing", command=["no-such-command-hs"],
                                                          memory_mib=1000)), "--json").stdout)["job_id"]
    assert _hs(env, "wait", job, "--timeout", "60").returncode == 1
    record = _status(env, job)
    assert record["state"] == "failed" and record["attempts"] == 1
    assert "no-such-command-hs" in record["reason"] and "127" in record["reason"], record
    after = json.loads(_hs(env, "submit", str(_write_spec(tmp_path, "after", command=["true"], memory_mib=1000)),
                           "--json").stdout)["job_id"]
    assert _hs(env, "wait", after, "--timeout", "60").returncode == 0  # the node actor lives on


def test_python_api_runs_a_function_and_returns_its_value(cluster):
    import hier_sched as hs

    def train(steps, scale=1):
        return sum(range(steps)) * scale

    handle = hs.submit(train, 10, est=1500, name="fn-job", fn_kwargs={"scale": 2})
    assert handle.result(timeout=120) == 90
    assert handle.status()["state"] == "succeeded"
    with pytest.raises(hs.SpecError, match="gpus"):
        hs.submit(train, 1, gpus=0)


def test_cancel_stops_a_running_job_and_frees_its_memory(cluster, tmp_path):
    state, env = cluster
    spec = _write_spec(tmp_path, "long", memory_mib=9000, estimator="none",
                       emulation={"peak_mib": 9000, "duration_s": 100000, "smact": 0.2, "warmup_s": 1})
    job = json.loads(_hs(env, "submit", str(spec), "--json").stdout)["job_id"]
    devices = [EmulatedNodeDevices.open(d) for d in sorted(state.glob("nodes/*/devices"))]

    def held() -> float:
        return sum(mib for d in devices for s in d.samples() for _, mib in s.processes)

    deadline = time.time() + 60
    while held() < 9000 and time.time() < deadline:
        time.sleep(0.2)
    assert held() >= 9000
    assert _hs(env, "cancel", job).returncode == 0
    assert _hs(env, "wait", job, "--timeout", "60").returncode == 1
    assert _status(env, job)["state"] == "cancelled"
    assert held() == 0


def test_checkpoint_signal_requeues_the_job_and_it_resumes(cluster, tmp_path):
    state, env = cluster
    spec = _write_spec(tmp_path, "slotted", memory_mib=3000, estimator="none", checkpoint_dir=str(tmp_path / "ckpt"),
                       emulation={"peak_mib": 3000, "duration_s": 1500, "smact": 0.3, "warmup_s": 1})
    job = json.loads(_hs(env, "submit", str(spec), "--json").stdout)["job_id"]
    deadline = time.time() + 60
    while "error" in (answer := connect(state).call("checkpoint", job)) and time.time() < deadline:
        time.sleep(0.3)  # until the job's process exists
    assert answer["state"] == "checkpointing", answer
    assert _hs(env, "wait", job, "--timeout", "120").returncode == 0
    record = _status(env, job)
    assert record["checkpoints"] == 1 and record["attempts"] == 2 and record["oom_crashes"] == 0, record
    assert "resuming from checkpoint" in _hs(env, "logs", job).stdout


def test_top_shows_a_running_jobs_progress_and_peak_and_status_both_clocks(cluster, tmp_path):
    """What a user watches while a job runs: ``top`` draws the progress the job reports and the
    peak its node has seen so far; ``status`` counts wall-clock time, the emulated time beside it."""
    _, env = cluster
    spec = _write_spec(tmp_path, "watched", memory_mib=9000, estimator="none", command=["python", "-c", "print(1)"],
                       emulation={"peak_mib": 8000, "duration_s": 3000, "smact": 0.3, "warmup_s": 1})
    job = json.loads(_hs(env, "submit", str(spec), "--json").stdout)["job_id"]
    try:
        deadline, row, top = time.time() + 90, "", None
        while time.time() < deadline:
            top = _hs(env, "top")  # piped: one plain frame
            row = next((line for line in top.stdout.splitlines() if line.strip().startswith(job)), "")  # its run
            if re.search(r" [1-9]\d?% ", row) and "8.8/7.8" in row:
                break
            time.sleep(1)
        assert re.search(r" [1-9]\d?% ", row) and "8.8/7.8" in row, top.stdout if top else "no frame"
        status = _hs(env, "status", job)
        assert "times: wall clock (emulated)" in status.stdout
        assert re.search(rf"{job} +running +\d+s \(\w+\)", status.stdout), status.stdout  # e.g. 12s (20m)
    finally:
        _hs(env, "cancel", job)
