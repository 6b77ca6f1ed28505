"""The scheduler lives in the Ray cluster: on a cluster started with plain ``ray start`` (a head
and a worker on this machine, as a user of a real cluster starts them), ``up --address``
attaches it and returns; afterwards clients with no hier_sched state find it through Ray alone
(``RAY_ADDRESS``), through the CLI, ``hier-sched run`` and the Python client.

One Ray cluster for the module, in its own temp dir on free ports; at the end only its own
processes are ended (never ``ray stop``). Time scale 0.01: an emulated 100 s job takes 1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from hier_sched.front.cluster_record import LocalRay
from hier_sched.front.connection import gcs_answers
from hier_sched.front.local_cluster import free_port, local_ray_alive, stop_local_ray
from hier_sched.front.run_job import RunExit

BIN = Path(sys.executable).parent
HS = str(BIN / "hier-sched")


@pytest.fixture(scope="module")
def plain_ray(tmp_path_factory):
    """A head and a worker started with ``ray start``, and the scheduler put on them by ``up --address``."""
    ray_dir = tempfile.mkdtemp(prefix="hsr-")  # short: Ray's socket paths must stay below 107 bytes
    port = free_port()
    address = f"127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HIER_SCHED_STATE_DIR")}
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray_processes = LocalRay(ray_dir, [], port)  # its processes name paths under ray_dir: the guard holds
    up_dir, client_dir = tmp_path_factory.mktemp("up_state"), tmp_path_factory.mktemp("client_state")
    try:
        for argv in (["--head", "--port", str(port), "--temp-dir", ray_dir, "--include-dashboard", "false"],
                     ["--address", address]):
            proc = subprocess.Popen([str(BIN / "ray"), "start", "--num-cpus", "2", *argv], env=base,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            ray_processes.sessions.append(proc.pid)
            output, _ = proc.communicate(timeout=180)
            assert proc.returncode == 0, output[-2000:]
        up = subprocess.run([HS, "up", "--emulated", "--address", address, "--gpus-per-node", "2", "--time-scale", "0.01"],
                            env={**base, "HIER_SCHED_STATE_DIR": str(up_dir)}, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        client_env = {**base, "RAY_ADDRESS": address, "HIER_SCHED_STATE_DIR": str(client_dir)}
        yield {"address": address, "up_dir": up_dir, "client_dir": client_dir, "env": client_env,
               "up_env": {**base, "HIER_SCHED_STATE_DIR": str(up_dir)}, "ray": ray_processes}
    finally:
        subprocess.run([HS, "down"], env={**base, "HIER_SCHED_STATE_DIR": str(up_dir)}, capture_output=True, timeout=120)
        stop_local_ray(ray_processes)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _hs(env, *args, timeout=240):
    return subprocess.run([HS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _spec(directory: Path, name: str, **fields) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "gpus": 1, "memory_mib": 3000, "estimator": "none", **fields}))
    return path


def _job_by_name(env, name: str) -> dict | None:
    jobs = json.loads(_hs(env, "status", "--json").stdout)
    return next((j for j in jobs if j["name"] == name), None)


def test_up_leaves_nothing_of_ours_running_and_pins_the_queue_to_the_head(plain_ray):
    marker = str(plain_ray["up_dir"])
    left = []
    servers = 0
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if any(marker in arg for arg in cmdline):
            if "node_actor.fork_server" in cmdline:  # a node actor's, started by it (not by `up`) to start its jobs
                servers += 1
            else:
                left.append(cmdline)
    assert left == []  # the `up` process has returned and left no server behind
    assert servers == 2  # one per node
    info = _hs(plain_ray["env"], "info", "--json")
    assert info.returncode == 0, info.stderr
    facts = json.loads(info.stdout)
    assert [n["name"] for n in facts["nodes"]] == ["node0", "node1"] and facts["gpus"] == 4
    assert facts["state_dir"] == str(plain_ray["up_dir"].resolve()) and facts["policy"] == "auto"
    assert facts["dashboard_url"] is None  # this head runs without a dashboard
    assert len(facts["metrics_urls"]) == 2
    for url in facts["metrics_urls"]:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200 and b"# TYPE" in response.read()
    where = subprocess.run([sys.executable, "-c", """
import ray
ray.init(address="auto", namespace="hier_sched", log_to_driver=False)
queue = ray.get_actor("hier_sched:global")
actor = ray._private.state.state.actor_table(queue._actor_id.hex())
head = [n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]]
print(actor["Address"]["NodeID"] == head[0])
"""], env=plain_ray["env"], capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().endswith("True"), where.stdout + where.stderr


def test_cli_submit_and_wait_with_no_state_file(plain_ray, tmp_path):
    env = plain_ray["env"]
    spec = _spec(tmp_path, "via-cli", command=["python", "-c", "print('hello')"],
                 emulation={"peak_mib": 3000, "duration_s": 300, "smact": 0.4})
    submitted = _hs(env, "submit", str(spec), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)["job_id"]
    assert _hs(env, "wait", job, "--timeout", "180").returncode == 0
    assert json.loads(_hs(env, "status", job, "--json").stdout)["exit_code"] == 0
    assert list(plain_ray["client_dir"].iterdir()) == []  # the client wrote no state of its own


def test_python_client_with_no_state_file(plain_ray, tmp_path):
    script = ("import hier_sched as hs\ndef f(x): return x * 7\n"
              "print(hs.submit(f, 6, est=2000, name='via-python').result(timeout=180))")
    done = subprocess.run([sys.executable, "-c", script], env=plain_ray["env"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.stdout.strip().splitlines()[-1:] == ["42"], done.stderr[-2000:]


def test_run_streams_the_output_as_it_arrives_and_exits_0(plain_ray, tmp_path):
    printer = "import time\nprint('first', flush=True)\ntime.sleep(6)\nprint('second', flush=True)"
    spec = _spec(tmp_path, "streamed", command=["python", "-c", printer])
    run = subprocess.Popen([HS, "run", str(spec)], env=plain_ray["env"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines, first_at = [], None
    for line in run.stdout:
        lines.append(line.rstrip("\n"))
        if line.strip() == "first":
            first_at = time.time()
            assert _job_by_name(plain_ray["env"], "streamed")["state"] == "running"  # not printed at the end
    run.wait(timeout=120)
    ended_at = time.time()
    assert run.returncode == RunExit.SUCCEEDED, run.stderr.read()
    assert first_at is not None and "second" in lines
    assert ended_at - first_at > 3  # "first" arrived while the job was still sleeping
    assert "succeeded" in run.stderr.read()


def test_run_exits_with_the_failing_jobs_own_code(plain_ray, tmp_path):
    spec = _spec(tmp_path, "fails", command=["python", "-c", "import sys; print('partial'); sys.exit(3)"])
    run = _hs(plain_ray["env"], "run", str(spec))
    assert run.returncode == 3, run.stderr
    assert "partial" in run.stdout and "exit code 3" in run.stderr


def test_run_codes_for_rejected_unreachable_and_cancelled(plain_ray, tmp_path):
    env = plain_ray["env"]
    huge = _hs(env, "run", str(_spec(tmp_path, "huge", command=["true"], memory_mib=50000)))
    assert huge.returncode == RunExit.REJECTED and "memory_mib" in huge.stderr
    nowhere = _hs({**env, "RAY_ADDRESS": f"127.0.0.1:{free_port()}"}, "run", str(_spec(tmp_path, "x", command=["true"])))
    assert nowhere.returncode == RunExit.UNREACHABLE and "no Ray cluster answers" in nowhere.stderr
    spec = _spec(tmp_path, "stopped", command=["python", "-c", "import time; print('up', flush=True); time.sleep(600)"])
    run = subprocess.Popen([HS, "run", str(spec)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in run.stdout:  # after the scheduler's header line: the job runs
        if line.strip() == "up":
            break
    run.send_signal(signal.SIGTERM)  # what `ray job stop` sends
    assert run.wait(timeout=60) == RunExit.CANCELLED
    deadline = time.time() + 60
    while _job_by_name(env, "stopped")["state"] != "cancelled" and time.time() < deadline:
        time.sleep(0.5)
    assert _job_by_name(env, "stopped")["state"] == "cancelled"


_SUBMIT_UNDER_KILLS = """
import json, random, sys, threading, time
import ray
from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE
from hier_sched.front.connection import connect

threads, per_thread, kills_wanted, seed, workdir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4]), sys.argv[5]
scheduler = connect()
told, errors = {}, []  # submit's name -> the job id the client was told

def submitter(t):
    pause = random.Random(seed + t)
    for i in range(per_thread):
        name = f"once-{t}-{i}"
        try:
            told[name] = scheduler.submit({"name": name, "command": ["true"], "gpus": 1, "memory_mib": 3000,
                                           "estimator": "none", "workdir": workdir})["job_id"]
        except Exception as exc:
            errors.append(f"{name}: {exc!r}")
        time.sleep(pause.uniform(0.0, 0.05))

workers = [threading.Thread(target=submitter, args=(t,)) for t in range(threads)]
for w in workers:
    w.start()
chance, kills = random.Random(seed), 0
while kills < kills_wanted and any(w.is_alive() for w in workers):
    time.sleep(chance.uniform(0.1, 0.8))  # a random point of the submissions in flight
    ray.kill(ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE), no_restart=False)
    kills += 1
for w in workers:
    w.join()
jobs = [j for j in scheduler.call("status", None) if j["name"].startswith("once-")]
for job in jobs:
    scheduler.call("cancel", job["job_id"])
print(json.dumps({"kills": kills, "errors": errors, "told": told,
                  "jobs": [[j["name"], j["job_id"]] for j in jobs]}))
"""


def test_a_queue_killed_while_submissions_are_in_flight_makes_one_job_per_submit(plain_ray, tmp_path):
    """Exactly once: the queue actor is killed at random points while client threads submit; Ray
    replays the calls in flight on the restarted queue, and the client asks again after meeting the
    restart. Each submit made one job, and every job a client was told about exists."""
    threads, per_thread = 4, 12
    done = subprocess.run([sys.executable, "-c", _SUBMIT_UNDER_KILLS, str(threads), str(per_thread), "4", "7",
                           str(tmp_path)], env=plain_ray["env"], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["kills"] >= 3 and seen["errors"] == []
    names = [name for name, _ in seen["jobs"]]
    assert sorted(names) == sorted(seen["told"]) and len(names) == threads * per_thread  # one job per submit
    assert {job for _, job in seen["jobs"]} == set(seen["told"].values())  # the jobs the clients were told of


def test_down_stops_the_scheduler_but_not_a_ray_it_did_not_start(plain_ray, tmp_path):
    """Last in the module: the scheduler is gone afterwards."""
    down = _hs(plain_ray["up_env"], "down")
    assert down.returncode == 0 and "scheduler actor(s) stopped" in down.stdout, down.stdout + down.stderr
    assert gcs_answers(plain_ray["address"]) and local_ray_alive(plain_ray["ray"])
    orphan = _hs(plain_ray["env"], "submit", str(_spec(tmp_path, "late", command=["true"])))
    assert orphan.returncode == 1
    assert "runs no hier_sched scheduler" in orphan.stderr
    assert f"hier-sched up --address {plain_ray['address']}" in orphan.stderr

