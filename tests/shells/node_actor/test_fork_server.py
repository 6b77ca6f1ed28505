"""The node's fork server (``node_actor.fork_server``): it starts jobs -- our own Python stages by
fork, anything else by exec -- records how each ended, and serves only its own OS user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from node_actor.fork_server import ADDRESS_FILE, quit_server, request, server_address
from node_actor.launcher import LaunchRequest, RunFiles, read_outcome, run_process


def _files(node: Path, job: str) -> RunFiles:
    files = RunFiles(str(node / "jobs" / job), 1)
    os.makedirs(files.directory, exist_ok=True)
    return files


def _callable_job(node: Path, job: str, fn, *args) -> tuple[int, object]:
    files = _files(node, job)
    Path(files.payload).write_bytes(cloudpickle.dumps((fn, args, {})))
    argv = (sys.executable, "-m", "node_actor.run_callable", files.payload, files.result)
    code = run_process(LaunchRequest(job, argv, files, env={"CUDA_VISIBLE_DEVICES": "3"}))
    outcome = read_outcome(files, with_result=True)
    return code, cloudpickle.loads(outcome.result) if outcome.result else outcome


@pytest.fixture
def node(tmp_path):
    yield tmp_path
    quit_server(tmp_path)


def _draw():
    import numpy as np

    return os.environ["CUDA_VISIBLE_DEVICES"], os.environ["HIER_SCHED_JOB_ID"], float(np.random.random()), os.getcwd()


def test_a_callable_job_is_forked_with_its_own_environment_and_fresh_random_state(node):
    code_a, (visible, job, first, cwd) = _callable_job(node, "a", _draw)
    code_b, (_, _, second, _) = _callable_job(node, "b", _draw)
    assert (code_a, code_b, visible, job, cwd) == (0, 0, "3", "a", os.getcwd())
    assert first != second  # numpy's generator is reseeded in every forked job
    server_pid = json.loads((node / ADDRESS_FILE).read_text())["pid"]
    assert "node_actor.fork_server" in Path(f"/proc/{server_pid}/cmdline").read_bytes().decode()


def _fail():
    raise ValueError("the job's own error")


def test_a_failing_callable_prints_its_traceback_and_exits_1(node):
    code, outcome = _callable_job(node, "bad", _fail)
    assert code == 1 and "ValueError: the job's own error" in outcome.log_tail and not outcome.start_error


@pytest.mark.parametrize(("argv", "workdir", "code", "words"), [
    (("no-such-program-hs",), None, 127, "cannot start command 'no-such-program-hs'"),
    (("true",), "/no/such/dir", 126, "cannot start working directory '/no/such/dir'"),
])
def test_a_job_that_cannot_start_fails_with_the_reason(node, argv, workdir, code, words):
    files = _files(node, "nostart")
    assert run_process(LaunchRequest("nostart", argv, files, workdir)) == code
    outcome = read_outcome(files, with_result=False)
    assert outcome.exit_code == code and words in outcome.start_error and words in outcome.log_tail


def test_a_job_outlives_the_process_that_asked_for_it_and_its_end_is_recorded(node):
    files = _files(node, "orphan")
    asker = (f"import sys; sys.path[:0] = {sys.path!r}\n"
             "from node_actor.launcher import *\n"
             f"run_process(LaunchRequest('orphan', ('sleep', '1'), RunFiles({files.directory!r}, 1)))\n")
    proc = subprocess.Popen([sys.executable, "-c", asker])
    deadline = time.time() + 30
    while not os.path.exists(files.pid) and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()  # as Ray kills the job's task with its node actor
    proc.wait()
    deadline = time.time() + 30
    while read_outcome(files, False) is None and time.time() < deadline:
        time.sleep(0.05)
    assert read_outcome(files, False).exit_code == 0


def test_a_cancel_of_the_job_group_reaches_the_job_not_the_server(node):
    files = _files(node, "cancel")
    address = server_address(node)
    message = {"op": "run", "argv": ["sleep", "30"], "env": dict(os.environ), "cwd": None, "log": files.log,
               "pid_file": files.pid, "exit_file": files.exit}
    with request(address, message) as conn:
        pid = conn.answer(timeout=10)["pid"]
        os.killpg(pid, signal.SIGTERM)
        assert conn.answer(timeout=10) == {"exit_code": -signal.SIGTERM}
    assert server_address(node) == address  # the same server still answers


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to try as another user")
def test_another_user_gets_no_answer(node):
    address = server_address(node)
    child = os.fork()
    if child == 0:
        try:
            os.setuid(65534)
            with request(address, {"op": "ping"}) as conn:
                os._exit(0 if conn.answer(timeout=5) is None else 1)
        except OSError:  # the server hung up before the request was even sent: refused too
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_quit_ends_an_idle_server(node):
    server_address(node)
    pid = json.loads((node / ADDRESS_FILE).read_text())["pid"]
    quit_server(node)
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


def test_a_job_asked_of_a_dead_server_starts_a_new_one(node):
    code, _ = _callable_job(node, "before", _draw)
    first = json.loads((node / ADDRESS_FILE).read_text())["pid"]
    os.kill(first, signal.SIGKILL)  # its address file stays behind, naming a socket nobody listens on
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{first}") and time.time() < deadline:
        time.sleep(0.05)
    code_after, (visible, *_) = _callable_job(node, "after", _draw)
    assert (code, code_after, visible) == (0, 0, "3")
    assert json.loads((node / ADDRESS_FILE).read_text())["pid"] != first


def test_the_job_task_fails_exactly_when_its_attempt_failed(node):
    """``run_attempt`` is the job's Ray task body: what Ray (and its dashboard) show for the task is
    the attempt's own outcome -- a success, a checkpoint-and-requeue, or a failure with its reason."""
    from hier_sched.core.failures import REQUEUE_EXIT_CODE
    from node_actor.launcher import AttemptEnded, run_attempt

    assert run_attempt(LaunchRequest("ok", ("true",), _files(node, "ok"))) == "ok attempt 1 succeeded"
    requeue = (sys.executable, "-c", f"raise SystemExit({REQUEUE_EXIT_CODE})")
    assert "requeued" in run_attempt(LaunchRequest("ckpt", requeue, _files(node, "ckpt")))
    with pytest.raises(AttemptEnded, match=r"bad attempt 1 error: .*exit code 3.*hier-sched status bad"):
        run_attempt(LaunchRequest("bad", (sys.executable, "-c", "raise SystemExit(3)"), _files(node, "bad")))
