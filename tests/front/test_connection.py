"""How clients reach the scheduler and what ``run`` exits with, without a Ray cluster: calls
go through a fake actor handle (``ray.get`` replaced), addresses that answer nothing."""

from __future__ import annotations

import io
import os
import signal

import pytest
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from hier_sched.front import connection
from hier_sched.front.connection import Scheduler, SchedulerUnavailable, connect
from hier_sched.front.local_cluster import free_port
from hier_sched.front.run_job import RunExit, job_exit_code, run_job


class _Method:
    def __init__(self, name: str):
        self.name = name

    def remote(self, *args):
        return (self.name, args)


class _Handle:
    def __getattr__(self, name: str) -> _Method:
        return _Method(name)


def _flaky_get(failures: list[Exception], answer):
    """A ``ray.get`` that raises ``failures`` one by one, then answers."""
    calls = []

    def get(ref, timeout=None):
        calls.append(ref)
        if failures:
            raise failures.pop(0)
        return answer

    return get, calls


def _restarting() -> ActorUnavailableError:
    return ActorUnavailableError("The actor is temporarily unavailable: restarting", None)


def test_a_read_waits_for_the_restarting_queue(monkeypatch):
    get, calls = _flaky_get([_restarting(), _restarting()], [{"job_id": "a"}])
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(connection.time, "sleep", lambda s: None)
    assert Scheduler(_Handle(), "10.0.0.1:6379", "test").call("status", None) == [{"job_id": "a"}]
    assert calls == [("status", (None,))] * 3


def test_a_submit_asks_again_through_a_restart_with_the_same_request_id(monkeypatch):
    get, calls = _flaky_get([_restarting(), _restarting()], {"job_id": "a"})
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(connection.time, "sleep", lambda s: None)
    scheduler = Scheduler(_Handle(), "10.0.0.1:6379", "test")
    assert scheduler.submit({"name": "x"}) == {"job_id": "a"}
    assert len(calls) == 3 and len({args[2] for _, args in calls}) == 1  # one request id, asked three times
    assert calls[0][1][2]  # and it is set
    other = scheduler.submit({"name": "y"})
    assert other == {"job_id": "a"} and calls[-1][1][2] != calls[0][1][2]  # a new submit, a new id


def test_a_submit_cannot_go_by_the_plain_call(monkeypatch):
    with pytest.raises(ValueError, match="Scheduler.submit"):
        Scheduler(_Handle(), "10.0.0.1:6379", "test").call("submit", {"name": "x"}, None)


def test_a_dead_queue_is_reported_at_once(monkeypatch):
    get, calls = _flaky_get([ActorDiedError()], None)
    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(SchedulerUnavailable, match="10.0.0.1:6379 did not answer `status`"):
        Scheduler(_Handle(), "10.0.0.1:6379", "test").call("status", None)
    assert len(calls) == 1


def test_ray_address_where_nothing_answers_says_how_to_point_at_a_cluster(monkeypatch):
    if ray.is_initialized():
        pytest.skip("this process is already a Ray driver")
    port = free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setattr(connection, "_scheduler", None)
    with pytest.raises(SchedulerUnavailable, match=f"no Ray cluster answers at 127.0.0.1:{port} \\(from RAY_ADDRESS\\)"):
        connect()


@pytest.mark.parametrize(("job", "code"), [
    ({"state": "succeeded", "exit_code": 0}, 0),
    ({"state": "failed", "exit_code": 3}, 3),
    ({"state": "failed", "exit_code": -9}, 137),  # killed by SIGKILL: the shell's 128 + 9
    ({"state": "failed", "exit_code": None}, RunExit.FAILED_WITHOUT_CODE),  # never launched
    ({"state": "failed", "exit_code": 0}, RunExit.FAILED_WITHOUT_CODE),  # e.g. OOM text with exit 0
    ({"state": "cancelled", "exit_code": -15}, RunExit.CANCELLED),
])
def test_run_exits_with_the_jobs_code(job, code):
    assert job_exit_code(job) == code


class _SchedulerSignalledWhileSubmitting:
    """A scheduler whose ``submit`` is interrupted by SIGTERM (``ray job stop`` while ``run`` hands
    the spec over): what it is asked, in order."""

    def __init__(self):
        self.calls: list[str] = []

    def submit(self, spec, payload=None, estimate=None, *, request_id=None, timeout: float = 120.0):
        self.calls.append("submit")
        os.kill(os.getpid(), signal.SIGTERM)  # delivered now, in the middle of the call
        return {"job_id": "j-1"}

    def call(self, method: str, *args, timeout: float = 120.0):
        self.calls.append(method)
        if method == "cancel":
            return {"job_id": "j-1", "state": "cancelled"}
        raise AssertionError(f"unexpected call {method}")


def test_a_signal_while_submitting_cancels_the_job_once_its_id_is_known():
    scheduler = _SchedulerSignalledWhileSubmitting()
    out, err = io.StringIO(), io.StringIO()
    before = signal.getsignal(signal.SIGTERM)
    assert run_job(scheduler, {"name": "x"}, out=out, err=err) == RunExit.CANCELLED
    assert scheduler.calls == ["submit", "cancel"]
    assert "interrupted; job j-1 cancelled" in err.getvalue()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler was put back


def _log_reads(busy: int) -> Scheduler:
    """A scheduler whose node is busy with a tick for the first ``busy`` reads of a log (no Ray:
    only ``call`` answers; ``call_whole`` is the real one)."""
    left = [busy]

    class LogReads(Scheduler):
        def call(self, method, job_id, offset=0, timeout=120.0):
            assert method == "read_log"
            if left[0]:
                left[0] -= 1
                return {"text": "", "offset": offset, "done": False, "waiting_on": ["node-1"]}
            return {"text": "resuming from checkpoint\n"[offset:], "offset": 25, "done": True}

    return LogReads(handle=None, address="ray://test", found_by="a test")


def test_logs_asks_again_while_a_node_is_busy_and_says_which_node_never_answered(monkeypatch):
    from click.testing import CliRunner

    from hier_sched.front import cluster_cli
    from hier_sched.front.cli import main

    busy_twice = _log_reads(2)
    monkeypatch.setattr(cluster_cli, "_scheduler", lambda: busy_twice)
    res = CliRunner().invoke(main, ["logs", "job-1"])
    assert res.exit_code == 0 and res.output == "resuming from checkpoint\n"
    monkeypatch.setattr(connection, "NODE_PATIENCE_S", 0.0)
    never = _log_reads(10**6)
    monkeypatch.setattr(cluster_cli, "_scheduler", lambda: never)
    res = CliRunner().invoke(main, ["logs", "job-1"])
    assert res.exit_code == 1 and "node(s) node-1 did not answer" in res.output
