"""The node's supervision path without Ray: real emulated job processes, launched by a thread
instead of a Ray task, classified and decided by the core, cancelled by signals."""

from __future__ import annotations

import threading
import time

import pytest

from hier_sched.core.presets import preset
from hier_sched.core.queueing import QueuedJob
from node_actor.backends.emulated import EmulatedBackend
from node_actor.emulated_device import emulated_now_s
from node_actor.launcher import run_process
from node_actor.mps import MpsController
from node_actor.runtime import Assignment, NodeRuntime

SCALE = 0.01


class ThreadLauncher:
    """Runs ``run_process`` in a thread, optionally after a delay (a Ray task not started yet)."""

    def __init__(self, start_delay_s: float = 0.0):
        self.start_delay_s = start_delay_s
        self.outcomes = {}

    def launch(self, request, resources, env):
        def body():
            time.sleep(self.start_delay_s)
            self.outcomes[request.job_id] = run_process(request)

        threading.Thread(target=body, daemon=True).start()
        return request.job_id

    def poll(self, handle):
        return self.outcomes.get(handle)


def _node(tmp_path, launcher) -> NodeRuntime:
    backend = EmulatedBackend(tmp_path / "devices", "A100-40GB", 1, time_scale=SCALE)
    node = NodeRuntime("n0", backend, preset("magm"), state_dir=tmp_path, launcher=launcher,
                       emulated_device_dir=str(tmp_path / "devices"), mps=MpsController(tmp_path / "mps"))
    node.sample(emulated_now_s(SCALE))
    return node


def _offer(node, job_id, spec, need_mib=None, **queued):
    now = emulated_now_s(SCALE)
    q = QueuedJob(job_id, now, need_mib=need_mib, **queued)
    reply = node.offer(Assignment(q, {"name": job_id, **spec}, attempts=0), now)
    assert reply["launched"], reply
    return reply


def _events(node, timeout_s=30.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        node.sample(emulated_now_s(SCALE))
        node.supervise(emulated_now_s(SCALE))
        events = node.poll_events()
        if events:
            return events
        time.sleep(0.05)
    raise AssertionError("no job ended in time")


def test_a_job_over_its_estimate_hits_its_mps_limit_and_is_requeued_as_oom(tmp_path):
    node = _node(tmp_path, ThreadLauncher())
    _offer(node, "liar", {"emulation": {"peak_mib": 20000, "duration_s": 300, "warmup_s": 1}}, need_mib=2000)
    (event,) = _events(node)
    assert event["outcome"] == "requeue" and event["failure_kind"] == "oom", event
    assert "out of memory" in event["reason"]
    assert event["peak_mib"] > 2000 + 2048  # what it held plus what it asked for, past its limit
    assert node.backend.sample()[0].memory_used_mib == 0


def test_cancel_before_the_process_starts_still_stops_it(tmp_path):
    node = _node(tmp_path, ThreadLauncher(start_delay_s=0.5))
    _offer(node, "slow", {"emulation": {"peak_mib": 4000, "duration_s": 100000}}, need_mib=4000)
    assert node.cancel("slow")
    t0 = time.time()
    (event,) = _events(node)
    assert event["outcome"] == "cancelled"
    assert time.time() - t0 < 10  # SIGTERM reached it once it existed; it did not run its 1000 s
    assert node.backend.sample()[0].memory_used_mib == 0


def test_missing_command_fails_the_job_with_the_reason(tmp_path):
    node = _node(tmp_path, ThreadLauncher())
    _offer(node, "missing", {"command": ["no-such-command-hs"]}, need_mib=1000)
    (event,) = _events(node)
    assert event["outcome"] == "failed"
    assert "127" in event["reason"] and "no-such-command-hs" in event["reason"]


@pytest.mark.parametrize("code, retries, outcome", [(3, 0, "failed"), (3, 1, "requeue")])
def test_non_oom_failures_follow_the_spec_retry_rule(tmp_path, code, retries, outcome):
    node = _node(tmp_path, ThreadLauncher())
    _offer(node, "crash", {"command": ["python", "-c", f"import sys; sys.exit({code})"], "retry": {"max_retries": retries}},
           need_mib=1000)
    (event,) = _events(node)
    assert event["outcome"] == outcome and event["failure_kind"] == "error", event
