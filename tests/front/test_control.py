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


def test_a_jobs_team_queue_is_named_and_each_new_queue_configuration_told_once():
    narrator = Narrator()
    assert narrator.queue_lines([], 0.0) == []  # none configured: nothing to tell
    rows = [{"name": "team-a", "cohort": None, "weight": 1.0, "nominal_gpus": 2, "nominal_mib": None,
             "borrowing_limit_gpus": 2, "borrowing_limit_mib": None, "lending_limit_gpus": None,
             "lending_limit_mib": None, "used_gpus": 0, "waiting": 0},
            {"name": "notebooks", "cohort": "lab", "weight": 2.0, "nominal_gpus": None, "nominal_mib": 81920,
             "borrowing_limit_gpus": None, "borrowing_limit_mib": None, "lending_limit_gpus": None,
             "lending_limit_mib": None, "used_gpus": 1, "waiting": 3}]
    (line,) = narrator.queue_lines(rows, 1.0)
    assert line.endswith("team queues: team-a nominal 2 GPUs, borrows up to 2 GPUs; "
                         "notebooks nominal 80.0 GiB, borrows any idle, cohort lab, weight 2")
    busier = [{**row, "used_gpus": 3, "waiting": 0} for row in rows]
    assert narrator.queue_lines(busier, 2.0) == []  # use changes, the configuration does not
    assert narrator.queue_lines([], 3.0)[0].endswith("team queues removed: every job shares the cluster in one queue")
    job = {"job_id": "bert-1", "state": "queued", "reason": "waiting", "queue": "team-a"}
    assert narrator.lines([job], 4.0)[0].endswith("bert-1 [team-a] queued: waiting")
