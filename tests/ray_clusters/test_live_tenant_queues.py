"""Live, on a 1-node x 2-GPU emulated Ray cluster: team queues through the CLI, and a real PyTorch
training job on borrowed GPUs that a queue within its quota takes back checkpoint first; the job
resumes right after the step it saved, so no step runs twice."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from hier_sched.front.deploy import start_cluster, stop_cluster
from hier_sched.front.local_cluster import ClusterConfig
from tests.helpers.cli_cluster import hs, job_status, submit_spec



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("hs_queues")
    env = {**os.environ, "HIER_SCHED_STATE_DIR": str(state), "RAY_AUTH_MODE": "disabled"}
    start_cluster(ClusterConfig(nodes=1, gpus_per_node=2, time_scale=0.01, policy="magm", backend="emulated"),
                  directory=state)
    try:
        yield env
    finally:
        stop_cluster(state)


def _submit(env, directory: Path, name: str, **fields) -> str:
    return submit_spec(env, directory, name, **{"memory_mib": 30000, **fields})


def _until(check, timeout_s: float = 120.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if value := check():
            return value
        time.sleep(0.5)
    raise AssertionError("timed out")


def _resumed_log(env, job_id: str) -> str | None:
    """The job's log once it resumed and ran 10 steps more, else None."""
    text = hs(env, "logs", job_id).stdout
    resumed = re.search(r"resuming at step (\d+)", text)
    return text if resumed and re.search(rf"^step {int(resumed.group(1)) + 10} loss", text, re.M) else None


def test_a_borrowed_gpu_is_reclaimed_checkpoint_first_and_the_training_resumes(cluster, tmp_path):
    env = cluster
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  - {name: team-a, nominal: {gpu: 1}}\n")
    proc = hs(env, "queues", "apply", str(bad))
    assert proc.returncode == 2 and "queues.0.nominal.gpu: unknown field (did you mean gpus?)" in proc.stderr, proc.stderr
    good = tmp_path / "queues.yaml"
    good.write_text("queues:\n  - {name: team-a, nominal: {gpus: 1}, borrowing_limit: {gpus: 1}}\n"
                    "  - {name: team-b, nominal: {gpus: 1}}\n")
    assert hs(env, "queues", "apply", str(good)).returncode == 0

    steady = _submit(env, tmp_path, "steady", queue="team-a", emulation={"peak_mib": 30000, "duration_s": 100000})
    _until(lambda: job_status(env, steady)["state"] == "running")
    trainer = _submit(env, tmp_path, "trainer", queue="team-a", checkpoint_dir=str(tmp_path / "ckpt"),
                      command=[sys.executable, "examples/train_checkpointed.py", "--steps", "1000000"])
    _until(lambda: re.search(r"^step 5 loss", hs(env, "logs", trainer).stdout, re.M))  # on team-b's idle GPU
    (team_a,) = (q for q in json.loads(hs(env, "queues", "--json").stdout) if q["name"] == "team-a")
    assert (team_a["used_gpus"], team_a["borrowed_gpus"]) == (2, 1), team_a

    guest = _submit(env, tmp_path, "guest", queue="team-b", emulation={"peak_mib": 30000, "duration_s": 300})
    waited = hs(env, "wait", guest, "--timeout", "120")
    assert waited.returncode == 0, (job_status(env, guest), job_status(env, trainer))
    log = _until(lambda: _resumed_log(env, trainer), 180.0)
    for job in (steady, trainer):
        hs(env, "cancel", job)
    record = job_status(env, trainer)
    assert record["preemptions"] == record["checkpoints"] == 1 and record["queue"] == "team-a", record
    assert job_status(env, steady)["preemptions"] == 0  # within team-a's nominal quota: never a victim
    saved = int(re.search(r"checkpoint signal: saved after step (\d+)", log).group(1))
    assert int(re.search(r"resuming at step (\d+)", log).group(1)) == saved + 1
    done = [int(s) for s in re.findall(r"^step (\d+) loss", log, re.M)]
    assert done[: saved + 10] == list(range(1, saved + 11))  # every step once, none twice
