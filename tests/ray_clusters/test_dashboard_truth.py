"""What the Ray dashboard shows of scheduled jobs, read through Ray's state API (the dashboard's own
source) on a ``hier-sched up --emulated`` cluster: the scheduler is one RUNNING Ray job and our
commands add none; each attempt is a task of that job, FINISHED when it succeeded and FAILED with
the reason when it failed, also long after ``up`` exited; Ray's GPU books show the reservations;
the polled methods leave no task entries; the actors have a Repr. docs/dashboard.md."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli_cluster import HS, cli_cluster

SCRIPT = """
import json, time
import ray
from ray.util import state
ray.init(address="auto", namespace="_ray_internal_probe", logging_level="ERROR")
tasks = state.list_tasks(limit=10000, raise_on_missing_output=False, detail=True)
print(json.dumps({
    "jobs": [[j.submission_id, str(j.status)] for j in state.list_jobs(raise_on_missing_output=False)],
    "tasks": [[t.name, str(t.state), t.func_or_class_name, t.job_id, t.error_message or ""] for t in tasks],
    "actors": [[a.class_name, a.repr_name] for a in state.list_actors(detail=True, raise_on_missing_output=False)],
    "gpu": [ray.cluster_resources().get("GPU", 0.0), ray.available_resources().get("GPU", 0.0)],
}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cli_cluster(tmp_path_factory.mktemp("state"), nodes=1, gpus_per_node=2) as started:
        yield {**started["env"], "RAY_ADDRESS": started["info"]["ray_address"]}  # the probe's "auto" must be this cluster



def _submit(env, directory: Path, name: str, command: list[str], duration_s: float) -> str:
    spec = {"name": name, "command": command, "gpus": 1, "memory_mib": 10000, "estimator": "none",
            "emulation": {"peak_mib": 10000, "duration_s": duration_s, "smact": 0.3}}
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([HS, "submit", "--quiet", str(directory / f"{name}.yaml")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _probe(env) -> dict:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_scheduled_jobs_show_as_they_are(cluster, tmp_path):
    ok = _submit(cluster, tmp_path, "succeeds", ["python", "-c", "print('ok')"], 300)
    bad = _submit(cluster, tmp_path, "exits-3", ["python", "-c", "import sys; sys.exit(3)"], 300)
    long = _submit(cluster, tmp_path, "runs-on", ["python", "-c", "print('ok')"], 20000)
    waited = subprocess.run([HS, "wait", ok, bad, "--timeout", "180"], env=cluster, capture_output=True, text=True,
                            timeout=240)
    assert waited.returncode != 0  # one failed, as it should
    time.sleep(20)  # past Ray's 15 s marking of a dead driver's tasks, were the owner one
    seen = _probe(cluster)

    jobs = seen["jobs"]  # our commands (up, submit, wait, info) are not listed
    assert len(jobs) == 1 and jobs[0][0].startswith("hier_sched-") and jobs[0][1].endswith("RUNNING"), jobs
    by_name = {t[0]: t for t in seen["tasks"]}
    assert by_name[f"hs:{ok}:attempt1"][1].endswith("FINISHED")
    failed = by_name[f"hs:{bad}:attempt1"]
    assert failed[1].endswith("FAILED") and "exit code 3" in failed[4], failed
    assert by_name[f"hs:{long}:attempt1"][1].endswith("RUNNING")
    owners = {t[3] for t in seen["tasks"] if t[0].startswith("hs:")}
    assert len(owners) == 1  # every attempt is a task of the scheduler's job

    functions = [t[2] for t in seen["tasks"]]
    assert not any(f.endswith((".exchange", ".status", ".states", ".summary")) for f in functions), functions
    total, free = seen["gpu"]
    assert total == 2.0 and free == pytest.approx(2.0 - 10000 / 40536, abs=0.01)  # the long job's share
    reprs = dict(seen["actors"])
    assert reprs["NodeActor"].startswith("NodeActor(node0: 2x A100-40GB") and reprs["GlobalQueue"].startswith(
        "GlobalQueue(1 node(s)")
