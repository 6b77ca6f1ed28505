"""What the global queue believes a submitted job needs (global_queue.estimates), and how a job
whose estimate needs its model is accepted ``estimating`` and queued when the estimate arrives
(global_queue.estimate_pool), with stand-in runners. No Ray."""

from __future__ import annotations

import threading
import time

import pytest

from global_queue.estimate_pool import EstimatePool, ThreadEstimateRunner, deadline_s
from global_queue.estimates import estimate_for_spec, estimate_key, estimate_request, needs_model_estimate
from global_queue.service import QueueService
from hier_sched.core.spec import SpecError, parse_spec
from tests.helpers.fake_nodes import Nodes
from tests.helpers.user_models import USER_MODELS

FACTORY = "usermodels_hs_never_here:build"  # importable nowhere: the queue must never try


def _spec(**fields):
    return parse_spec({"name": "j", "command": ["true"], **fields})


def test_declared_memory_wins_over_every_estimator():
    belief = estimate_for_spec(_spec(memory_mib=7106, estimator="auto"))
    assert (belief.need_mib, belief.source, belief.learns) == (7106, "declared memory_mib", False)
    assert not needs_model_estimate(_spec(memory_mib=7106, estimator="auto", model={"factory": FACTORY}))


def test_none_gives_no_estimate_and_oracle_the_true_peak():
    assert estimate_for_spec(_spec(estimator="none")).need_mib is None
    oracle = _spec(estimator="oracle", emulation={"peak_mib": 12666, "duration_s": 100})
    assert estimate_for_spec(oracle).need_mib == 12666


def test_an_estimator_without_a_model_factory_has_nothing_to_estimate_from():
    belief = estimate_for_spec(_spec(estimator="auto"))
    assert belief.need_mib is None and "needs model.factory" in belief.source


def test_a_model_estimate_without_a_batch_size_is_refused_at_submit():
    spec = _spec(estimator="horus", model={"factory": "pkg.mod:build"})
    assert needs_model_estimate(spec)
    with pytest.raises(SpecError, match="model.batch_size"):
        estimate_request(spec, ["A100-40GB"], timeout_s=60, host_budget_mib=1024)


class Scripted:
    """A runner whose estimates finish when the test says so."""

    def __init__(self):
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.finished: list[tuple[str, dict]] = []

    def start(self, key, request):
        self.started.append(key)

    def poll(self):
        out, self.finished = self.finished, []
        return out

    def cancel(self, key):
        self.cancelled.append(key)


def queue(tmp_path, runner, clock=lambda: 1000.0, **kw) -> QueueService:
    return QueueService(Nodes(), state_dir=tmp_path, policy="magm", estimator="auto", clock=clock,
                        estimate_runner=runner, **kw)


def model_spec(name="m", factory=FACTORY, batch=32):
    return {"name": name, "command": ["true"], "model": {"factory": factory, "batch_size": batch,
                                                         "input_shape": [3, 64, 64]}}


def test_submit_answers_at_once_estimating_with_a_runner_that_never_answers(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    start = time.perf_counter()
    answer = q.submit(model_spec())
    took = time.perf_counter() - start
    assert answer["state"] == "estimating" and took < 0.05, (answer, took)
    q.tick()
    status = q.status(answer["job_id"])
    assert status["state"] == "estimating"
    assert status["reason"].startswith(f"estimating: auto on {FACTORY} (batch 32) for A100-40GB")
    assert "budgets: 60 s per step" in status["reason"]
    q.journal.close()


def test_jobs_of_one_estimate_key_are_estimated_once_and_queued_with_its_figures(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    a, b = (q.submit(model_spec(name))["job_id"] for name in ("a", "b"))
    other = q.submit(model_spec("c", batch=64))["job_id"]
    assert len(runner.started) == 2  # a and b share one estimate
    runner.finished.append((runner.started[0], {"needs": {"A100-40GB": 3100.0}, "source": "auto:trace (test)"}))
    q.tick()
    for job in (a, b):
        status = q.status(job)
        assert status["state"] in ("queued", "running") and status["estimate_source"] == "auto:trace (test)"
        assert status["estimates"] == {"A100-40GB": 3100.0} and status["estimate_mib"] == 3100.0
    assert q.status(other)["state"] == "estimating"
    q.journal.close()


def test_a_failed_estimate_rejects_only_its_own_jobs_naming_the_error(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    bad = q.submit(model_spec("bad"))["job_id"]
    good = q.submit({"name": "good", "command": ["true"], "memory_mib": 1000})["job_id"]
    reason = f"model.factory {FACTORY}: ModuleNotFoundError: No module named 'usermodels_hs_never_here'"
    runner.finished.append((runner.started[0], {"reject": reason}))
    q.tick()
    assert q.status(bad)["state"] == "failed" and q.status(bad)["reason"] == f"rejected: {reason}"
    assert q.status(good)["state"] in ("queued", "running")
    q.journal.close()


def test_an_estimate_past_its_deadline_is_cancelled_and_the_job_rejected_with_the_reason(tmp_path):
    runner = Scripted()
    now = [0.0]
    q = queue(tmp_path, runner, estimate_timeout_s=1.0)
    q.estimates.clock = lambda: now[0]
    job = q.submit(model_spec())["job_id"]
    now[0] = deadline_s(q.estimate_requests[job]) + 1
    q.tick()
    assert runner.cancelled == runner.started
    status = q.status(job)
    assert status["state"] == "failed" and "no answer from the estimate within" in status["reason"]
    q.journal.close()


def test_cancel_while_estimating_cancels_the_estimate_of_its_last_job(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    a, b = (q.submit(model_spec(name))["job_id"] for name in ("a", "b"))
    q.cancel(a)
    assert runner.cancelled == []  # b still waits for it
    q.cancel(b)
    assert runner.cancelled == runner.started and q.status(a)["state"] == "cancelled"
    assert q.estimate_requests == {}  # nothing owed: a restart asks for nothing
    q.journal.close()


def test_a_restarted_queue_asks_again_for_the_estimates_still_owed(tmp_path):
    first_runner = Scripted()
    first = queue(tmp_path, first_runner)
    job = first.submit(model_spec())["job_id"]
    done = first.submit({"name": "sized", "command": ["true"], "memory_mib": 1000})["job_id"]
    first.journal.close()  # the actor dies; its estimate task with it

    runner = Scripted()
    second = queue(tmp_path, runner)
    assert second.status(job)["state"] == "estimating" and runner.started == first_runner.started
    runner.finished.append((runner.started[0], {"needs": {"A100-40GB": 2000.0}, "source": "auto:trace"}))
    second.tick()
    assert second.status(job)["state"] in ("queued", "running") and second.status(done)["state"] != "estimating"
    second.journal.close()

    third = queue(tmp_path, Scripted())  # the arrival was logged: nothing is owed any more
    assert third.status(job)["estimate_mib"] == 2000.0 and third.estimates.pending == {}
    third.journal.close()


def test_a_content_addressed_estimate_is_reused_and_a_path_named_one_is_not(tmp_path):
    runner = Scripted()
    pool = EstimatePool(runner, lambda: 0.0)
    spec = _spec(model={"factory": FACTORY, "batch_size": 8}, runtime_env={"working_dir": "gcs://_ray_pkg_ab.zip"})
    uri = estimate_request(spec, ["A100-40GB"], timeout_s=60, host_budget_mib=1024)
    path = {**uri, "runtime_env": {}, "workdir": "/home/u/proj"}
    answered = []
    for request in (uri, path):
        pool.request("j1", estimate_key(request), request)
        runner.finished.append((estimate_key(request), {"needs": {"A100-40GB": 1.0}, "source": "t"}))
        pool.poll()
        pool.request("j2", estimate_key(request), request)
        answered.append([job for job, _ in pool.poll()])
    assert runner.started == [estimate_key(uri), estimate_key(path), estimate_key(path)]
    assert answered == [["j2"], []]  # the cached one is answered without a task; the other runs again


def test_a_thread_runner_reports_what_its_estimate_raised():
    gate = threading.Event()

    def estimate(request):
        gate.wait(5)
        raise RuntimeError("boom")

    runner = ThreadEstimateRunner(estimate)
    runner.start("k", {"factory": FACTORY})
    assert runner.poll() == []
    gate.set()
    deadline = time.monotonic() + 5
    while not (done := runner.poll()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == [("k", {"reject": f"model.factory {FACTORY}: the estimate failed: RuntimeError: boom"})]


def test_an_estimate_from_the_submitting_process_is_checked_and_used(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    answer = q.submit(model_spec(), estimate={"needs": {"A100-40GB": 2500.0}, "source": "auto:trace (client)"})
    assert runner.started == [] and answer["estimate_mib"] == 2500.0
    assert q.status(answer["job_id"])["estimates"] == {"A100-40GB": 2500.0}
    bad = q.submit(model_spec(), estimate={"needs": {"A100-40GB": -1}})
    assert "estimate: expected" in bad["error"]
    q.journal.close()


def test_the_estimate_task_gets_the_jobs_runtime_env_and_env_and_no_gpu():
    from global_queue.estimate_task import estimate_runtime_env

    spec = _spec(model={"factory": FACTORY, "batch_size": 8}, env={"DATA": "/d"},
                 runtime_env={"working_dir": "gcs://_ray_pkg_ab.zip", "pip": ["timm"], "env_vars": {"A": "1"}})
    env = estimate_runtime_env(estimate_request(spec, ["A100-40GB"], timeout_s=60, host_budget_mib=1024))
    assert env["working_dir"] == "gcs://_ray_pkg_ab.zip" and env["pip"] == ["timm"]
    assert env["env_vars"] == {"A": "1", "DATA": "/d", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                               "HIER_SCHED_ESTIMATING": "1"}




def test_a_failed_trace_falls_back_to_the_feature_estimate_and_status_says_why(tmp_path):
    """The whole way without Ray: the queue's own estimate runner (a thread handing the model to
    the tracing worker), the trace failing, ``auto``'s fallback, the job queued with the reason."""
    project = tmp_path / "project"
    project.mkdir()
    module = f"hs_untraceable_{tmp_path.name[-6:].replace('-', '_')}"
    (project / f"{module}.py").write_text(USER_MODELS)
    q = QueueService(Nodes(), state_dir=tmp_path / "state", policy="magm", estimator="auto", clock=lambda: 1000.0)
    spec = {**model_spec(factory=f"{module}:untraceable", batch=8), "workdir": str(project)}
    spec["model"]["input_shape"] = [64]
    job = q.submit(spec)["job_id"]
    deadline = time.monotonic() + 120
    while q.status(job)["state"] == "estimating" and time.monotonic() < deadline:
        q.tick()
        time.sleep(0.2)
    status = q.status(job)
    assert status["state"] in ("queued", "running"), status
    assert status["estimate_source"].startswith("auto:ml") and "trace failed" in status["estimate_source"]
    assert "trains on real tensors only" in status["estimate_source"]
    q.journal.close()


def test_the_estimate_source_names_the_trace_and_each_types_baseline(tmp_path, monkeypatch):
    from estimators.baseline import CONFIG_ENV
    from estimators.job_estimate import estimate_model

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(tmp_path))  # no node measured anything here
    import torch.nn as nn

    out = estimate_model(lambda: nn.Sequential(nn.Linear(64, 64)), "test:mlp", batch_size=4, input_shape=(64,),
                         optimizer="adam", dtype="float32", data_parallel=False, estimator="auto",
                         gpu_types=["H100-80GB"], timeout_s=120, host_budget_mib=4096, where="test")
    assert out["source"].startswith("auto:trace (test, ")
    assert "H100-80GB baseline 1500 MiB, not measured on any H100-80GB node" in out["source"]


def test_what_an_estimate_holds_per_gpu_type_is_kept_with_the_job_and_through_a_restart(tmp_path):
    runner = Scripted()
    q = queue(tmp_path, runner)
    traced = q.submit(model_spec("traced"))["job_id"]
    parts = {"A100-40GB": {"tensors_mib": 900.0, "allocator_mib": 60.0, "workspaces_mib": 8.0, "baseline_mib": 1500.0,
                           "baseline_source": "safe value", "margin_mib": 123.4, "junk": "dropped"},
             "T4": {"tensors_mib": 1.0}}  # a type the estimate does not name: dropped
    runner.finished.append((runner.started[0], {"needs": {"A100-40GB": 2591.4}, "source": "auto:trace (test)",
                                                "parts": parts}))
    client = q.submit(model_spec("client"), estimate={"needs": {"A100-40GB": 2500.0}, "source": "auto:trace (here)",
                                                      "parts": {"A100-40GB": {"tensors_mib": "x", "baseline_mib": 500}}})
    q.tick()
    kept = {k: v for k, v in parts["A100-40GB"].items() if k != "junk"}
    assert q.status(traced)["estimate_parts"] == {"A100-40GB": kept}
    assert q.status(client["job_id"])["estimate_parts"] == {"A100-40GB": {"baseline_mib": 500.0}}
    q.journal.close()
    again = queue(tmp_path, Scripted())
    assert again.status(traced)["estimate_parts"] == {"A100-40GB": kept}
    assert again.status(client["job_id"])["estimate_parts"] == {"A100-40GB": {"baseline_mib": 500.0}}
    again.journal.close()
