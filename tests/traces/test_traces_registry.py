"""``known_traces`` and ``describe``."""

from __future__ import annotations

import pytest

from traces import ClusterHint, Trace, TraceJob, describe, known_traces, load_trace


def test_every_known_name_loads():
    names = known_traces()
    assert "carma:philly_heavy-60-tasks" in names and "openb:gpushare100" in names
    assert sum(n.startswith("gavel:") for n in names) == 15
    for name in names:
        if not name.startswith(("synthetic:", "philly-vc:", "helios-vc:")):  # templates
            assert load_trace(name).jobs, name


def test_describe_reports_counts_hours_and_memory():
    jobs = [TraceJob("a", 0, "w", 2, 3600, 1000), TraceJob("b", 7200, "w", 1, 1800, 50000, gpumemnet_mib=40000)]
    text = describe(Trace("toy", jobs, ClusterHint(nodes=1, gpus_per_node=4)))
    assert "toy: 2 jobs; cluster 1 x 4 A100-40GB" in text
    assert "GPU-hours     2.5 solo; #GPUs: 1: 1, 2: 1" in text
    assert "<2: 1" in text and ">40: 1" in text
    assert "gpumemnet 1 (1 failed)" in text
    assert "unschedulable 1 jobs" in text


@pytest.mark.parametrize("name", ["openb:default", "synthetic:philly?jobs=500&gpus=20"])
def test_describe_real_traces(name):
    trace = load_trace(name)
    text = describe(trace)
    assert f"{len(trace.jobs):,} jobs" in text and "GPU-hours" in text
    assert all(f"note: {n}" in text for n in trace.notes)
