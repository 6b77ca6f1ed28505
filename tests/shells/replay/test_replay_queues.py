"""Team queues in the replay: the core's quota rules on simulated devices (``--queues``)."""

from __future__ import annotations

from click.testing import CliRunner

from hier_sched.core.presets import preset
from hier_sched.core.quotas import QueueQuota, QueueSetup
from hier_sched.front.cli import main
from replay.cluster import ClusterShape
from replay.engine import Simulator
from replay.estimates import estimator_for
from traces.schema import Trace, TraceJob

TEAMS = QueueSetup((QueueQuota("team-a", 2, 2), QueueQuota("team-b", 2)))


def big(jid: str, user: str, submit_s: float, duration_s: float) -> TraceJob:
    """A job that fills a GPU: two never share one."""
    return TraceJob(jid, submit_s, "w", 1, duration_s, 30000.0, smact=0.4, smocc=0.2, drama=0.2, user=user)


def replay(queues: QueueSetup | None) -> Simulator:
    jobs = [big(f"a{i}", "team-a", 0.0, 4000.0) for i in range(1, 5)] + [big(f"b{i}", "team-b", 600.0, 600.0)
                                                                         for i in (1, 2)]
    sim = Simulator(Trace("t", jobs), ClusterShape.uniform(2, 2), preset("magm"), estimator_for("oracle"),
                    queues=queues)
    sim.run()
    return sim


def test_a_queue_within_its_quota_reclaims_borrowed_gpus_and_the_victims_resume():
    sim = replay(TEAMS)
    a = [sim.jobs[f"a{i}"] for i in range(1, 5)]
    b = [sim.jobs[f"b{i}"] for i in (1, 2)]
    assert all(j.state == "done" and j.managed.state.value == "succeeded" for j in a + b)
    assert sorted(j.managed.preemptions for j in a) == [0, 0, 1, 1]
    assert all(j.checkpoints == j.managed.preemptions and j.attempts == 1 + j.managed.preemptions for j in a)
    # team-b starts once the victims saved (60 s), long before team-a's first end (4,000 s)
    assert max(j.first_start_s for j in b) < 600.0 + 120.0 < min(j.end_s for j in a)


def test_without_queues_team_b_waits_for_team_a_to_finish():
    sim = replay(None)
    assert min(sim.jobs[f"b{i}"].first_start_s for i in (1, 2)) >= 4000.0
    assert all(sim.jobs[f"a{i}"].managed.preemptions == 0 for i in range(1, 5))


def test_the_replay_reads_the_queue_file_and_names_its_bad_fields(tmp_path):
    bad = tmp_path / "queues.yaml"
    bad.write_text("queues:\n  - {name: team-a, nominal: {gpus: -2}}\n")
    result = CliRunner().invoke(main, ["replay", "--trace", "synthetic:philly?jobs=5&gpus=4&seed=1", "--queues", str(bad),
                                       "--quiet"])
    assert result.exit_code == 2 and "queues.0.nominal.gpus: input should be greater than or equal to 0" in result.output
