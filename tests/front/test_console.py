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
