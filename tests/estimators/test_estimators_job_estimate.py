"""A job's estimate made where its code lives (``estimators.job_estimate``): a factory found only
in the job's directory, and factories that fail, hang or fill the host's memory, each reported
by name within the budgets, in the tracing worker's child (never in this process)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from estimators.job_estimate import estimate_for_request, estimate_model
from tests.helpers.user_models import USER_MODELS, project_module



@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project directory with a model module importable nowhere else."""
    return project_module(tmp_path_factory, USER_MODELS)


def request(project, fn: str, **kw):
    root, name = project
    return {"factory": f"{name}:{fn}", "batch_size": 8, "input_shape": [3, 32, 32], "optimizer": "adam",
            "dtype": "float32", "data_parallel": False, "estimator": "auto", "gpu_types": ["A100-40GB", "H100-80GB"],
            "workdir": str(root), "timeout_s": 60.0, "host_budget_mib": 2048.0, **kw}


def test_a_factory_in_the_jobs_directory_is_traced_for_every_gpu_type(project):
    outcome = estimate_for_request(request(project, "build"), where="test")
    assert "reject" not in outcome, outcome
    assert set(outcome["needs"]) == {"A100-40GB", "H100-80GB"}
    assert outcome["source"].startswith("auto:trace (test, ")
    # the same trace; the H100's cuBLAS workspace and process baseline are larger
    assert outcome["needs"]["H100-80GB"] > outcome["needs"]["A100-40GB"] > 0
    assert project[1] not in sys.modules  # built and traced in the worker's children only


def test_a_factory_that_never_returns_is_rejected_within_its_budget(project):
    start = time.monotonic()
    outcome = estimate_for_request(request(project, "never", timeout_s=3.0))
    assert time.monotonic() - start < 30
    assert outcome == {"reject": f"model.factory {project[1]}:never: did not return within 3 s (building the model)"}


def test_a_factory_that_fills_the_hosts_memory_is_rejected_naming_the_budget(project):
    outcome = estimate_for_request(request(project, "hog"))
    assert outcome == {"reject": f"model.factory {project[1]}:hog: building the model needs more than the "
                                 "host-memory budget (2048 MiB)"}


@pytest.mark.parametrize("fn, error", [("broken", "ValueError: no such layer size"),
                                       ("missing", "has no attribute 'missing'")])
def test_a_factory_that_raises_or_does_not_exist_is_rejected_naming_the_error(project, fn, error):
    outcome = estimate_for_request(request(project, fn))
    assert outcome["reject"].startswith(f"model.factory {project[1]}:{fn}: ") and error in outcome["reject"]


def test_a_module_found_nowhere_is_rejected_naming_it(project):
    outcome = estimate_for_request(request(project, "build", workdir=None, factory="hs_nowhere_module:build"))
    assert "No module named 'hs_nowhere_module'" in outcome["reject"]


def wide_mlp():
    from torch import nn

    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 10))


def test_a_multi_gpu_job_is_estimated_with_its_gradient_buckets():
    def need(data_parallel: bool) -> float:
        outcome = estimate_model(wide_mlp, "wide_mlp", batch_size=32, input_shape=(2048,), optimizer="adam",
                                 dtype="float32", data_parallel=data_parallel, estimator="ml",
                                 gpu_types=["A100-40GB"], timeout_s=60, host_budget_mib=2048, where="test")
        return outcome["needs"]["A100-40GB"]

    params_mib = (2048 * 4096 + 4096 + 4096 * 10 + 10) * 4 / 2**20
    assert need(True) - need(False) == pytest.approx(params_mib)


def test_a_killed_caller_takes_its_tracing_worker_and_the_stuck_child_with_it(project, tmp_path):
    """A Ray task cancelled by force is a caller killed: nothing of its estimate may live on."""
    pid_file = tmp_path / "child.pid"
    caller = subprocess.Popen(
        [sys.executable, "-c", "import json, sys; from estimators.job_estimate import estimate_for_request; "
                               "estimate_for_request(json.loads(sys.argv[1]))",
         json.dumps(request(project, "pid_then_never", timeout_s=600.0))],
        env={**os.environ, "HS_TEST_PID_FILE": str(pid_file)})
    deadline = time.monotonic() + 90
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and caller.poll() is None, "the child never started"
        time.sleep(0.2)
    child = int(pid_file.read_text())
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_model_the_trace_cannot_run_falls_back_to_the_feature_estimate_saying_why(project):
    outcome = estimate_for_request(request(project, "untraceable", input_shape=[64], gpu_types=["A100-40GB"]))
    assert "reject" not in outcome, outcome
    assert outcome["needs"]["A100-40GB"] > 0
    assert outcome["source"].startswith("auto:ml") and "trace failed" in outcome["source"]
    assert "trains on real tensors only" in outcome["source"]


LORA_LLAMA = {"hf_model_type": "llama", "hf_config": {"hidden_size": 512, "intermediate_size": 1376,
                                                      "num_hidden_layers": 4, "num_attention_heads": 8,
                                                      "num_key_value_heads": 8, "vocab_size": 32000},
              "precision": "bf16-mixed", "checkpointing": "block", "peft": "lora", "micro_batch": 2, "seq_len": 512}


def _training_request(**kw):
    from global_queue.estimates import estimate_request, needs_model_estimate
    from hier_sched.core.spec import parse_spec

    spec = parse_spec({"name": "llm", "command": ["python", "finetune.py"], "training": LORA_LLAMA})
    assert needs_model_estimate(spec)
    request = estimate_request(spec, ["A100-40GB", "H100-80GB"], timeout_s=120.0, host_budget_mib=4096.0)
    assert request["training"]["peft"] == "lora" and "factory" not in request
    return {**request, **kw}


def test_a_training_section_is_estimated_per_gpu_type_with_its_parts():
    from tests.helpers.libraries import field_library

    field_library("transformers")
    outcome = estimate_for_request(_training_request(), where="test")
    assert set(outcome["needs"]) == {"A100-40GB", "H100-80GB"}, outcome
    assert outcome["source"].startswith("auto:trace:llm (test, ")
    parts = outcome["parts"]["A100-40GB"]
    assert {"weights_mib", "gradients_mib", "optimizer_state_mib", "activations_mib", "baseline_mib",
            "margin_mib"} <= set(parts)
    assert outcome["needs"]["A100-40GB"] == pytest.approx(sum(parts.values()), abs=1.0)


def test_a_training_section_where_transformers_is_missing_is_rejected_saying_so():
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here: the estimate is made (the test above)")
    outcome = estimate_for_request(_training_request())
    assert outcome["reject"] == ("training (llama, lora): transformers is not installed where the job's code runs, "
                                 "and the section's architecture is built with it: add it to the job's runtime_env "
                                 "(pip: [transformers])")
