"""One clock for users: ``status`` and ``top`` count wall-clock time, with the emulated time
beside it on an emulated cluster; the status table has a time column whose values are whole,
also when piped."""

from __future__ import annotations

import pytest

from hier_sched.front import cluster_cli
from hier_sched.front.cluster_cli import print_jobs, time_in_state
from hier_sched.front.durations import clocks_note, duration, span

NOW = 1_750_000_000.0


def job(state, **times):
    base = {"job_id": f"resnet50-bs64-{state[:4]}0000", "name": "resnet50-bs64", "state": state, "node": None,
            "gpus": 1, "attempts": 0, "oom_crashes": 0, "estimate_mib": 7106.0, "observed_peak_mib": None,
            "submit_time": NOW - 120, "start_time": None, "end_time": None, "run_start_time": None,
            "reason": ""}
    return {**base, **times}


@pytest.mark.parametrize("seconds,text", [(None, "-"), (-3, "0s"), (45, "45s"), (150, "2m"), (3 * 3600 + 300, "3h05"),
                                          (2 * 86400 + 4 * 3600, "2d04"), (200 * 86400, ">99d")])
def test_durations_fit_five_characters(seconds, text):
    assert duration(seconds) == text


def test_wall_clock_first_and_the_emulated_time_beside_it_only_where_time_is_emulated():
    assert span(120, 1.0) == "2m" and clocks_note(1.0) == ""
    assert span(120, 0.01) == "2m (3h20)"  # 12,000 emulated seconds
    assert clocks_note(0.01) == "times: wall clock (emulated)"
    assert span(None, 0.01) == "-"


def test_each_state_counts_its_own_span():
    assert time_in_state(job("queued"), NOW, 1.0) == "2m"  # since submitted
    requeued = job("running", start_time=NOW - 100, run_start_time=NOW - 30)
    assert time_in_state(requeued, NOW, 0.01) == "30s (50m)"  # this run, not the first
    assert time_in_state(job("running", start_time=NOW - 90), NOW, 1.0) == "90s"  # no run start sent: the first
    ended = job("succeeded", start_time=NOW - 100, end_time=NOW - 20)
    assert time_in_state(ended, NOW, 1.0) == "1m" == time_in_state(ended, NOW + 600, 1.0)  # submitted to end: 100 s


def test_the_status_table_has_a_time_column_whole_when_piped(capsys, monkeypatch):
    monkeypatch.setattr(cluster_cli.time, "time", lambda: NOW)
    jobs = [job("queued", reason="waiting: no GPU with 31.3 GiB usable (best: node1 gpu1, 25.2 GiB; usable = free "
                                 "minus the 0.5 GiB kept free on every GPU)"),
            job("running", node="node0", gpus=[1], attempts=1, start_time=NOW - 3000, run_start_time=NOW - 3000)]
    print_jobs(jobs, time_scale=0.01)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["job", "state", "time"]  # no name column: every id starts with its name
    assert "times: wall clock (emulated)" in out
    assert "2m (3h20)" in out and "50m (3d11)" in out
    assert "resnet50-bs64-queu0000" in out and max(map(len, lines)) <= 120  # ids whole (piped: 120 columns)
    column = lines[0].index("reason")
    assert "usable = free minus the 0.5 GiB kept free" in " ".join(line[column:].strip() for line in lines)
    print_jobs(jobs, time_scale=1.0)
    out = capsys.readouterr().out
    assert "(emulated)" not in out and " 50m " in out


def test_a_queue_column_appears_once_team_queues_are_used(capsys):
    plain = [job("queued", queue="default")]
    print_jobs(plain, time_scale=1.0)
    assert "queue" not in capsys.readouterr().out.splitlines()[0]
    print_jobs(plain + [job("running", job_id="bert-00000000", name="bert", queue="team-a")], time_scale=1.0)
    out = capsys.readouterr().out
    assert "queue" in out.splitlines()[0] and "team-a" in out and "default" in out
