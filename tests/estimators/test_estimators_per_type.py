"""One trace, an estimate per GPU type: what depends on the device is applied per type."""

from __future__ import annotations

import pytest
from torch import nn

from estimators import estimate_memory
from estimators import trace_estimator
from estimators.trace_estimator import TraceResult, TraceSims, trace_sims
from hier_sched.core.gpu_types import GPU_TYPES, gpu_type

MIB = 2**20


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


@pytest.fixture
def worker_calls(monkeypatch):
    """How many requests reached the tracing worker (the trace cache emptied first)."""
    calls = []
    real = trace_estimator.call_in_worker
    monkeypatch.setattr(trace_estimator, "_trace_cache", type(trace_estimator._trace_cache)())

    def counting(payload, timeout_s):
        calls.append(payload)
        return real(payload, timeout_s)

    monkeypatch.setattr(trace_estimator, "call_in_worker", counting)
    return calls


def test_estimates_for_two_gpu_types_trace_once_and_differ_by_cublas_and_baseline(worker_calls, tmp_path):
    a100 = estimate_memory(small_cnn, batch_size=4, input_shape=(3, 16, 16), gpu="A100-40GB", method="trace",
                           state_dir=str(tmp_path))
    h100 = estimate_memory(small_cnn, batch_size=4, input_shape=(3, 16, 16), gpu="H100-80GB", method="trace",
                           state_dir=str(tmp_path))
    assert len(worker_calls) == 1
    a, h = gpu_type("A100-40GB"), gpu_type("H100-80GB")
    expected = (h.cublas_workspace_mib - a.cublas_workspace_mib) + (h.cuda_context_mib - a.cuda_context_mib)
    assert h100.peak_mib - a100.peak_mib == pytest.approx(expected)
    assert h100.parts.tensors_mib == a100.parts.tensors_mib
    assert h100.parts.allocator_mib == a100.parts.allocator_mib


def test_another_batch_size_is_another_trace(worker_calls):
    trace_sims(small_cnn, batch_size=4, input_shape=(3, 16, 16))
    trace_sims(small_cnn, batch_size=8, input_shape=(3, 16, 16))
    trace_sims(small_cnn, batch_size=4, input_shape=(3, 16, 16))
    assert len(worker_calls) == 2


def test_a_type_whose_capacity_the_trace_exceeds_gets_its_own_simulation():
    unbounded = TraceResult(70_000 * MIB, 60_000 * MIB, 0, 0, 0, 1.0)
    capped = TraceResult(39_000 * MIB, 38_000 * MIB, 0, 0, 0, 1.0)
    sims = TraceSims(unbounded, {"A100-40GB": capped})
    assert sims.for_type("A100-40GB") is capped
    assert sims.for_type("H100-80GB") is unbounded


def test_a_model_over_a_small_gpu_is_simulated_at_that_gpus_capacity():
    # 6 x 1 GiB live activations: over a T4's and K80's capacity, under an A100's.
    model = lambda: nn.Sequential(*[nn.Linear(2**14, 2**14) for _ in range(6)])  # noqa: E731
    sims = trace_sims(model, batch_size=2**14, input_shape=(2**14,), optimizer="sgd")
    assert "A100-40GB" not in sims.bounded and "H100-80GB" not in sims.bounded
    assert {"T4", "K80"} <= set(sims.bounded)
    assert sims.bounded["T4"].peak_reserved_bytes <= sims.unbounded.peak_reserved_bytes


def test_every_known_gpu_type_rounds_allocations_alike():
    # The unbounded simulation is shared by all types: it is only exact while they round alike.
    rounding = {(t.allocator_block_bytes, t.small_segment_mib, t.large_segment_mib) for t in GPU_TYPES.values()}
    assert len(rounding) == 1
