"""Estimates made where the job's code lives, end to end on a local ``hier-sched up --emulated``
cluster (2 nodes x 1 emulated A100-40GB), as users submit:

* a model factory that exists only in a project directory is estimated by the trace for the three
  ways in (``ray job submit --working-dir .``, ``hier-sched submit`` from that directory,
  ``hs.submit`` in Python there), and the job succeeds with ``estimate_source`` from the trace and
  an estimate per GPU type of the cluster; so is the user's own training step (``model.step``);
* the queue actor's process never imports the user's module (a marker file written at import
  names every process that did);
* a factory that never returns and one that allocates 50 GB of host memory each fail only their
  own job, with the reason, while other jobs run and ``status`` answers within 1 s throughout;
* a queue actor that dies while an estimate is made asks for it again once Ray restarted it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml
from tests.helpers.cli_cluster import HS, cli_cluster, hs, job_status


RAY = str(Path(HS).parent / "ray")
STUCK_TIMEOUT_S = 15  # the cluster's estimate time budget in these tests (HIER_SCHED_ESTIMATE_TIMEOUT_S)
HOST_MIB = 4096  # and its host-memory budget (HIER_SCHED_ESTIMATE_HOST_MIB)
MODEL = """
import os, time
from torch import nn

with open({marker!r}, "a") as fh:  # who imported this module
    fh.write(f"{{os.getpid()}} {{os.getppid()}}\\n")


def build():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10))


def slow_build():
    time.sleep(10)
    return build()


def never():
    time.sleep(10**6)


class LoraLinear(nn.Module):  # a frozen base and a trained low-rank update, as PEFT's LoRA
    def __init__(self, d_in, d_out, r=8):
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False).requires_grad_(False)
        self.a = nn.Linear(d_in, r, bias=False)
        self.b = nn.Linear(r, d_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x)) * 2.0


class Block(nn.Module):  # a Llama-style decoder block: RMSNorm, attention with LoRA on q and v, SwiGLU
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q, self.v = LoraLinear(d, d), LoraLinear(d, d)
        self.k = nn.Linear(d, d, bias=False).requires_grad_(False)
        self.o = nn.Linear(d, d, bias=False).requires_grad_(False)
        self.gate, self.up = (nn.Linear(d, 4 * d, bias=False).requires_grad_(False) for _ in range(2))
        self.down = nn.Linear(4 * d, d, bias=False).requires_grad_(False)

    def forward(self, x):
        import torch.nn.functional as F

        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def own_step():  # the user's own step: a LoRA fine-tune written for CUDA, bf16 autocast, checkpointed blocks
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    embed = nn.Embedding(1000, 256).requires_grad_(False).cuda()
    blocks = nn.ModuleList(Block() for _ in range(4)).cuda()
    head = nn.Linear(256, 1000, bias=False).requires_grad_(False).cuda()
    opt = torch.optim.AdamW([p for p in blocks.parameters() if p.requires_grad])

    def step():
        ids = torch.zeros(4, 256, dtype=torch.long, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = embed(ids)
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=False)
            logits = head(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def hog():
    return bytearray(50 * 2**30)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cli_cluster(tmp_path_factory.mktemp("state"), nodes=2, gpus_per_node=1,
                     HIER_SCHED_ESTIMATE_TIMEOUT_S=str(STUCK_TIMEOUT_S),
                     HIER_SCHED_ESTIMATE_HOST_MIB=str(HOST_MIB)) as started:
        yield started


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project directory whose model module exists nowhere else."""
    root = tmp_path_factory.mktemp("project")
    module = f"hs_user_{uuid.uuid4().hex[:8]}"
    marker = root / "imported_by.txt"
    (root / f"{module}.py").write_text(textwrap.dedent(MODEL.format(marker=str(marker))))
    return {"root": root, "module": module, "marker": marker}


def write_spec(project, name: str, factory: str, batch: int = 32, **fields) -> str:
    """Each path's job has its own batch size: a peak measured on an earlier run of the same job
    would replace its estimate (``auto`` learns)."""
    spec = {"name": name, "command": ["python", "-c", "print('training')"], "gpus": 1, "estimator": "auto",
            "model": {"factory": f"{project['module']}:{factory}", "batch_size": batch, "input_shape": [3, 64, 64]},
            "emulation": {"peak_mib": 3000, "duration_s": 100, "smact": 0.4}, **fields}
    (project["root"] / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return f"{name}.yaml"


def in_project(cluster, project, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=project["root"], env=cluster["env"], capture_output=True, text=True,
                          timeout=timeout)


def assert_traced(status: dict) -> None:
    assert status["state"] == "succeeded", status
    assert "trace" in status["estimate_source"], status
    assert set(status["estimates"]) == {"A100-40GB"} and status["estimates"]["A100-40GB"] > 0, status


def test_ray_job_submit_with_the_working_dir_estimates_the_factory_by_its_trace(cluster, project):
    spec = write_spec(project, "via-ray-job", "build")
    done = in_project(cluster, project, RAY, "job", "submit", "--address", cluster["info"]["dashboard_url"],
                      "--working-dir", ".", "--", "hier-sched", "run", spec)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    jobs = json.loads(hs(cluster["env"], "status", "--json").stdout)
    assert_traced(next(j for j in jobs if j["name"] == "via-ray-job"))


def test_ray_job_submit_of_a_lora_step_of_the_users_own_estimates_it_by_its_trace_and_status_shows_its_parts(
        cluster, project):
    spec = write_spec(project, "own-step", "build", model={"step": f"{project['module']}:own_step"})
    done = in_project(cluster, project, RAY, "job", "submit", "--address", cluster["info"]["dashboard_url"],
                      "--working-dir", ".", "--", "hier-sched", "run", spec)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    job = next(j for j in json.loads(hs(cluster["env"], "status", "--json").stdout) if j["name"] == "own-step")
    assert_traced(job)
    assert "trace:user-step (Ray task" in job["estimate_source"], job
    parts = job["estimate_parts"]["A100-40GB"]  # placed on it: what it holds, per GPU type of the cluster
    assert parts["tensors_mib"] > 0 and parts["baseline_mib"] > 0, job
    shown = hs(cluster["env"], "status", job["job_id"]).stdout
    assert "trace:user-step" in shown and f"A100-40GB: {job['estimates']['A100-40GB']:.0f} MiB = tensors" in shown


def test_hier_sched_submit_from_the_project_directory_answers_estimating_at_once(cluster, project):
    spec = write_spec(project, "via-cli", "build", batch=16)
    submitted = in_project(cluster, project, HS, "submit", spec, "--json", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    answer = json.loads(submitted.stdout)
    assert answer["state"] == "estimating", answer
    waited = hs(cluster["env"], "wait", answer["job_id"], "--timeout", "240", timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert_traced(job_status(cluster["env"], answer["job_id"]))


def test_hs_submit_in_python_estimates_in_the_submitting_process(cluster, project):
    script = textwrap.dedent(f"""
        import json
        import hier_sched as hs
        import {project['module']}
        h = hs.submit(["python", "-c", "print('training')"], name="via-python",
                      est={{"factory": "{project['module']}:build", "batch_size": 8, "input_shape": [3, 64, 64]}},
                      emulation={{"peak_mib": 3000, "duration_s": 100, "smact": 0.4}})
        h.result(timeout=240)
        print(json.dumps(h.status()))
    """)
    done = in_project(cluster, project, sys.executable, "-c", script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = json.loads(done.stdout.strip().splitlines()[-1])
    assert_traced(status)
    assert "in the submitting process" in status["estimate_source"]


def test_the_queue_actors_process_never_imported_the_users_module(cluster, project):
    """After the three paths above (module order): the module was imported, by other processes."""
    probe = textwrap.dedent("""
        import json
        import ray
        from ray.util.state import list_actors
        from hier_sched.front.connection import connect
        queue = connect()
        (actor,) = [a for a in list_actors(filters=[("class_name", "=", "GlobalQueue")]) if a.state == "ALIVE"]
        print(json.dumps({"pid": actor.pid, "loaded": queue.call("loaded_modules", "hs_user_")}))
    """)
    done = subprocess.run([sys.executable, "-c", probe], env=cluster["env"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    importers = [line.split() for line in project["marker"].read_text().splitlines()]
    assert importers, "the user's module was never imported: the paths above did not run"
    assert found["loaded"] == []
    assert all(str(found["pid"]) not in pair for pair in importers), (found, importers)


def test_a_stuck_and_a_hungry_factory_fail_alone_while_the_queue_answers_within_a_second(cluster, project, tmp_path):
    done = tmp_path / "done"  # the poller polls until the jobs have ended (or for its longest time)
    poller = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import json, os, sys, time
        from hier_sched.front.connection import connect
        queue = connect()
        worst, polls, end = 0.0, 0, time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end and not os.path.exists(sys.argv[2]):
            start = time.monotonic()
            queue.call("status")
            worst = max(worst, time.monotonic() - start)
            polls += 1
            time.sleep(0.25)
        print(json.dumps({"worst_s": worst, "polls": polls}))
    """), str(STUCK_TIMEOUT_S + 60), str(done)], env=cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        ids = {}
        for name, factory in (("stuck", "never"), ("hungry", "hog")):
            start = time.monotonic()
            proc = in_project(cluster, project, HS, "submit", write_spec(project, name, factory), "--json", timeout=60)
            assert proc.returncode == 0 and time.monotonic() - start < 15, proc.stderr
            ids[name] = json.loads(proc.stdout)["job_id"]
        quick = {"name": "quick", "command": ["true"], "memory_mib": 2000, "estimator": "none",
                 "emulation": {"peak_mib": 2000, "duration_s": 100}}
        (project["root"] / "quick.yaml").write_text(yaml.safe_dump(quick))
        ids["quick"] = json.loads(in_project(cluster, project, HS, "submit", "quick.yaml", "--json").stdout)["job_id"]
        hs(cluster["env"], "wait", *ids.values(), "--timeout", str(STUCK_TIMEOUT_S + 200), timeout=STUCK_TIMEOUT_S + 260)
        states = {name: job_status(cluster["env"], job) for name, job in ids.items()}
    finally:
        done.touch()
        out, err = poller.communicate(timeout=STUCK_TIMEOUT_S + 120)
    assert states["quick"]["state"] == "succeeded", states["quick"]
    stuck, hungry = states["stuck"], states["hungry"]
    assert stuck["state"] == "failed" and hungry["state"] == "failed", (stuck, hungry)
    assert stuck["reason"] == (f"rejected: model.factory {project['module']}:never: did not return within "
                               f"{STUCK_TIMEOUT_S} s (building the model)")
    assert hungry["reason"] == (f"rejected: model.factory {project['module']}:hog: building the model needs more "
                                f"than the host-memory budget ({HOST_MIB} MiB)")
    polled = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err[-2000:]}
    assert polled.get("polls", 0) > 20 and polled["worst_s"] < 1.0, polled


def test_bench_estimates_measures_an_estimate_made_in_a_ray_task(cluster):
    done = hs(cluster["env"], "bench", "estimates", "--submits", "3", "--timed", "2", "--json", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["answered_estimating"] == 3 and len(figures["warm_to_queued_s"]) == 1
    assert 0 < figures["submit_p50_ms"] <= figures["submit_p99_ms"]
    assert "trace" in figures["estimate_source"] and "Ray task" in figures["estimate_source"]
    assert set(figures["estimates"]) == {"A100-40GB"}


def test_a_restarted_queue_asks_again_for_an_estimate_it_was_waiting_for(cluster, project):
    submitted = in_project(cluster, project, HS, "submit", write_spec(project, "slow", "slow_build", batch=4),
                           "--json", timeout=60)
    job = json.loads(submitted.stdout)["job_id"]
    kill = textwrap.dedent("""
        import ray
        from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE
        from hier_sched.front.connection import connect
        connect()
        ray.kill(ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE), no_restart=False)
    """)
    assert job_status(cluster["env"], job)["state"] == "estimating"
    done = subprocess.run([sys.executable, "-c", kill], env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    waited = hs(cluster["env"], "wait", job, "--timeout", "300", timeout=360)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    status = job_status(cluster["env"], job)
    assert_traced(status)
