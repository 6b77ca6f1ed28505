"""A node's runs without Ray: real emulated job processes (started by a thread instead of a Ray
task), their ends classified by the core's rule, stops by real signals, and runs that outlive a
restart of the node (re-adopted from their files) and are reported exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.core.events import Launch, RunEnded, RunSettled
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.presets import preset
from hier_sched.core.spec import parse_spec
from node_actor.backends.emulated import EmulatedBackend
from node_actor.emulated_device import emulated_now_s
from node_actor.launcher import run_process
from node_actor.mps import MpsController
from node_actor.runtime import NodeRuntime

SCALE = 0.01


class ThreadLauncher:
    """Runs ``run_process`` in a thread, optionally after a delay (a Ray task not started yet)."""

    def __init__(self, start_delay_s: float = 0.0):
        self.start_delay_s = start_delay_s

    def launch(self, request, resources, env):
        def body():
            time.sleep(self.start_delay_s)
            run_process(request)

        threading.Thread(target=body, daemon=True).start()
        return request.job_id

    def failed(self, handle):
        return None

    def ended(self, handle):
        pass


def _node(tmp_path, launcher=None, *, jobs_emulated: bool = True, gpus: int = 1, host: str = "") -> NodeRuntime:
    """A node of emulated GPUs; ``jobs_emulated=False`` runs commands as they are (as on real GPUs)."""
    backend = EmulatedBackend(tmp_path / "devices", "A100-40GB", gpus, time_scale=SCALE)
    node = NodeRuntime("n0", backend, preset("magm"), state_dir=tmp_path / "node", launcher=launcher or ThreadLauncher(),
                       emulated_device_dir=str(tmp_path / "devices") if jobs_emulated else None,
                       mps=MpsController(tmp_path / "mps"), host=host)
    node.tick(emulated_now_s(SCALE))
    return node


def _launch(node, job_id, spec, need_mib=None, attempt=1, gpu=0):
    limit = need_mib + 2048 if need_mib else None
    launch = Launch(job_id, attempt, (Placement(job_id, "n0", (gpu,), need_mib or 5120.0),), limit,
                    PlacementRequest(job_id, 1, need_mib))
    reply = node.launch(LaunchOrder(launch, 0, LaunchSpec.of(parse_spec({"name": job_id, **spec}))),
                        emulated_now_s(SCALE))
    assert reply.launched, reply
    return launch


def _ended(node, timeout_s=30.0) -> list[RunEnded]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        node.tick(emulated_now_s(SCALE))
        if ended := [event for _, event, _ in node.runs.pending() if isinstance(event, RunEnded)]:
            return ended
        time.sleep(0.05)
    raise AssertionError("no run ended in time")


def test_a_job_over_its_estimate_hits_its_mps_limit_and_ends_with_oom(tmp_path):
    node = _node(tmp_path)
    _launch(node, "liar", {"emulation": {"peak_mib": 20000, "duration_s": 300, "warmup_s": 1}}, need_mib=2000)
    (event,) = _ended(node)
    assert event.failure.kind == "oom" and "out of memory" in event.failure.reason.lower()
    assert event.peak_mib > 2000 + 2048  # what it held plus what it asked for, past its limit
    assert node.backend.sample()[0].memory_used_mib == 0


def test_a_stop_before_the_process_starts_still_stops_it(tmp_path):
    node = _node(tmp_path, ThreadLauncher(start_delay_s=0.5))
    _launch(node, "slow", {"emulation": {"peak_mib": 4000, "duration_s": 100000}}, need_mib=4000)
    assert node.stop("slow", 1, kill_after_s=5.0)
    t0 = time.time()
    (event,) = _ended(node)
    assert event.failure.kind == "killed" and event.attempt == 1
    assert time.time() - t0 < 10  # SIGTERM reached it once it existed; it did not run its 1000 s
    assert node.backend.sample()[0].memory_used_mib == 0


@pytest.mark.parametrize("emulated, kind", [(False, "start_error"), (True, "error")])
def test_a_missing_command_fails_with_the_reason(tmp_path, emulated, kind):
    node = _node(tmp_path, jobs_emulated=emulated)  # emulated: the command is the emulated job's child
    _launch(node, "missing", {"command": ["no-such-command-hs"]}, need_mib=1000)
    (event,) = _ended(node)
    assert event.failure.kind == kind and event.exit_code == 127
    assert "127" in event.failure.reason or "no-such-command-hs" in event.failure.reason


@pytest.mark.parametrize("code, kind", [(0, None), (3, "error")])
def test_exit_codes_are_classified_by_the_core_rule(tmp_path, code, kind):
    node = _node(tmp_path)
    _launch(node, "job", {"command": ["python", "-c", f"import sys; sys.exit({code})"]}, need_mib=1000)
    (event,) = _ended(node)
    assert event.exit_code == code and (event.failure.kind if event.failure else None) == kind


def test_an_order_that_no_longer_fits_is_declined_with_the_reason(tmp_path):
    node = _node(tmp_path)
    _launch(node, "big", {"emulation": {"peak_mib": 30000, "duration_s": 100000, "warmup_s": 0}}, need_mib=30000)
    deadline = time.time() + 90  # a busy machine starts the job's process slowly
    while node.backend.sample()[0].memory_used_mib < 30000 and time.time() < deadline:  # its memory shows
        time.sleep(0.05)
    node.tick(emulated_now_s(SCALE))
    launch = Launch("late", 1, (Placement("late", "n0", (0,), 20000.0),), None, PlacementRequest("late", 1, 20000.0))
    reply = node.launch(LaunchOrder(launch, 0, LaunchSpec(command=("true",))), emulated_now_s(SCALE))
    assert not reply.launched and "GPU(s) pass the gates" in reply.reason  # memory, or still in its grace
    node.stop("big", 1, 1.0)
    _ended(node)


def test_a_restarted_node_re_adopts_a_running_job_and_reports_one_that_ended(tmp_path):
    first = _node(tmp_path, gpus=2)
    _launch(first, "long", {"emulation": {"peak_mib": 3000, "duration_s": 100000}}, need_mib=3000)
    _launch(first, "short", {"command": ["python", "-c", "print('done')"]}, need_mib=1000, gpu=1)
    deadline = time.time() + 90
    while not (tmp_path / "node/jobs/short/attempt1.exit").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "node/jobs/long/attempt1.pid").exists()
    # the node actor dies (its tick never saw "short" end) and a new incarnation starts
    second = _node(tmp_path, gpus=2)  # its first tick re-adopts both and finds that "short" ended
    (event,) = _ended(second)
    assert (event.job_id, event.attempt, event.failure) == ("short", 1, None)
    second.runs.ack(max(seq for seq, _, _ in second.runs.pending()))
    assert "long" in {r.job_id for r in second.runs.on_node()}  # still running, watched again
    third = _node(tmp_path, gpus=2)  # acknowledged ends are never reported again
    third.tick(emulated_now_s(SCALE))
    ends = [event for _, event, _ in third.runs.pending() if isinstance(event, RunEnded)]
    assert not ends and {r.job_id for r in third.runs.on_node()} == {"long"}
    third.stop("long", 1, 1.0)
    (stopped,) = _ended(third)
    assert stopped.job_id == "long" and stopped.failure.kind == "killed"
    assert first.incarnation != second.incarnation != third.incarnation


@pytest.mark.parametrize("same_machine", [True, False])
def test_a_run_killed_with_its_fork_server_is_killed_on_the_same_machine_and_lost_on_a_new_one(tmp_path, same_machine):
    """SIGKILL to the run's whole group and to the node's fork server (its recorder) leaves no exit record. The node
    actor restarted on the same Ray node calls that killed; a node actor on a new Ray node under
    the same name (the machine died and came back) calls it lost, and the queue requeues it."""
    first = _node(tmp_path, host="ray-node-a")
    _launch(first, "long", {"emulation": {"peak_mib": 3000, "duration_s": 100000}}, need_mib=3000)
    pid_file = tmp_path / "node/jobs/long/attempt1.pid"
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(json.loads((tmp_path / "node/fork_server.json").read_text())["pid"], signal.SIGKILL)
    os.killpg(os.getpgid(int(pid_file.read_text())), signal.SIGKILL)  # as the machine's death would
    second = _node(tmp_path, host="ray-node-a" if same_machine else "ray-node-b")
    (event,) = _ended(second, timeout_s=30.0)
    assert event.job_id == "long" and event.exit_code is None
    assert event.failure.kind == ("killed" if same_machine else "lost"), event.failure


def test_a_job_is_no_child_of_the_task_that_started_it_and_the_task_waits_for_the_job(tmp_path):
    """Ray SIGKILLs a dead worker's children: a job (or what records its end), were it one, would
    die with its task when its node actor is killed, and the job would end unrecorded (found by
    the chaos benchmark). Jobs are the node's fork server's children, in sessions of their own;
    the task still returns only when the job has ended, with its exit code."""
    import psutil

    from node_actor.launcher import LaunchRequest, RunFiles

    files = RunFiles(str(tmp_path / "jobs" / "j-1"), 1)
    argv = (sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit(3)")
    result = {}
    worker = threading.Thread(target=lambda: result.update(code=run_process(LaunchRequest("j-1", argv, files))))
    worker.start()
    deadline = time.time() + 30
    while not (os.path.exists(files.pid) and open(files.pid).read()) and time.time() < deadline:
        time.sleep(0.02)
    job = psutil.Process(int(open(files.pid).read()))
    server = job.parent()
    assert "node_actor.fork_server" in " ".join(server.cmdline()) and server.ppid() != os.getpid()
    assert os.getsid(job.pid) == job.pid != os.getsid(server.pid)  # a cancel of the job's group misses the server
    assert worker.is_alive()  # the job still runs
    worker.join(timeout=30)
    assert result == {"code": 3} and json.loads(open(files.exit).read())["exit_code"] == 3


def test_a_pid_file_names_its_process_only_while_that_process_runs(tmp_path):
    """A run's PID file outlives the run, and the PID may be given to another process later: that
    one is not the run's (it started after the file was written)."""
    from node_actor.launcher import live_pid

    pid_file = tmp_path / "attempt1.pid"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(str(proc.pid))
        assert live_pid(pid_file) == proc.pid
        os.utime(pid_file, (time.time() - 60, time.time() - 60))  # written before this process started
        assert live_pid(pid_file) is None
    finally:
        proc.kill()
        proc.wait()
    pid_file.write_text(str(proc.pid))
    assert live_pid(pid_file) is None and live_pid(tmp_path / "missing.pid") is None


class _TaskDiesUnstarted:
    """A Ray task that never starts its job: the node actor that launched it died at once, and
    Ray ended the task it owned (found by the chaos benchmark)."""

    def launch(self, request, resources, env):
        return object()

    def failed(self, handle):
        return None

    def ended(self, handle):
        pass


def test_a_run_whose_task_died_with_its_node_actor_before_it_started_is_lost_not_killed(tmp_path):
    first = _node(tmp_path, _TaskDiesUnstarted(), host="ray-node-a")
    _launch(first, "early", {"emulation": {"peak_mib": 3000, "duration_s": 100}}, need_mib=3000)
    second = _node(tmp_path, host="ray-node-a")  # the restarted actor re-adopts the run from its record
    (event,) = _ended(second, timeout_s=30.0)
    assert event.job_id == "early" and event.failure.kind == "lost" and "start was lost" in event.failure.reason


def test_a_job_that_says_its_memory_settled_gives_back_what_it_reserved_beyond_it(tmp_path):
    """An emulated job reserved 20,000 MiB and holds 8,000 once it has allocated its peak (when it
    says its memory is steady): its reservation becomes 8,000 + 3 %, in the snapshot, in its run
    record and in a ``RunSettled`` event for the queue; a restarted node knows it from the record."""
    node = _node(tmp_path)
    _launch(node, "over", {"emulation": {"peak_mib": 8000, "duration_s": 100000, "warmup_s": 1}}, need_mib=20000)
    deadline = time.time() + 90
    while not (settled := [e for _, e, _ in node.runs.pending() if isinstance(e, RunSettled)]) and time.time() < deadline:
        node.tick(emulated_now_s(SCALE))
        time.sleep(0.05)
    (event,) = settled
    assert (event.job_id, event.attempt, event.node) == ("over", 1, "n0")
    assert event.reserved_mib == pytest.approx(8000 * 1.03, rel=1e-3)
    (gpu,) = node.snapshot(emulated_now_s(SCALE))
    assert gpu.pending_mib == pytest.approx(8000 * 0.03, abs=1) and gpu.memory_free_mib == pytest.approx(
        gpu.memory_total_mib - 8000 * 1.03, abs=1)
    record = json.loads((tmp_path / "node/jobs/over/attempt1.json").read_text())
    assert record["settled_mib"] == event.reserved_mib and record["placement"]["reserved_mib"] == 20000
    again = _node(tmp_path)
    assert [e for _, e, _ in again.runs.pending()] == [event]  # told again: the queue may not have logged it
    again.stop("over", 1, 1.0)
    _ended(again)


def test_a_job_settles_only_once_monitoring_has_seen_it_hold_what_it_said(tmp_path):
    node = _node(tmp_path, jobs_emulated=False)
    _launch(node, "sleeper", {"command": ["python", "-c", "import time; time.sleep(60)"]}, need_mib=6000)
    (tmp_path / "node/jobs/sleeper/attempt1.settled").write_text("5000\n")  # said, but holds nothing here
    for _ in range(20):
        node.tick(emulated_now_s(SCALE))
        time.sleep(0.02)
    assert node.runs.runs["sleeper"].settled_mib is None
    assert not [e for _, e, _ in node.runs.pending() if isinstance(e, RunSettled)]
    node.stop("sleeper", 1, 1.0)
    _ended(node)


def test_the_summary_tells_how_far_each_run_says_it_is_and_its_peak_so_far(tmp_path):
    """What ``top`` shows of a running job: an emulated job reports its progress as a real one
    may (``hs.report_progress``), and monitoring has seen it hold its peak."""
    node = _node(tmp_path)
    _launch(node, "trains", {"emulation": {"peak_mib": 8000, "duration_s": 3000, "warmup_s": 1}}, need_mib=9000)
    deadline = time.time() + 30
    while time.time() < deadline:
        node.tick(emulated_now_s(SCALE))
        (run,) = node.summary(emulated_now_s(SCALE))["runs"]
        if run["progress"] and run["peak_mib"]:
            break
        time.sleep(0.1)
    assert run["job_id"] == "trains" and run["attempt"] == 1
    assert 0 < run["progress"] < 1 and run["peak_mib"] >= 8000
    node.stop("trains", 1, 1.0)
    _ended(node)


def test_a_node_says_nothing_changed_until_its_snapshot_or_runs_change(tmp_path):
    node = _node(tmp_path)
    first = node.exchange(emulated_now_s(SCALE))
    assert not first.unchanged and first.runs == []
    same = node.exchange(emulated_now_s(SCALE), 0, first.incarnation, first.version)
    assert same.unchanged and same.runs is None and same.version == first.version
    other = node.exchange(emulated_now_s(SCALE), 0, "an-earlier-incarnation", first.version)
    assert not other.unchanged  # a version of another incarnation is no version of this one's
    _launch(node, "busy", {"emulation": {"peak_mib": 4000, "duration_s": 100000}}, need_mib=4000)
    changed = node.exchange(emulated_now_s(SCALE), 0, first.incarnation, first.version)
    assert not changed.unchanged and changed.version > first.version
    assert [r.job_id for r in changed.runs] == ["busy"] and changed.snapshot[0].resident_jobs == ("busy",)
    node.stop("busy", 1, kill_after_s=1.0)
    _ended(node)
