"""The process baseline: where it comes from (probe > learned > configured > default), how a trace
estimate is split into parts, and how finished jobs teach the baseline."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from torch import nn

from estimators import estimate_memory, job_signature, record_observed_peak
from estimators.baseline import CONFIG_ENV, MIN_LEARNED_JOBS, learn_from_peak, process_baseline, record_probe
from estimators.types import EstimatorError
from hier_sched.core.gpu_types import gpu_type

A100 = gpu_type("A100-40GB")


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def test_sources_in_order_probe_learned_configured_default(tmp_path, monkeypatch):
    base = process_baseline("A100-40GB", state=tmp_path)
    assert base.mib == A100.cuda_context_mib and base.source.startswith("default") and not base.measured
    monkeypatch.setenv(CONFIG_ENV, "A100-40GB=1400,T4=900")
    assert process_baseline("A100-40GB", state=tmp_path).mib == 1400
    assert process_baseline("T4", state=tmp_path).source == f"configured ({CONFIG_ENV})"
    assert process_baseline("V100-32GB", state=tmp_path).source.startswith("default")
    for observed in (1900, 2000, 2100)[:MIN_LEARNED_JOBS]:
        learn_from_peak("A100-40GB", "stack-a", observed, 1000, state=tmp_path)
    # an operator's figure stands for any stack; a node's own stack's measurement overrules it, and says so
    assert process_baseline("A100-40GB", state=tmp_path).mib == 1400
    learned = process_baseline("A100-40GB", state=tmp_path, stack="stack-a")
    assert learned.mib == 1000 and learned.measured and learned.source.startswith(f"learned from {MIN_LEARNED_JOBS}")
    assert "configured 1400 MiB overruled" in learned.source
    monkeypatch.delenv(CONFIG_ENV)
    assert process_baseline("A100-40GB", state=tmp_path).source.startswith(f"learned from {MIN_LEARNED_JOBS}")
    record_probe("A100-40GB", "stack-a", 640, state=tmp_path)
    probed = process_baseline("A100-40GB", state=tmp_path)
    assert probed.mib == 640 and probed.source == "probe (A100-40GB; stack-a)" and probed.high_mib() == 640


def test_without_a_stack_the_largest_recorded_baseline_of_the_type_counts(tmp_path):
    record_probe("A100-40GB", "lazy loading", 520, state=tmp_path)
    record_probe("A100-40GB", "eager loading", 1420, state=tmp_path)
    assert process_baseline("A100-40GB", state=tmp_path).mib == 1420
    assert "largest of 2 stacks" in process_baseline("A100-40GB", state=tmp_path).source
    assert process_baseline("A100-40GB", stack="lazy loading", state=tmp_path).mib == 520
    # a stack never measured falls through to the configured or default value
    assert process_baseline("A100-40GB", stack="other", state=tmp_path).source.startswith("default")


@pytest.mark.parametrize("value,message", [("lots", "not a number"), ("B9000=100", "unknown GPU type"),
                                           ("A100-40GB=-5", "positive"), ("A100-40GB", "not a number")])
def test_a_bad_configured_value_is_named(tmp_path, monkeypatch, value, message):
    monkeypatch.setenv(CONFIG_ENV, value)
    with pytest.raises((EstimatorError, ValueError), match=message):
        process_baseline("A100-40GB", state=tmp_path)


def test_a_trace_estimate_is_split_into_parts_that_add_up(tmp_path):
    est = estimate_memory(small_cnn, batch_size=32, input_shape=(3, 64, 64), method="trace", state_dir=str(tmp_path))
    parts = est.parts
    assert parts is not None and parts.total_mib() == pytest.approx(est.peak_mib)
    assert parts.baseline_mib == A100.cuda_context_mib
    assert parts.workspaces_mib > A100.cublas_workspace_mib  # 3x3 convolutions: cuDNN's Winograd workspaces
    assert parts.tensors_mib > 32 * 16 * 64 * 64 * 4 / 2**20  # at least one activation of the batch
    assert parts.allocator_mib >= 0 and parts.margin_mib == 0
    auto = estimate_memory(small_cnn, batch_size=32, input_shape=(3, 64, 64), state_dir=str(tmp_path))
    assert auto.parts is not None and auto.parts.margin_mib == pytest.approx(auto.peak_mib - est.peak_mib)
    assert auto.parts.total_mib() == pytest.approx(auto.peak_mib)


def test_a_probed_baseline_replaces_the_default_and_narrows_the_safe_bound(tmp_path):
    default = estimate_memory(mlp, batch_size=8, input_shape=(256,), method="trace", state_dir=str(tmp_path))
    record_probe("A100-40GB", "driver 550, CUDA 12.4", 1414, state=tmp_path)
    probed = estimate_memory(mlp, batch_size=8, input_shape=(256,), method="trace", state_dir=str(tmp_path))
    assert probed.peak_mib - default.peak_mib == pytest.approx(1414 - A100.cuda_context_mib)
    assert probed.parts.baseline_source == "probe (A100-40GB; driver 550, CUDA 12.4)"
    # measured: the safe bound no longer adds the top of the public range on top of the baseline
    assert probed.high_mib - probed.peak_mib < default.high_mib - default.peak_mib


def test_finished_jobs_teach_the_baseline_of_their_gpu_type(tmp_path):
    """A job's measured peak minus what its trace estimated besides the baseline is one observation;
    after MIN_LEARNED_JOBS of them the median replaces the default."""
    kwargs = dict(batch_size=8, input_shape=(256,), state_dir=str(tmp_path))
    first = estimate_memory(mlp, **kwargs)
    rest = first.parts.tensors_mib + first.parts.allocator_mib + first.parts.workspaces_mib
    signature = job_signature(mlp, batch_size=8, input_shape=(256,))
    for extra in (1400, 1420, 1450)[:MIN_LEARNED_JOBS]:
        record_observed_peak(signature, rest + extra, state=tmp_path, stack="node stack")
    base = process_baseline("A100-40GB", state=tmp_path)
    assert base.mib == pytest.approx(1420, abs=0.2) and base.source.startswith("learned")
    other = estimate_memory(small_cnn, batch_size=8, input_shape=(3, 32, 32), state_dir=str(tmp_path))
    assert other.parts.baseline_mib == pytest.approx(1420, abs=0.2)


def test_the_estimate_command_prints_the_parts(tmp_path, monkeypatch):
    from hier_sched.front.cli import main

    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "probe_models.py").write_text(
        "from torch import nn\n\ndef mlp():\n    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))\n")
    out = CliRunner().invoke(main, ["estimate", "--model", "probe_models:mlp", "--batch-size", "8", "--input-shape", "256",
                                    "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["method"] == "auto:trace"
    assert sum(v for k, v in data["parts"].items() if k.endswith("_mib")) == pytest.approx(data["peak_mib"], abs=0.5)
    text = CliRunner().invoke(main, ["estimate", "--model", "probe_models:mlp", "--batch-size", "8", "--input-shape", "256"])
    assert "baseline" in text.output and "tensors" in text.output


def test_a_placement_without_a_measured_baseline_assumes_the_top_of_the_public_range(tmp_path, monkeypatch):
    from estimators.baseline import CONTEXT_RANGE_TOP_MIB

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    safe = process_baseline("H100-80GB", state=tmp_path, unmeasured="safe")
    assert (safe.mib, safe.measured) == (CONTEXT_RANGE_TOP_MIB, False)
    assert safe.source == f"not measured on any H100-80GB node: {CONTEXT_RANGE_TOP_MIB} MiB assumed, the top of the public range"
    assert process_baseline("H100-80GB", state=tmp_path).source.startswith("default")  # offline tools keep the default
    record_probe("H100-80GB", "emulated device", 530, state=tmp_path)
    assert process_baseline("H100-80GB", state=tmp_path, unmeasured="safe").mib == 530
    monkeypatch.setenv(CONFIG_ENV, "900")  # an operator's figure is theirs to give
    assert process_baseline("T4", state=tmp_path, unmeasured="safe").mib == 900
    with pytest.raises(EstimatorError, match="unmeasured must be one of"):
        process_baseline("T4", state=tmp_path, unmeasured="guess")


def test_a_trace_estimate_for_a_cluster_says_where_its_baseline_came_from(tmp_path, monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    est = estimate_memory(small_cnn, batch_size=2, input_shape=(3, 8, 8), gpu="T4", state_dir=str(tmp_path),
                          unmeasured_baseline="safe")
    assert est.parts.baseline_mib == 1500 and est.parts.baseline_source.startswith("not measured on any T4 node")


def test_an_emulated_probe_never_stands_for_a_real_gpu_nor_overrules_a_configured_figure(tmp_path, monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    record_probe("A100-40GB", "emulated device", 510, state=tmp_path)  # what a demo's nodes leave behind
    offline = process_baseline("A100-40GB", state=tmp_path)
    assert offline.source.startswith("default") and not offline.measured
    assert process_baseline("A100-40GB", state=tmp_path, stack="emulated device").source.startswith("probe")
    monkeypatch.setenv(CONFIG_ENV, "1443")
    configured = process_baseline("A100-40GB", state=tmp_path)
    assert (configured.mib, configured.source) == (1443, f"configured ({CONFIG_ENV})")
    assert process_baseline("A100-40GB", state=tmp_path, unmeasured="safe").mib == 1443
    record_probe("A100-40GB", "driver 550, CUDA 12.4", 700, state=tmp_path)
    node = process_baseline("A100-40GB", state=tmp_path, stack="driver 550, CUDA 12.4")
    assert node.mib == 700 and "configured 1443 MiB overruled" in node.source
