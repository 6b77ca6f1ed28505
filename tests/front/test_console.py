"""Progress bars: drawn on a terminal's stderr, never into a pipe or a CI log."""

import io
import sys

from click.testing import CliRunner

from hier_sched.common.console import progress
from hier_sched.front import cluster_cli
from hier_sched.front.cli import main


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_a_pipe_gets_nothing(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    with progress("replaying carma:test", 5, unit="jobs") as update:
        update(3)
    assert "replaying carma:test" in tty.getvalue() and "3/5" in tty.getvalue()

    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    with progress("replaying carma:test", 5, unit="jobs") as update:
        update(3)
    assert pipe.getvalue() == ""


def test_wait_reports_jobs_ended_after_every_poll(monkeypatch):
    answers = iter([
        [{"job_id": "a", "state": "running"}, {"job_id": "b", "state": "queued"}],
        [{"job_id": "a", "state": "succeeded"}, {"job_id": "b", "state": "running"}],
        [{"job_id": "a", "state": "succeeded"}, {"job_id": "b", "state": "failed", "reason": "exit code 3"}],
    ])
    class Queue:
        def call(self, method, *args):
            return next(answers)

    seen = []
    jobs = cluster_cli.wait_for_jobs(Queue(), [], None, poll_s=0, on_poll=lambda js: seen.append(
        sum(j["state"] in ("succeeded", "failed", "cancelled") for j in js)))
    assert seen == [0, 1, 2] and [j["state"] for j in jobs] == ["succeeded", "failed"]


def test_replay_in_a_log_has_no_bar_frames():
    res = CliRunner().invoke(main, ["replay", "--trace", "carma:test", "--estimator", "oracle"])
    assert res.exit_code == 0, res.output
    assert "\x1b[" not in res.output and "replaying" not in res.output


def test_piped_status_never_splits_an_id(capsys):
    """``hier-sched status | grep`` and copying from a CI log: every id stays whole on one line;
    the reason folds instead."""
    ids = [f"resnet50-imagenet-bs64-warmup-{i:02d}-0123abcd" for i in range(3)]
    jobs = [{"job_id": i, "name": "resnet50-imagenet-bs64-warmup", "state": "queued", "node": None, "gpus": 1,
             "attempts": 0, "oom_crashes": 0, "estimate_mib": 7106.0, "observed_peak_mib": None,
             "reason": "waiting: no GPU with 26.4 GiB free " * 8} for i in ids]
    cluster_cli.print_jobs(jobs)
    lines = capsys.readouterr().out.splitlines()
    assert all(any(i in line for line in lines) for i in ids)
    assert max(len(line) for line in lines) <= 120


def test_status_shows_brackets_in_names_and_reasons_as_written(capsys):
    """Rich reads ``[word]`` as markup: a reason's ``pip: [transformers]`` must not vanish."""
    jobs = [{"job_id": "exp-[a]-0123abcd", "name": "exp-[a]", "state": "failed", "node": None, "gpus": 1,
             "attempts": 0, "oom_crashes": 0, "estimate_mib": None, "observed_peak_mib": None,
             "reason": "add it to the job's runtime_env (pip: [transformers])"}]
    cluster_cli.print_jobs(jobs)
    out = capsys.readouterr().out
    assert "exp-[a]-0123abcd" in out and "(pip: [transformers])" in out
