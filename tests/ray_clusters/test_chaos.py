"""The chaos benchmark at CI size (``hier-sched bench chaos --small``): on a local 3-node cluster,
the GlobalQueue actor, a node actor and a whole worker node are each killed once, and a node is
drained with a deadline, while 14 jobs
of a thesis trace run; every accepted job must end exactly once, succeeded, and no job may ever
run twice at the same time, as seen from the OS processes. The full size is a documented
command (RELIABILITY.md, "Chaos"). The witness of "ran twice" is checked first on processes made
to look like two runs of one job: the live check can fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hier_sched.front.bench.chaos import SMALL, JobProcessSampler, kill_schedule, run_chaos


def _fake_run(job_id: str, attempt: int, tmp_path) -> subprocess.Popen:
    """A process that looks like one run of a job to the sampler: its own session, the job's
    id in its environment, its attempt's files on its command line."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, f"--pid-file={tmp_path}/attempt{attempt}.pid"],
                            env={**os.environ, "HIER_SCHED_JOB_ID": job_id}, start_new_session=True)


def test_the_sampler_sees_two_live_runs_of_one_job_and_one_of_another(tmp_path):
    procs = [_fake_run("twice-abc123", 1, tmp_path), _fake_run("twice-abc123", 2, tmp_path),
             _fake_run("once-def456", 1, tmp_path)]
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            runs = JobProcessSampler().sample()
            if len(runs.get("twice-abc123", {})) == 2 and "once-def456" in runs:
                break
            time.sleep(0.1)
        assert sorted(runs["twice-abc123"].values()) == [1, 2], runs
        assert list(runs["once-def456"].values()) == [1], runs
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "twice-abc123" not in JobProcessSampler().sample()


def test_the_kill_schedule_takes_the_kinds_in_turn_with_the_planned_counts():
    import random

    kills = kill_schedule(SMALL, random.Random(SMALL.seed))
    assert [k for _, k in kills] == ["queue", "node_actor", "node", "drain"]
    assert [t for t, _ in kills] == sorted(t for t, _ in kills)


@pytest.fixture(scope="module")
def chaos():
    return run_chaos(SMALL)


def test_after_kills_of_every_kind_no_accepted_job_is_lost_or_ran_twice(chaos):
    r = chaos
    seed = f"seed {r['seed']}: {r['problem_jobs']} {r['not_succeeded']} {r['duplicates_seen']} {r['kill_log']}"
    assert r["kills"] == r["kills_planned"] == {"queue": 1, "node_actor": 1, "node": 1, "drain": 1, "head": 0}, seed
    assert r["accepted"] == r["jobs"] == SMALL.jobs and r["rejected"] == 0, seed
    assert r["lost"] == r["unfinished"] == r["ended_more_than_once"] == 0, seed
    assert r["ran_twice"] == r["duplicate_samples"] == r["left_running"] == 0, seed
    assert r["overbooked_gpus"] == r["overbooked_samples"] == 0, (r["problem_jobs"], seed)  # no GPU booked twice
    assert r["process_samples"] >= 20, seed  # the node side was watched the whole time
    assert r["succeeded"] == r["accepted"], seed  # killed infrastructure fails no job
    assert sum(int(k) * n for k, n in r["attempts_histogram"].items()) >= r["accepted"]
    assert r["ok"], seed
