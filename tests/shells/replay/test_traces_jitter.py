"""Jittered arrivals: the robustness check's input must be bounded, seeded and never negative."""

import pytest

from replay.run import ReplayOptions, run_replay
from traces import load_trace
from traces.schema import TraceError


def test_jitter_is_bounded_seeded_and_keeps_every_job():
    trace = load_trace("carma:philly_mix-90-tasks")
    a, b = trace.with_jittered_arrivals(60, seed=1), trace.with_jittered_arrivals(60, seed=1)
    c = trace.with_jittered_arrivals(60, seed=2)
    assert [j.submit_s for j in a.jobs] == [j.submit_s for j in b.jobs] != [j.submit_s for j in c.jobs]
    original = {j.job_id: j.submit_s for j in trace.jobs}
    assert sorted(original) == sorted(j.job_id for j in a.jobs)
    assert all(abs(j.submit_s - original[j.job_id]) <= 60 and j.submit_s >= 0 for j in a.jobs)
    assert any(j.submit_s != original[j.job_id] for j in a.jobs)
    with pytest.raises(TraceError, match="jitter"):
        trace.with_jittered_arrivals(-1, seed=0)


def test_a_jittered_replay_differs_from_the_plain_one_and_is_reproducible():
    plain = run_replay("carma:philly_heavy-60-tasks", ReplayOptions(policy="magm", estimator="oracle"))[0]
    runs = [run_replay("carma:philly_heavy-60-tasks", ReplayOptions(policy="magm", estimator="oracle", seed=3,
                                                                      jitter_s=300))[0] for _ in range(2)]
    assert runs[0].makespan_s == runs[1].makespan_s != plain.makespan_s
    assert runs[0].completed == runs[0].jobs
