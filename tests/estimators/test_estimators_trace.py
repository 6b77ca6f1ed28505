"""Trace path, allocator simulation, the public estimate_memory API and its fallbacks."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from estimators import estimate_memory, job_signature, record_observed_peak
from estimators.allocator import AllocEvent, simulate
from estimators.trace_estimator import AUTO_MARGIN, TraceFailed, run_trace
from estimators.types import EstimatorError
from hier_sched.core.gpu_types import gpu_type

A100 = gpu_type("A100-40GB")
MIB = 2**20


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise RuntimeError("this model cannot run")


class HangsWhileTracing(nn.Module):
    """Runs normally in the process that built it, hangs in the forked tracer (like a model that
    deadlocks in backward): the trace must time out, the feature fallback must still work."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.home_pid = os.getpid()

    def forward(self, x):
        if os.getpid() != self.home_pid:
            time.sleep(60)
        return self.fc(x)


# --- allocator ---------------------------------------------------------------------------------

def test_allocator_rounds_pools_and_reuses_blocks():
    r = simulate([AllocEvent(1, 100)], A100)
    assert r.peak_allocated_bytes == 512 and r.peak_reserved_bytes == 2 * MIB
    # a 3 MiB request opens a 20 MiB large segment; a freed block is reused, not re-reserved
    r = simulate([AllocEvent(1, 3 * MIB), AllocEvent(1, 0), AllocEvent(2, 3 * MIB)], A100)
    assert r.peak_reserved_bytes == 20 * MIB and r.segments == 1
    # >= 10 MiB requests get their own segment rounded to 2 MiB
    assert simulate([AllocEvent(1, 11 * MIB)], A100).peak_reserved_bytes == 12 * MIB


def test_allocator_fragmentation_costs_memory():
    # Two 8 MiB holes in separate segments cannot hold one 16 MiB tensor.
    events = [AllocEvent(1, 12 * MIB), AllocEvent(2, 12 * MIB), AllocEvent(1, 0), AllocEvent(2, 0),
              AllocEvent(3, 16 * MIB)]
    r = simulate(events, A100)
    assert r.peak_reserved_bytes == 12 * MIB + 12 * MIB + 16 * MIB
    # Adjacent free blocks merge: 4 + 4 MiB freed next to each other serve an 8 MiB request.
    merged = simulate([AllocEvent(1, 4 * MIB), AllocEvent(2, 4 * MIB), AllocEvent(3, 4 * MIB), AllocEvent(1, 0),
                       AllocEvent(2, 0), AllocEvent(4, 8 * MIB)], A100)
    assert merged.segments == 1


def test_at_capacity_cached_segments_are_freed_and_workspaces_yield():
    cap = 50 * MIB
    # A freed 30 MiB segment is cached; a 40 MiB tensor does not fit in it. Unlimited, both stay
    # reserved (70 MiB); at a 50 MiB capacity the allocator frees the cached one first.
    reuse = [AllocEvent(1, 30 * MIB), AllocEvent(1, 0), AllocEvent(2, 40 * MIB)]
    assert simulate(reuse, A100).peak_reserved_bytes == 70 * MIB
    assert simulate(reuse, A100, capacity_bytes=cap).peak_reserved_bytes == 40 * MIB
    # A segment with a live block is not freed: the workspace finds no room and is left out ...
    live = [AllocEvent(1, 40 * MIB), AllocEvent(2, 20 * MIB, workspace=True), AllocEvent(2, 0)]
    assert simulate(live, A100, capacity_bytes=cap).peak_reserved_bytes == 40 * MIB
    assert simulate(live, A100).peak_reserved_bytes == 60 * MIB
    # ... but a tensor is not: the job needs more than the GPU, and the peak says so.
    tensor = [AllocEvent(1, 40 * MIB), AllocEvent(2, 20 * MIB)]
    assert simulate(tensor, A100, capacity_bytes=cap).peak_reserved_bytes == 60 * MIB
    # A partly used segment stays: 5 MiB requests share one 20 MiB segment, one of them still live.
    shared = [AllocEvent(1, 5 * MIB), AllocEvent(2, 5 * MIB), AllocEvent(1, 0), AllocEvent(3, 40 * MIB)]
    assert simulate(shared, A100, capacity_bytes=cap).peak_reserved_bytes == 60 * MIB


# --- tracing -----------------------------------------------------------------------------------

def test_trace_counts_adam_state_and_grows_with_batch():
    small = run_trace(mlp, batch_size=8, input_shape=(256,), optimizer="adam")
    sgd = run_trace(mlp, batch_size=8, input_shape=(256,), optimizer="sgd")
    big = run_trace(mlp, batch_size=4096, input_shape=(256,), optimizer="adam")
    params = sum(p.numel() for p in mlp().parameters()) * 4
    assert small.param_bytes == params
    assert small.peak_allocated_bytes >= 4 * params  # weights + grads + 2 Adam moments
    assert small.peak_allocated_bytes - sgd.peak_allocated_bytes >= 0.9 * params  # Adam's 2nd moment
    assert big.peak_allocated_bytes > small.peak_allocated_bytes + 4096 * 1024 * 4
    assert small.peak_reserved_bytes >= small.peak_allocated_bytes


def test_trace_of_a_real_module_leaves_it_untouched():
    model = small_cnn()
    before = [p.detach().clone() for p in model.parameters()]
    est = estimate_memory(model, batch_size=4, input_shape=(3, 16, 16), method="trace")
    assert est.method == "trace" and est.peak_mib > A100.cuda_context_mib
    assert all((a == b).all() for a, b in zip(before, model.parameters()))
    assert not any(p._is_view() or type(p).__name__ == "FakeTensor" for p in model.parameters())


def test_estimate_contract_and_bounds():
    est = estimate_memory(small_cnn, batch_size=8, input_shape=(3, 32, 32), method="trace")
    assert est.low_mib <= est.peak_mib <= est.high_mib and est.seconds > 0
    other = estimate_memory(small_cnn, batch_size=8, input_shape=(3, 32, 32), method="trace", gpu="T4")
    assert other.peak_mib - est.peak_mib == pytest.approx(
        gpu_type("T4").cuda_context_mib - A100.cuda_context_mib, abs=1)


def test_faketensor_thesis_sees_less_than_the_full_trace():
    full = estimate_memory(small_cnn, batch_size=64, input_shape=(3, 32, 32), method="trace")
    thesis = estimate_memory(small_cnn, batch_size=64, input_shape=(3, 32, 32), method="faketensor")
    assert thesis.peak_mib < full.peak_mib - A100.cuda_context_mib


def test_broken_model_falls_back_and_says_so():
    with pytest.raises(TraceFailed, match="RuntimeError"):
        estimate_memory(Broken, batch_size=2, input_shape=(4,), method="trace")
    # auto cannot extract features either (forward raises): a clear error, never a silent 0
    with pytest.raises(EstimatorError, match="trace failed"):
        estimate_memory(Broken, batch_size=2, input_shape=(4,))


def test_timeout_falls_back_to_ml(tmp_path):
    est = estimate_memory(HangsWhileTracing(), batch_size=2, input_shape=(4,), timeout_s=2, state_dir=str(tmp_path))
    assert "trace failed: timeout" in est.method and est.method.startswith("auto:ml-mlp")
    assert est.peak_mib == est.high_mib > 0


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=0, input_shape=(4,)), "batch_size"),
    (dict(batch_size=2, input_shape=(0, 4)), "input_shape"),
    (dict(batch_size=2, input_shape=(1 << 20, 1 << 20)), "not a real input"),
    (dict(batch_size=2, input_shape=(4,), method="magic"), "method"),
    (dict(batch_size=2, input_shape=(4,), gpu="B9000"), "unknown GPU"),
    (dict(batch_size=2, input_shape=(4,), dtype="int3"), "dtype"),
    (dict(batch_size=2), "input_shape"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises((EstimatorError, ValueError), match=message):
        estimate_memory(mlp, **{"method": "trace", **kwargs})


def test_shape_mismatch_is_reported():
    with pytest.raises(EstimatorError, match="forward pass failed.*reduction dim"):
        estimate_memory(mlp, batch_size=2, input_shape=(7,), method="ml")


def test_auto_uses_a_recorded_peak(tmp_path):
    sig = job_signature(mlp, batch_size=8, input_shape=(256,))
    record_observed_peak(sig, 2000.0, state=tmp_path)
    record_observed_peak(sig, 1800.0, state=tmp_path)
    est = estimate_memory(mlp, batch_size=8, input_shape=(256,), state_dir=str(tmp_path))
    assert est.method == "auto:measured (2 runs)" and est.peak_mib == pytest.approx(2000 * 1.03)
    other = job_signature(mlp, batch_size=16, input_shape=(256,))
    assert other != sig
    with pytest.raises(EstimatorError):
        record_observed_peak(sig, float("nan"), state=tmp_path)


def test_state_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(tmp_path))
    record_observed_peak("abc", 100.0)
    assert (tmp_path / "observed_peaks.json").is_file()


def test_auto_reserves_the_best_trace_estimate_plus_its_margin(tmp_path):
    trace = estimate_memory(small_cnn, batch_size=8, input_shape=(3, 32, 32), method="trace")
    auto = estimate_memory(small_cnn, batch_size=8, input_shape=(3, 32, 32), state_dir=str(tmp_path))
    assert auto.method == "auto:trace"
    assert auto.peak_mib == pytest.approx(trace.peak_mib * (1 + AUTO_MARGIN))
    # the wide bound is still there for whoever wants it, and is not what auto reserves
    assert auto.high_mib == pytest.approx(trace.high_mib) and auto.peak_mib < auto.high_mib


def test_token_models_get_integer_inputs():
    def lm() -> nn.Module:
        return nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(16 * 12, 100))

    est = estimate_memory(lm, batch_size=4, input_shape=(12,), method="trace")
    assert est.peak_mib > 0
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("name,published", [
    ("resnet50", 25_557_032), ("vgg16", 138_357_544), ("mobilenet_v2", 3_504_872), ("gpt2_large", 774_030_080),
])
def test_zoo_matches_published_parameter_counts(name, published):
    from estimators.zoo import build

    with torch.device("meta"):
        model = build(name).factory()
    assert sum(p.numel() for p in model.parameters()) == published


class _Blocks(nn.Module):
    """Two wide layers; ``read_values`` makes the forward branch on a tensor value, as masks,
    ``.item()`` and ``nonzero`` do in real models — fake tensors cannot run that."""

    def __init__(self, read_values: bool):
        super().__init__()
        self.read_values = read_values
        self.a, self.b = nn.Linear(512, 2048), nn.Linear(2048, 10)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.read_values and h.sum().item() < 0:  # never true: the branch only has to be decided
            h = -h
        return self.b(h)


def test_a_model_that_reads_tensor_values_is_run_for_real_with_the_same_accounting():
    plain = estimate_memory(lambda: _Blocks(False), batch_size=64, input_shape=(512,), method="trace")
    reading = estimate_memory(lambda: _Blocks(True), batch_size=64, input_shape=(512,), method="trace")
    assert plain.method == "trace" and reading.method == "trace:cpu-run"
    assert reading.peak_mib == plain.peak_mib and reading.low_mib == plain.low_mib
    auto = estimate_memory(lambda: _Blocks(True), batch_size=64, input_shape=(512,))
    assert auto.method == "auto:trace:cpu-run"


def test_a_real_run_past_the_host_memory_budget_is_refused_by_name(monkeypatch):
    import estimators.trace_estimator as te

    monkeypatch.setattr(te, "REAL_RUN_MEMORY_SHARE", 1e-6)  # a few KiB of the host
    # The batch alone is 128 MiB: more than the budget plus whatever free memory the forked child
    # inherits from this process's allocator (the cap limits new mappings only).
    with pytest.raises(TraceFailed, match="host memory budget"):
        run_trace(lambda: _Blocks(True), batch_size=65536, input_shape=(512,), real_tensors=True)


def test_a_job_whose_workspaces_would_overflow_the_gpu_is_estimated_within_it(tmp_path):
    """One wide 3x3 convolution at batch 72 on a K80 (11441 MiB): its tensors take ~7.5 GiB, its
    Winograd workspaces would push the reserved memory past the GPU. A real run caps them (cached
    segments freed, other algorithms), so the estimate is the GPU at most, not a refusal."""
    def wide_conv() -> nn.Module:
        return nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(64, 10))

    k80 = gpu_type("K80")
    est = estimate_memory(wide_conv, batch_size=72, input_shape=(64, 256, 256), gpu="K80", method="trace")
    assert 0.8 * k80.memory_mib < est.peak_mib <= k80.memory_mib
    assert est.high_mib <= k80.memory_mib
    auto = estimate_memory(wide_conv, batch_size=72, input_shape=(64, 256, 256), gpu="K80", state_dir=str(tmp_path))
    assert auto.peak_mib <= k80.memory_mib


def test_data_parallel_adds_gradient_buckets_and_its_own_signature(tmp_path):
    def wide() -> nn.Module:
        return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 10))

    params_mib = (2048 * 4096 + 4096 + 4096 * 10 + 10) * 4 / MIB
    alone = estimate_memory(wide, batch_size=32, input_shape=(2048,), method="trace")
    ddp = estimate_memory(wide, batch_size=32, input_shape=(2048,), method="trace", data_parallel=True)
    # One more copy of the gradients, in 25 MiB buckets (the last one smaller) rounded by the allocator.
    assert params_mib <= ddp.peak_mib - alone.peak_mib <= params_mib + 20
    kwargs = dict(batch_size=32, gpu="A100-40GB", input_shape=(2048,))
    assert job_signature(wide, **kwargs) != job_signature(wide, data_parallel=True, **kwargs)
    record_observed_peak(job_signature(wide, **kwargs), 1000.0, state=tmp_path)  # a 1-GPU run ...
    auto = estimate_memory(wide, batch_size=32, input_shape=(2048,), data_parallel=True, state_dir=str(tmp_path))
    assert auto.method.startswith("auto:trace")  # ... teaches nothing about the 2-GPU job


class _SharedEmbeddingSeq2Seq(nn.Module):
    """One embedding module reached from three places and a keyword-only decoder input, as in
    T5/BART: ``Module.to_empty`` cannot materialise it, and it needs two named inputs."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(1000, 64)
        self.encoder_embed, self.decoder_embed = self.shared, self.shared
        self.mix = nn.Linear(64, 64)
        self.head = nn.Linear(64, 1000, bias=False)
        self.head.weight = self.shared.weight  # tied output layer

    def forward(self, input_ids, *, decoder_input_ids):
        memory = self.mix(self.encoder_embed(input_ids)).mean(dim=1, keepdim=True)
        return self.head(self.decoder_embed(decoder_input_ids) + memory)


def test_shared_modules_and_keyword_inputs_are_traced_with_tied_weights_counted_once():
    ids = torch.randint(0, 1000, (4, 16))
    result = run_trace(_SharedEmbeddingSeq2Seq, batch_size=4, sample_input={"input_ids": ids, "decoder_input_ids": ids})
    assert result.param_bytes == (1000 * 64 + 64 * 64 + 64) * 4  # the tied embedding once
    est = estimate_memory(_SharedEmbeddingSeq2Seq, batch_size=4, method="trace",
                          sample_input={"input_ids": ids, "decoder_input_ids": ids})
    assert est.method == "trace"


class _ComputesWhileBuilding(nn.Module):
    """Reads tensor values in ``__init__`` (as timm's RegNet does with ``torch.unique``), which the
    meta device cannot: the model is built with real CPU weights and traced on fakes all the same."""

    def __init__(self):
        super().__init__()
        width = int(torch.tensor([64, 64, 128]).unique().numel()) * 256
        self.a, self.b = nn.Linear(512, width), nn.Linear(width, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_factory_that_computes_while_building_is_built_on_the_cpu_and_traced():
    result = run_trace(_ComputesWhileBuilding, batch_size=8, input_shape=(512,))
    assert result.param_bytes == (512 * 512 + 512 + 512 * 10 + 10) * 4
    est = estimate_memory(_ComputesWhileBuilding, batch_size=8, input_shape=(512,), method="trace")
    assert est.method == "trace"
