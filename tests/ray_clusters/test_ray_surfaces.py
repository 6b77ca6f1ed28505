"""Where Ray users look, end to end on a local ``hier-sched up --emulated`` cluster (2 nodes x 1
emulated A100-40GB, time scale 0.01):

* ``ray job submit --working-dir DIR -- hier-sched run spec.yaml`` queues the job through the
  scheduler; the job's processes get the Ray job's uploaded working directory and env_vars; its
  output is in the Ray job's log; the Ray job ends as the scheduled job did (its driver's exit
  code is the job's own);
* ``ray job stop`` cancels the scheduled job, queued or running, before Ray's SIGKILL;
* each node's metrics endpoint (Prometheus text, from ``hier-sched info --json``) carries the
  documented ``ray_hier_sched_*`` series with plausible values while jobs run.

Everything runs as a user runs it: the CLIs in subprocesses. ``down`` ends the cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.helpers.cli_cluster import HS, cli_cluster

RAY = str(Path(HS).parent / "ray")
TOTAL_MIB = 40536  # an A100-40GB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # inherited by `ray start`: metrics within ~1 s
    with cli_cluster(tmp_path_factory.mktemp("state"), nodes=2, gpus_per_node=1,
                     RAY_metrics_report_interval_ms="1000") as started:
        assert started["info"]["dashboard_url"].startswith("http://127.0.0.1:"), started["info"]  # this machine only
        yield started



def _hs(env, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([HS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _write_spec(directory: Path, name: str, **fields) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    spec = {"name": name, "gpus": 1, "memory_mib": 3000, "estimator": "none",
            "emulation": {"peak_mib": 3000, "duration_s": 100, "smact": 0.3}, **fields}
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return f"{name}.yaml"


def _ray_job(cluster, workdir: Path, spec_file: str, *options: str, wait: bool = True) -> tuple[str, subprocess.CompletedProcess]:
    submission = f"hs-test-{uuid.uuid4().hex[:8]}"
    argv = [RAY, "job", "submit", "--address", cluster["info"]["dashboard_url"], "--working-dir", str(workdir),
            "--submission-id", submission, *options, *([] if wait else ["--no-wait"]), "--", "hier-sched", "run",
            spec_file]
    return submission, subprocess.run(argv, env=cluster["env"], capture_output=True, text=True, timeout=240)


def _ray_job_info(cluster, submission: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(cluster["info"]["dashboard_url"]).get_job_info(submission)


def _ray_job_logs(cluster, submission: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(cluster["info"]["dashboard_url"]).get_job_logs(submission)


def _scheduled(cluster, name: str) -> dict | None:
    jobs = json.loads(_hs(cluster["env"], "status", "--json").stdout)
    return next((j for j in jobs if j["name"] == name), None)


def _wait_for(predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_a_ray_job_runs_through_the_scheduler_with_its_working_dir_and_env(cluster, tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "data.txt").write_text("payload from the working dir\n")
    (work / "helper.py").write_text("VALUE = 42\n")
    (work / "train.py").write_text(
        "import os, pathlib, helper\n"
        "print('data:', pathlib.Path('data.txt').read_text().strip())\n"
        "print('GREETING:', os.environ.get('GREETING'), '| helper:', helper.VALUE)\n"
        "print('scheduled job:', os.environ['HIER_SCHED_JOB_ID'])\n")
    spec = _write_spec(work, "ray-job-ok", command=["python", "train.py"])
    submission, done = _ray_job(cluster, work, spec, "--runtime-env-json", json.dumps({"env_vars": {"GREETING": "hi"}}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for line in ("data: payload from the working dir", "GREETING: hi | helper: 42", "scheduled job: ray-job-ok-"):
        assert line in done.stdout, done.stdout[-3000:]  # streamed while the Ray job ran
        assert line in _ray_job_logs(cluster, submission)  # and kept in the Ray job's log
    job = _scheduled(cluster, "ray-job-ok")
    assert job["state"] == "succeeded" and job["attempts"] == 1, job
    assert _ray_job_info(cluster, submission).driver_exit_code == 0


def test_a_failing_job_fails_the_ray_job_with_its_own_exit_code(cluster, tmp_path):
    spec = _write_spec(tmp_path, "ray-job-fails", command=["python", "-c", "print('about to fail'); raise SystemExit(3)"])
    submission, done = _ray_job(cluster, tmp_path, spec)
    assert done.returncode != 0 and "about to fail" in done.stdout, done.stdout[-3000:]
    assert _ray_job_info(cluster, submission).driver_exit_code == 3
    assert _scheduled(cluster, "ray-job-fails")["state"] == "failed"


def _stop_and_expect_cancelled(cluster, submission: str, name: str) -> None:
    stop = subprocess.run([RAY, "job", "stop", "--address", cluster["info"]["dashboard_url"], submission],
                          env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    job = _wait_for(lambda: (j := _scheduled(cluster, name)) and j["state"] == "cancelled" and j, 30,
                    f"{name} cancelled in the scheduler")
    logs = _ray_job_logs(cluster, submission)
    # `run` got Ray's SIGTERM and cancelled the job itself: the line is printed once the queue
    # took the cancel, so it was before Ray's SIGKILL 3 s after the SIGTERM
    assert "hier-sched run: interrupted; job" in logs, logs[-2000:]
    assert _ray_job_info(cluster, submission).status == "STOPPED"
    return job


def test_ray_job_stop_cancels_a_running_job(cluster, tmp_path):
    spec = _write_spec(tmp_path, "ray-job-long", command=["python", "-c", "print('started', flush=True)"],
                       emulation={"peak_mib": 3000, "duration_s": 100000, "smact": 0.3})  # 1000 s of wall time
    submission, started = _ray_job(cluster, tmp_path, spec, wait=False)
    assert started.returncode == 0, started.stderr
    _wait_for(lambda: (j := _scheduled(cluster, "ray-job-long")) and j["state"] == "running", 90, "the job running")
    job = _stop_and_expect_cancelled(cluster, submission, "ray-job-long")
    assert "cancelled" in job["reason"]


def test_ray_job_stop_cancels_a_queued_job_and_metrics_show_the_queue(cluster, tmp_path):
    long = {"peak_mib": 30000, "duration_s": 100000, "smact": 0.5}
    blockers = [json.loads(_hs(cluster["env"], "submit", "--json", _abs(_write_spec(tmp_path, f"blocker{i}",
                memory_mib=30000, emulation=long), tmp_path)).stdout)["job_id"] for i in range(2)]
    try:
        _wait_for(lambda: all((_scheduled(cluster, f"blocker{i}") or {}).get("state") == "running" for i in range(2)),
                  90, "both GPUs taken")
        spec = _write_spec(tmp_path, "ray-job-waits", memory_mib=30000)
        submission, started = _ray_job(cluster, tmp_path, spec, wait=False)
        assert started.returncode == 0, started.stderr
        _wait_for(lambda: (j := _scheduled(cluster, "ray-job-waits")) and j["state"] == "queued", 90, "the job queued")
        series = _wait_for(lambda: _metrics_ready(cluster), 60, "the queue's metrics on the head's endpoint", 2.0)
        _check_plausible(series)
        job = _stop_and_expect_cancelled(cluster, submission, "ray-job-waits")
        assert "while queued" in job["reason"] and job["attempts"] == 0, job
    finally:
        for job_id in blockers:
            _hs(cluster["env"], "cancel", job_id)


def _abs(name: str, directory: Path) -> str:
    return str(directory / name)


# ---------------------------------------------------------------------- metrics
def _scrape(cluster) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every ``ray_hier_sched_*`` sample on every node's endpoint: name -> [(labels, value)]."""
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for url in cluster["info"]["metrics_urls"]:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("ray_hier_sched_"):
                    series.setdefault(sample.name, []).append((sample.labels, sample.value))
    return series


def _one(series, name: str, **labels: str) -> float | None:
    values = [v for lab, v in series.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    return max(values) if values else None


def _metrics_ready(cluster):
    """The scrape once it shows this moment: both GPUs busy, one job waiting in the main queue."""
    series = _scrape(cluster)
    ready = (_one(series, "ray_hier_sched_running_jobs") == 2 and _one(series, "ray_hier_sched_queue_depth", queue="main")
             and all(_one(series, "ray_hier_sched_gpu_memory_used_mib", node=n, gpu="0") for n in ("node0", "node1")))
    return series if ready else None


def _check_plausible(series) -> None:
    from hier_sched.common.metrics import METRICS

    for m in METRICS:  # every gauge (team queues': none configured here) and every histogram observed by now
        if m.kind == "gauge" and "team_queue" not in m.tags:
            assert m.exported in series, f"{m.exported} not exported"
    for name in ("ray_hier_sched_wait_seconds_count", "ray_hier_sched_placement_seconds_count",
                 "ray_hier_sched_tick_seconds_count"):
        assert (_one(series, name) or 0) >= 2, name
    assert _one(series, "ray_hier_sched_jobs_submitted_total") >= 3
    assert _one(series, "ray_hier_sched_queue_depth", queue="main") >= 1
    assert _one(series, "ray_hier_sched_queue_depth", queue="recovery") == 0
    for node in ("node0", "node1"):  # each node's own endpoint: both nodes' GPUs show up
        g = {k: _one(series, f"ray_hier_sched_gpu_{k}", node=node, gpu="0")
             for k in ("memory_total_mib", "memory_reserved_mib", "memory_used_mib", "memory_free_mib",
                       "smact", "smact_risk", "power_watts", "energy_joules", "jobs")}
        assert g["memory_total_mib"] == TOTAL_MIB and g["memory_reserved_mib"] >= 30000, g
        assert 0 < g["memory_used_mib"] <= TOTAL_MIB and g["memory_free_mib"] <= TOTAL_MIB - g["memory_used_mib"], g
        assert 0 < g["smact"] <= 1 and 0 <= g["smact_risk"] <= 1 and g["power_watts"] > 0, g
        assert g["energy_joules"] > 0 and g["jobs"] == 1, g
