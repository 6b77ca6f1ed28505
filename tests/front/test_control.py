"""What the scheduler's Ray job (``hier_sched.front.control``) writes into its log, the job's log
on the Ray dashboard: one line per change of state, with the reason; a queued job's reason again
only when it changed and a minute has passed."""

from __future__ import annotations

from hier_sched.front.control import Narrator


def _job(state: str, reason: str) -> dict:
    return {"job_id": "bert-1", "state": state, "reason": reason}


def test_each_change_of_state_is_told_once_with_its_reason():
    narrator = Narrator()
    first = narrator.lines([_job("queued", "needs 12.0 GiB on 1 GPU")], 0.0)
    assert len(first) == 1 and first[0].endswith("bert-1 queued: needs 12.0 GiB on 1 GPU")
    assert narrator.lines([_job("queued", "needs 12.0 GiB on 1 GPU")], 5.0) == []
    assert narrator.lines([_job("queued", "waited longer")], 30.0) == []  # not yet a minute
    assert narrator.lines([_job("queued", "waited longer")], 61.0)[0].endswith("queued: waited longer")
    placed = narrator.lines([_job("running", "on node0 GPU(s) [1]")], 62.0)
    assert placed[0].endswith("bert-1 running: on node0 GPU(s) [1]")
    assert narrator.lines([_job("running", "on node0 GPU(s) [1]")], 200.0) == []
    assert narrator.lines([_job("succeeded", "")], 201.0)[0].endswith("bert-1 succeeded")
