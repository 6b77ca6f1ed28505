"""The queue survives its own restart: rebuilt from its write-ahead log through the core, damage at
the log's tail reported and cut off with every record before it kept, a newer log refused, a log
of the record layout before (version 1) read."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from global_queue.estimates import estimate_for_spec
from global_queue.journal import JOURNAL_VERSION, Journal
from global_queue.service import QueueService
from hier_sched.common.messages import EmulatedRun, LaunchSpec
from hier_sched.common.wal import WalVersionError, WriteAheadLog
from hier_sched.core.events import (
    JobTicket,
    NodeDraining,
    NodeJoined,
    NodeLost,
    RunStarted,
    Submitted,
    to_record,
)
from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobState
from hier_sched.core.presets import preset
from hier_sched.core.scheduler import Scheduler
from hier_sched.core.spec import parse_spec, ticket_for_spec
from hier_sched.device.gpu_model import WARMUP_S
from tests.helpers.fake_nodes import GPU, Nodes


def service(state: Path, nodes: Nodes, clock=lambda: 1000.0) -> QueueService:
    return QueueService(nodes, state_dir=state, policy="magm", estimator="none", clock=clock)


def spec(name: str, mib: float = 30000) -> dict:
    return {"name": name, "command": ["true"], "memory_mib": mib, "estimator": "none"}


def segment(state: Path) -> Path:
    (path,) = sorted((state / "queue" / "current").glob("log-*.wal"))
    return path


def test_a_restarted_queue_has_every_job_and_launches_nothing_twice(tmp_path):
    nodes = Nodes()
    first = service(tmp_path, nodes)
    ids = [first.submit(spec(f"j{i}"))["job_id"] for i in range(3)]
    first.tick()  # j0 and j1 start, one per GPU (30 GB each); j2 waits
    first.tick()  # their nodes' replies come with the reports: their start is logged
    states = {j: first.status(j)["state"] for j in ids}
    assert sorted(states.values()) == ["queued", "running", "running"] and nodes.launches == 2
    first.journal.close()  # the actor dies

    second = service(tmp_path, nodes)
    assert {j: second.status(j)["state"] for j in ids} == states
    assert second.recovery["damage"] is None and second.recovery["records"] >= 6
    second.tick()
    assert nodes.launches == 2  # the running ones run on; the waiting one still has no room
    assert second.submit(spec("again"), request_id="r1")["job_id"] == second.submit(spec("again"), request_id="r1")["job_id"]
    second.journal.close()


def test_a_queue_restarted_before_its_launches_were_answered_adopts_the_runs_from_the_nodes(tmp_path):
    nodes = Nodes()
    first = service(tmp_path, nodes)
    ids = [first.submit(spec(f"j{i}"))["job_id"] for i in range(3)]
    first.tick()  # the orders went with the asks; the replies are still on their way
    assert nodes.launches == 2
    first.journal.close()  # the actor dies before it reads them

    second = service(tmp_path, nodes)
    assert all(second.status(j)["state"] == "queued" for j in ids)  # the log never saw them start
    second.tick()  # the node's report shows its runs: re-adopted, not launched again
    assert sorted(second.status(j)["state"] for j in ids) == ["queued", "running", "running"]
    assert nodes.launches == 2
    second.tick()
    assert nodes.launches == 2
    second.journal.close()


def test_submissions_go_on_while_a_compaction_is_written_and_a_restart_has_them_all(tmp_path):
    first = service(tmp_path, Nodes())
    before = [first.submit(spec(f"a{i}"))["job_id"] for i in range(3)]
    first.journal.compact(first.scheduler.finished_oldest_first, in_background=True)
    after = [first.submit(spec(f"b{i}"))["job_id"] for i in range(3)]
    first.journal.close()  # waits for the snapshot's write

    second = service(tmp_path, Nodes())
    assert all(second.status(j)["state"] == "queued" for j in before + after)
    second.journal.close()


def test_a_submission_is_logged_and_answered_while_a_tick_holds_the_queue(tmp_path):
    import threading

    queue = service(tmp_path, Nodes())
    held, release = threading.Event(), threading.Event()

    def a_long_tick():
        with queue.lock:
            held.set()
            release.wait(timeout=30)

    tick = threading.Thread(target=a_long_tick)
    tick.start()
    assert held.wait(timeout=10)
    answers = []
    submit = threading.Thread(target=lambda: answers.append(queue.submit(spec("quick"))))
    submit.start()
    submit.join(timeout=10)
    release.set()
    tick.join()
    assert answers and "job_id" in answers[0]  # answered before the tick let go
    job = answers[0]["job_id"]
    assert queue.status(job)["state"] == "queued"  # taken in with the state
    queue.journal.close()
    again = service(tmp_path, Nodes())
    assert again.status(job)["state"] == "queued"
    again.journal.close()


def test_a_submission_replayed_on_a_restarted_queue_returns_the_first_calls_job(tmp_path):
    first = service(tmp_path, Nodes())
    job = first.submit(spec("replayed"), request_id="r-1")["job_id"]
    first.journal.close()  # the actor dies after logging, before its answer reached the client

    second = service(tmp_path, Nodes())
    again = second.submit(spec("replayed"), request_id="r-1")  # Ray replays the call in flight
    assert again == {"job_id": job, "repeated": True}
    assert [j["job_id"] for j in second.status()] == [job]
    second.journal.close()


def test_two_arrivals_of_one_request_at_once_make_one_job(tmp_path, monkeypatch):
    import threading

    import global_queue.service as service_module

    queue = service(tmp_path, Nodes())
    both_checked = threading.Barrier(2)
    checked = service_module._check_checkpoint_dir

    def check_then_wait(spec_):  # both calls past the first look at the request id, neither logged yet
        checked(spec_)
        both_checked.wait(timeout=10)

    monkeypatch.setattr(service_module, "_check_checkpoint_dir", check_then_wait)
    answers = []
    calls = [threading.Thread(target=lambda: answers.append(queue.submit(spec("twice"), request_id="r-2")))
             for _ in range(2)]
    for call in calls:
        call.start()
    for call in calls:
        call.join()
    assert len({a["job_id"] for a in answers}) == 1 and len(queue.status()) == 1
    queue.journal.close()


def test_two_jobs_never_share_an_id_even_when_the_random_part_repeats(tmp_path, monkeypatch):
    import uuid

    draws = iter(["aaaaaaaa" + "0" * 24] * 3 + ["bbbbbbbb" + "0" * 24])
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(next(draws)))
    queue = service(tmp_path, Nodes())
    first, second = (queue.submit(spec("same", 1000))["job_id"] for _ in range(2))
    assert (first, second) == ("same-aaaaaaaa", "same-bbbbbbbb")  # the repeated draws were thrown away
    assert {queue.status(j)["job_id"] for j in (first, second)} == {first, second}
    queue.journal.close()


def test_a_restarted_queue_places_nothing_until_every_node_answered(tmp_path):
    """A node that took a launch order just before the queue died reports that run in its first
    answer; a queue placing jobs before hearing from every node could start one twice."""
    nodes = Nodes()
    first = service(tmp_path, nodes)
    job = first.submit(spec("waits"))["job_id"]
    first.journal.close()  # the actor dies before its next tick
    second = service(tmp_path, nodes)
    nodes.silent = True
    second.tick()
    assert nodes.launches == 0 and second.status(job)["state"] == "queued"
    nodes.silent = False
    second.tick()
    assert nodes.launches == 1 and second.status(job)["state"] == "running"
    second.journal.close()


def logged_jobs(state: Path, count: int = 3) -> tuple[list[str], Path]:
    """A queue that accepted ``count`` jobs and died; (their ids, its log segment)."""
    first = service(state, Nodes())
    ids = [first.submit(spec(f"j{i}", 1000))["job_id"] for i in range(count)]
    first.journal.close()
    return ids, segment(state)


def test_a_torn_tail_is_reported_and_cut_and_the_records_before_it_kept(tmp_path):
    ids, path = logged_jobs(tmp_path)
    good = path.stat().st_size
    with open(path, "ab") as fh:  # a record whose write was cut short by a crash
        fh.write(struct.pack(">II", 400, 12345) + b"\x93\x01partial")
    second = service(tmp_path, Nodes())
    assert [second.status(j)["state"] for j in ids] == ["queued"] * 3
    damage = second.recovery["damage"]
    assert damage and f"damaged tail at byte {good}" in damage
    assert path.stat().st_size == good
    second.journal.close()


def test_a_flipped_bit_in_the_last_record_loses_only_that_record(tmp_path):
    ids, path = logged_jobs(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    second = service(tmp_path, Nodes())
    assert second.status(ids[0]) and second.status(ids[1]) and second.status(ids[2]) is None
    assert "damaged tail" in second.recovery["damage"]
    second.journal.close()


def test_a_log_from_a_newer_version_is_refused_with_a_clear_error(tmp_path):
    _, path = logged_jobs(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack(">I", 99)
    path.write_bytes(bytes(data))
    with pytest.raises(WalVersionError, match="99"):
        service(tmp_path, Nodes())


def test_status_says_why_a_job_waits(tmp_path):
    nodes = Nodes()
    svc = service(tmp_path, nodes)
    a, b, c = (svc.submit(spec(n))["job_id"] for n in "abc")
    svc.tick()  # a and b start
    svc.tick()  # the next snapshot shows their memory
    waiting = svc.status(c)
    assert waiting["state"] == JobState.QUEUED.value
    assert waiting["reason"].startswith("waiting: no GPU with 31.3 GiB usable (best: n0 gpu0, 29.3 GiB; usable = free minus the "
                                         "0.5 GiB kept free on every GPU)"), waiting["reason"]
    assert waiting["estimate_source"] == "declared memory_mib"
    svc.journal.close()


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_at_submit(tmp_path):
    svc = service(tmp_path / "state", Nodes())
    afile = tmp_path / "a-file"
    afile.write_text("")
    answer = svc.submit({**spec("ck", 1000), "checkpoint_dir": str(afile / "ckpt")})
    assert "checkpoint_dir" in answer["error"] and "is a file" in answer["error"]
    ok = svc.submit({**spec("ck2", 1000), "checkpoint_dir": str(tmp_path / "new" / "ckpt")})  # created when needed
    assert "job_id" in ok
    svc.journal.close()


def test_an_estimator_with_nothing_to_estimate_from_is_said_at_submit(tmp_path):
    """``est="auto"`` on a command job without a model: accepted, and the answer says it runs as
    of unknown size (the client warns, the CLI prints it); a declared size says nothing."""
    queue = QueueService(Nodes(), state_dir=tmp_path, policy="magm", estimator="auto", clock=lambda: 1000.0)
    blind = queue.submit({"name": "blind", "command": ["true"], "gpus": 1})
    assert blind["estimate_mib"] is None
    assert "est='auto' found nothing to estimate from" in blind["warning"] and "5.0 GiB" in blind["warning"]
    assert "warning" not in queue.submit({"name": "sized", "command": ["true"], "gpus": 1, "memory_mib": 3000})
    assert "warning" not in queue.submit({"name": "blind-by-choice", "command": ["true"], "estimator": "none"})


def test_team_queues_are_logged_and_a_restarted_queue_keeps_them(tmp_path):
    from hier_sched.core.quotas import QueueQuota, QueueSetup

    nodes = Nodes()
    first = service(tmp_path, nodes)
    rows = first.apply_queues(QueueSetup((QueueQuota("team-a", 1, 0), QueueQuota("team-b", 1))))
    assert [(r["name"], r["nominal_gpus"], r["borrowing_limit_gpus"]) for r in rows] == [("team-a", 1, 0), ("team-b", 1, None)]
    ids = [first.submit({**spec(f"a{i}"), "queue": "team-a"})["job_id"] for i in range(2)]
    first.tick()
    first.tick()  # the launch's reply read: its start logged
    assert [first.status(j)["state"] for j in ids] == ["running", "queued"] and nodes.launches == 1
    first.journal.close()

    second = service(tmp_path, nodes)
    assert second.queues() == first.queues()
    row = second.queues()[0]
    assert {k: row[k] for k in ("name", "nominal_gpus", "borrowing_limit_gpus", "used_gpus", "borrowed_gpus",
                                "fair_share_gpus", "waiting")} == \
        {"name": "team-a", "nominal_gpus": 1, "borrowing_limit_gpus": 0, "used_gpus": 1, "borrowed_gpus": 0,
         "fair_share_gpus": 1, "waiting": 1}
    second.tick()
    second.tick()
    assert nodes.launches == 1 and "queue team-a over quota: 1/1 GPUs" in second.status(ids[1])["reason"]
    second.journal.close()


def test_a_submission_logged_beside_a_change_of_the_team_queues_is_taken_in_where_the_log_puts_it(tmp_path):
    import threading

    from hier_sched.core.events import QueuesConfigured
    from hier_sched.core.quotas import QueueQuota, QueueSetup

    first = service(tmp_path, Nodes())
    first.apply_queues(QueueSetup((QueueQuota("team-a", 1),)))
    logging_the_change = first.journal.append
    answers: list[dict] = []

    def append(events, now, extras=None, **options):  # a submission arrives while the change is being logged
        if any(isinstance(e, QueuesConfigured) for e in events) and not answers:
            submit = threading.Thread(target=lambda: answers.append(first.submit({**spec("b"), "queue": "team-b"})))
            submit.start()
            submit.join(timeout=1)  # logged either before the change or after it, never between
        return logging_the_change(events, now, extras, **options)

    first.journal.append = append
    first.apply_queues(QueueSetup((QueueQuota("team-a", 1), QueueQuota("team-b", 1))))
    for _ in range(100):
        if answers:
            break
        threading.Event().wait(0.05)
    job = answers[0]["job_id"]
    live = first.status(job)
    first.journal.close()
    second = service(tmp_path, Nodes())
    assert second.status(job)["state"] == live["state"] and second.status(job)["reason"] == live["reason"]
    second.journal.close()


# What a node needs of a spec, all of it set: each field must come through a restart.
FULL = {"name": "full", "command": ["python", "train.py", "--lr", "0.1"], "memory_mib": 1000, "estimator": "none",
        "workdir": "/data/run", "checkpoint_dir": "ckpt", "env": {"SEED": "7"},
        "runtime_env": {"env_vars": {"A": "1"}}, "emulation": {"peak_mib": 900, "duration_s": 60, "smact": 0.4}}
FULL_LAUNCH = LaunchSpec(("python", "train.py", "--lr", "0.1"), None, "/data/run", "ckpt", {"SEED": "7"},
                         {"env_vars": {"A": "1"}}, EmulatedRun(900.0, 60.0, 0.4, None, None, WARMUP_S))


def test_a_launch_carries_the_spec_validated_at_submission_and_a_restart_keeps_it(tmp_path):
    first = service(tmp_path, Nodes())
    job = first.submit(FULL)["job_id"]
    (record,) = [r for r in first.journal.records if r["e"]["type"] == "Submitted"]
    assert record["spec"]["command"] == FULL["command"] and "launch" in record  # the submitted spec stays logged
    first.journal.close()  # dies before launching it

    nodes = Nodes()
    second = service(tmp_path, nodes)
    second.tick()
    (order,) = nodes.orders
    assert order.job_id == job and order.spec == FULL_LAUNCH
    assert second.estimators == {job: "declared"}  # what the metrics label its estimate with


def test_a_version_1_log_is_read_and_its_jobs_launch_with_their_spec(tmp_path):
    """A log written before launch specs were logged: a submission record holds only the spec."""
    assert JOURNAL_VERSION == 2
    validated = parse_spec(FULL)
    ticket = ticket_for_spec("full-00000001", validated, estimate_for_spec(validated))
    wal, _ = WriteAheadLog.open(tmp_path / "queue" / "current")
    wal.append_many([
        {"t": 0.0, "e": to_record(NodeJoined("n0", (GPU, GPU)))},
        {"t": 1.0, "e": to_record(Submitted(ticket)), "spec": validated.model_dump(mode="json"), "request_id": "r1"},
    ])
    wal.close()

    nodes = Nodes()
    queue = service(tmp_path, nodes)
    assert queue.status("full-00000001")["state"] == "queued"
    assert queue.submit(FULL, request_id="r1") == {"job_id": "full-00000001", "repeated": True}
    queue.tick()
    (order,) = nodes.orders
    assert order.job_id == "full-00000001" and order.spec == FULL_LAUNCH
    queue.journal.compact(lambda: [])  # the log rewritten in this version's layout
    queue.journal.close()
    wal, recovered = WriteAheadLog.open(tmp_path / "queue" / "current")
    wal.close()
    (submitted,) = [r for r in recovered.snapshot.value["records"] if r["e"]["type"] == "Submitted"]
    assert recovered.snapshot.value["version"] == 2 and "launch" in submitted

    restarted = Nodes()
    restarted.runs = dict(nodes.runs)  # the node still runs it: re-adopted, not launched again
    again = service(tmp_path, restarted)
    again.tick()
    assert again.status("full-00000001")["state"] == "running" and not restarted.orders
    assert again.journal.launch_spec(again.submissions["full-00000001"]) == FULL_LAUNCH
    assert again.estimators["full-00000001"] == "declared"
    again.journal.close()


def test_a_batch_is_one_durable_write_each_bad_spec_refused_alone_and_a_replayed_batch_queues_nothing_twice(
        tmp_path, monkeypatch):
    nodes = Nodes()
    queue = service(tmp_path, nodes)
    writes = []
    real_append = queue.journal.wal.append_many
    monkeypatch.setattr(queue.journal.wal, "append_many", lambda records, **options: writes.append(list(records)) or
                        real_append(records, **options))
    batch = [spec("a"), spec("too-big", mib=10 * GPU), {"name": "no-command", "memory_mib": 1000}, spec("b")]
    answers = queue.submit_many(batch, request_ids=["r-a", "r-big", "r-none", "r-b"])
    assert [("job_id" in a, "error" in a) for a in answers] == [(True, False), (False, True), (False, True),
                                                                  (True, False)]
    assert "too-big" in answers[1]["error"] and "no-command" in answers[2]["error"]  # each named
    assert len(writes) == 1 and len(writes[0]) == 2  # the two accepted, in one write
    again = queue.submit_many(batch, request_ids=["r-a", "r-big", "r-none", "r-b"])  # the client's retry
    assert [a.get("job_id") for a in again[::3]] == [answers[0]["job_id"], answers[3]["job_id"]]
    assert all(a.get("repeated") for a in again[::3]) and len(writes) == 1
    queue.journal.close()
    rebuilt = service(tmp_path, nodes)  # acknowledged means durable: both are there after a restart
    assert rebuilt.states([answers[0]["job_id"], answers[3]["job_id"]]) == {answers[0]["job_id"]: "queued",
                                                                            answers[3]["job_id"]: "queued"}
    rebuilt.journal.close()


class _BusyWith(Nodes):
    """Nodes whose exchange is still in flight when ``method`` is asked of them: they do not answer it."""

    def __init__(self, method: str):
        super().__init__()
        self.busy_method = method

    def call(self, node, method, *args):
        if method == self.busy_method:
            raise TimeoutError(f"node {node} is not answering")
        return super().call(node, method, *args)


def test_a_log_read_while_the_node_is_busy_says_nothing_yet_rather_than_failing(tmp_path):
    queue = service(tmp_path, _BusyWith("read_log"))
    job = queue.submit(spec("logged"))["job_id"]
    queue.tick()
    assert queue.read_log(job, 17) == {"text": "", "offset": 17, "done": False,  # the client asks again
                                       "waiting_on": ["n0"]}
    queue.journal.close()


def test_the_cluster_summary_names_a_live_node_that_did_not_answer_and_not_a_lost_one(tmp_path):
    queue = service(tmp_path, _BusyWith("summary"))
    queue.tick()
    answer = queue.cluster()
    assert answer["nodes"] == [] and answer["waiting_on"] == ["n0"]  # the client asks again
    queue.lost.add("n0")
    assert queue.cluster()["waiting_on"] == []  # a lost node is not waited on
    queue.journal.close()


def test_a_compaction_drops_the_records_of_nodes_gone_for_good_and_the_replay_is_the_same(tmp_path):
    """Autoscaled and spot nodes come once and leave: their records go with a compaction, but not
    those of a node a kept job ran on (its loss requeues the job on replay) or of a drained node
    (the drain waits for its return)."""
    churn = [e for i in range(50) for e in (NodeJoined(f"n-{i}", (GPU,), ("A100-40GB",)), NodeLost(f"n-{i}"))]
    run = (Placement("job", "ran", (0,), 4000.0),)
    kept = [NodeJoined("stays", (GPU,), ("A100-40GB",)), NodeJoined("ran", (GPU,), ("A100-40GB",)),
            NodeJoined("drained", (GPU,), ("A100-40GB",)),
            Submitted(JobTicket("job", "job", need_mib=4000.0)), RunStarted("job", 1, run), NodeLost("ran"),
            NodeDraining("drained"), NodeLost("drained")]
    journal, _, _ = Journal.open(tmp_path / "log")
    validated = parse_spec(spec("job", 4000))
    extras = [Journal.submission(validated, None, None) if isinstance(e, Submitted) else {} for e in churn + kept]
    journal.append(churn + kept, 1.0, extras)
    before = _rebuilt(journal.records)
    assert journal.compact(lambda: []) == len(churn)
    journal.close()
    _, records, _ = Journal.open(tmp_path / "log")
    after = _rebuilt(records)
    assert [Journal.event(r) for r in records] == kept
    assert dict(after.node_totals()) == dict(before.node_totals()) == {"stays": (GPU,)}
    assert after.drained_nodes() == before.drained_nodes() and after.drained_nodes()[0]["node"] == "drained"
    assert after.status("job") | {"history": None} == before.status("job") | {"history": None}
    assert after.status("job")["state"] == "queued" and after.status("job")["lost_runs"] == 1


def _rebuilt(records) -> Scheduler:
    scheduler = Scheduler(preset("magm"))
    scheduler.rebuild((Journal.event(r), r["t"]) for r in records)
    return scheduler
