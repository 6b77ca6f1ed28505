"""The risk score over a rolling window; runs of samples equal the same samples one by one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hier_sched.core.gpu import GpuSample
from hier_sched.core.monitoring import GpuMonitor, RiskWindow


def reference_risk(samples, window):
    """The thesis formula evaluated directly on the last `window` one-second samples."""
    alpha = 2 / (window + 1)
    ema = samples[0]
    for v in samples[1:]:
        ema = alpha * v + (1 - alpha) * ema
    w = np.array(samples[-window:])
    return 0.2 * w.mean() + 0.2 * np.median(w) + 0.3 * np.quantile(w, 0.95) + 0.1 * np.quantile(w, 0.5) + 0.2 * ema


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 50)), min_size=1, max_size=12),
    window=st.integers(1, 40),
)
def test_runs_equal_one_second_samples(runs, window):
    batched, single = RiskWindow(window), RiskWindow(window)
    flat = []
    for value, count in runs:
        batched.observe(value, count)
        for _ in range(count):
            single.observe(value)
            flat.append(value)
    assert batched.risk() == pytest.approx(single.risk(), abs=1e-9)
    assert batched.risk() == pytest.approx(reference_risk(flat, window), abs=1e-9)
    assert len(batched) == min(window, len(flat))


def test_window_forgets_old_samples_and_weights_p95():
    w = RiskWindow(30)
    w.observe(1.0, 100)
    w.observe(0.0, 30)
    assert w.mean() == 0.0 and w.quantile(0.95) == 0.0
    assert 0.0 < w.risk() < 0.2  # only the EMA remembers the busy past
    w2 = RiskWindow(30)
    w2.observe(0.0, 27)
    w2.observe(1.0, 3)  # a 10 % burst moves p95, not the median
    assert w2.quantile(0.5) == 0.0 and w2.quantile(0.95) == 1.0


def test_empty_window_is_zero_and_bad_size_rejected():
    assert RiskWindow().risk() == 0.0
    with pytest.raises(ValueError):
        RiskWindow(0)


def test_gpu_monitor_tracks_three_metrics():
    m = GpuMonitor(10)
    m.observe(GpuSample(0, "u", 40000, 1000, smact=0.9, smocc=0.5, drama=0.2), count=10)
    r = m.risk()
    assert r.smact == pytest.approx(0.9) and r.smocc == pytest.approx(0.5) and r.drama == pytest.approx(0.2)
    assert m.last.memory_used_mib == 1000
