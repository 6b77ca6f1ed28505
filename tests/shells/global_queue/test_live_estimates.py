"""What the global queue believes a submitted job needs (global_queue.estimates). No Ray."""

from __future__ import annotations

import pytest

from global_queue.estimates import estimate_for_spec
from hier_sched.core.spec import SpecError, parse_spec


def _spec(**fields):
    return parse_spec({"name": "j", "command": ["true"], **fields})


def test_declared_memory_wins_over_every_estimator():
    belief = estimate_for_spec(_spec(memory_mib=7106, estimator="auto"), "A100-40GB")
    assert (belief.need_mib, belief.source, belief.learns) == (7106, "declared memory_mib", False)


def test_none_gives_no_estimate_and_oracle_the_true_peak():
    assert estimate_for_spec(_spec(estimator="none"), "A100-40GB").need_mib is None
    oracle = _spec(estimator="oracle", emulation={"peak_mib": 12666, "duration_s": 100})
    assert estimate_for_spec(oracle, "A100-40GB").need_mib == 12666


def test_an_estimator_without_a_model_factory_has_nothing_to_estimate_from():
    belief = estimate_for_spec(_spec(estimator="auto"), "A100-40GB")
    assert belief.need_mib is None and "needs model.factory" in belief.source


def test_a_broken_model_factory_is_rejected_with_the_field_named():
    spec = _spec(estimator="horus", model={"factory": "no_such_module_hs:build", "batch_size": 8})
    with pytest.raises(SpecError, match=r"model\.factory: estimator 'horus' failed .*ModuleNotFoundError"):
        estimate_for_spec(spec, "A100-40GB")
    with pytest.raises(SpecError, match="model.batch_size"):
        estimate_for_spec(_spec(estimator="horus", model={"factory": "pkg.mod:build"}), "A100-40GB")


WIDE_MLP = "tests.shells.global_queue.test_live_estimates:wide_mlp"


def wide_mlp():
    """A module factory the spec can name (``WIDE_MLP``): 8.4 M parameters."""
    from torch import nn

    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 10))


def test_a_multi_gpu_job_is_estimated_with_its_gradient_buckets():
    model = {"factory": WIDE_MLP, "batch_size": 32, "input_shape": [2048]}
    one = estimate_for_spec(_spec(estimator="ml", gpus=1, model=model), "A100-40GB").need_mib
    two = estimate_for_spec(_spec(estimator="ml", gpus=2, model=model), "A100-40GB").need_mib
    params_mib = (2048 * 4096 + 4096 + 4096 * 10 + 10) * 4 / 2**20
    assert two - one == pytest.approx(params_mib)


def test_the_estimate_source_names_the_trace_and_its_baseline(tmp_path, monkeypatch):
    from estimators.baseline import CONFIG_ENV

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(tmp_path))
    spec = _spec(estimator="auto", model={"factory": WIDE_MLP, "batch_size": 4, "input_shape": [2048]})
    belief = estimate_for_spec(spec, "H100-80GB")
    assert belief.source.startswith("estimator auto:trace; baseline 1500 MiB, not measured on any H100-80GB node")
