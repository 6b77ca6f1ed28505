"""``hier-sched top`` as a person sees it: a fixed view on 80x24 and 120x40 screens, a pipe, a
scheduler that stops answering, the real command in a tmux terminal, wait reasons whole at 100
columns, and times on an emulated cluster."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from rich.cells import cell_len
from rich.console import Console

from hier_sched.front.cli import main
from hier_sched.front.top import plain_text, render, short_reason
from hier_sched.front.top_view import ApiFetcher, JobRow, RunDetail, TopView, events_from_history, file_fetcher

FIXTURE = Path(__file__).parent / "data" / "top_view.json"


def screen(view, width, height):
    console = Console(width=width, height=height, color_system=None, force_terminal=True, legacy_windows=False)
    with console.capture() as cap:
        console.print(render(view, width, height))
    return cap.get().splitlines()


def degraded_payload():
    """The fixture without any field the scheduler may not send yet."""
    data = json.loads(FIXTURE.read_text())
    for node in data["cluster"]["nodes"]:
        del node["gpu_detail"]
        node.pop("runs", None)
    for job in data["jobs"]:
        for key in ("progress", "slot_left_s", "queue"):
            job.pop(key, None)
    del data["events"]
    return data


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40), (60, 16)])
def test_screen_fits_and_shows_what_matters(width, height):
    view = file_fetcher(FIXTURE)()
    lines = screen(view, width, height)
    assert len(lines) <= height
    assert all(cell_len(line) <= width for line in lines), max(lines, key=cell_len)
    text = "\n".join(lines)
    for expected in ("hier_sched top", "7 running", "6 queued", "GPUs", "node0", "node1", "Running", "Queue",
                     "recovery 1", "Recent events", "█", "▒"):
        assert expected in text, expected
    assert "0c6d2f" in text and "recov" in text  # the recovery queue comes first, with its reason
    assert "d4a0b3" in text  # the newest event (a preemption)
    if height >= 40:
        assert all(f"node{n}" in text for n in (0, 1)) and text.count("█") > 50
        for job in ("a1f3c2", "a9c4e6", "13b5a8", "5d2e6b"):  # every running and waiting job
            assert job in text
        assert "checkpointing" in text and "62%" in text and "2h36" in text  # progress, slot time left
        assert "18%" in text and "21.0/20.0" in text  # progress and peak so far, as the job's node tells them
        assert "why it waits" in text and "needs 2 idle GPU(s)" in text
    else:
        assert "more)" in text  # a section says how many rows did not fit


def test_without_the_optional_fields_the_screen_degrades():
    data = degraded_payload()
    view = TopView.from_payloads(data["cluster"], data["jobs"], None, data["now"])
    lines = screen(view, 80, 24)
    text = "\n".join(lines)
    assert all(cell_len(line) <= 80 for line in lines)
    assert "up 48m" in text  # no progress: time since it started
    assert "30.0/-/39.6" in text  # in use from free MiB, total from the GPU type, no reservation
    assert "Recent events 0" in text


def test_plain_text_lists_everything_without_escape_codes():
    text = plain_text(file_fetcher(FIXTURE)())
    assert "\x1b" not in text
    for job in json.loads(FIXTURE.read_text())["jobs"]:
        if job["state"] in ("queued", "running", "checkpointing"):
            assert job["job_id"] in text
    assert "recovering after 1 OOM crash(es); no GPU with 24.6 GiB free (best: node1 gpu2, 20.0 GiB)" in text


def test_plain_text_shows_brackets_in_reasons_as_written():
    """Rich reads ``[word]`` as markup: a reason's ``pip: [transformers]`` must not vanish."""
    data = json.loads(FIXTURE.read_text())
    job = next(j for j in data["jobs"] if j["state"] == "queued")
    job["reason"] = "add it to the job's runtime_env (pip: [transformers])"
    view = TopView.from_payloads(data["cluster"], data["jobs"], data["events"], float(data["now"]))
    assert "(pip: [transformers])" in plain_text(view)


def test_history_becomes_events():
    history = [(1.0, "queued", "running", "started on node0"),
               (2.0, "running", "queued", "out of memory (crash 1), recovering with a larger margin: CUDA out of memory"),
               (3.0, "queued", "running", "started on node1"),
               (4.0, "running", "checkpointing", "checkpoint signal sent: its time slot ends"),
               (5.0, "checkpointing", "queued", "checkpointed; requeued behind the jobs that waited"),
               (6.0, "queued", "running", "resumed"),
               (7.0, "running", "queued", "slot ended before it checkpointed; restarts from scratch"),
               (8.0, "queued", "failed", "failed (exit code 1); no retries left")]
    kinds = [e.kind for e in events_from_history("j", history)]
    assert kinds == ["oom", "recovery", "preemption", "checkpoint", "preemption", "failed"]


class FakeScheduler:
    def __init__(self):
        data = json.loads(FIXTURE.read_text())
        self.cluster = data["cluster"]  # without events: the fetcher reads them from histories
        self.jobs = data["jobs"]
        self.calls = []
        self.down = False

    def __call__(self, method, body):
        self.calls.append(method)
        if self.down:
            raise RuntimeError("the hier_sched cluster at port 1 does not answer")
        if method == "cluster":
            return self.cluster
        if method == "status":
            return self.jobs
        if method == "history":
            return [(100.0, "running", "queued", "out of memory (crash 1), recovering with a larger margin")]
        raise KeyError(method)


def test_api_fetcher_reads_histories_once_and_keeps_the_last_view_when_the_scheduler_stops_answering():
    api = FakeScheduler()
    fetch = ApiFetcher(api, clock=lambda: 1_750_000_000.0)
    first = fetch()
    interesting = [j for j in api.jobs if j["oom_crashes"] or j["checkpoints"] or j["attempts"] > 1
                   or j["state"] in ("failed", "cancelled", "checkpointing")]
    assert api.calls.count("history") == len(interesting) < len(api.jobs)
    assert {e.job_id for e in first.events} == {j["job_id"] for j in interesting}
    assert {e.kind for e in first.events} == {"oom"}
    fetch()
    assert api.calls.count("history") == len(interesting)  # nothing changed: no new history reads
    api.down = True
    stale = fetch()
    assert stale.error and "does not answer" in stale.error
    assert stale.jobs == first.jobs
    assert "scheduler unreachable" in "\n".join(screen(stale, 80, 24))


def test_cli_top_prints_a_plain_table_when_piped(tmp_path):
    res = CliRunner().invoke(main, ["top", "--demo-data", str(FIXTURE)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "0c6d2f" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = CliRunner().invoke(main, ["top", "--demo-data", str(bad)])
    assert res.exit_code == 2 and "bad.json: not a top view" in res.output


def test_cli_top_without_a_scheduler_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HIER_SCHED_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens there
    res = CliRunner().invoke(main, ["top"])
    assert res.exit_code == 1 and "no Ray cluster answers at 127.0.0.1:1" in res.output


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_in_a_real_80x24_terminal_and_q_quits(tmp_path):
    session = f"hs-top-test-{os.getpid()}"
    done = tmp_path / "exit"
    command = (f"{Path(sys.executable).parent / 'hier-sched'} top --demo-data {FIXTURE} --interval 0.5; "
               f"echo $? > {done}; sleep 5")
    subprocess.run(["tmux", "-u", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
                   check=True, cwd=ROOT)
    try:
        text = ""
        for _ in range(60):  # the first frame after the interpreter starts
            time.sleep(0.25)
            text = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout
            if "q quits" in text:
                break
        lines = text.splitlines()
        assert "hier_sched top" in lines[0] and "q quits" in text, text
        assert len(lines) <= 24 and all(cell_len(line) <= 80 for line in lines)
        assert "node0" in text and "0c6d2f" in text and "█" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(40):
            if done.exists() and done.read_text().strip():
                break
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
        after = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        assert "hier_sched top" not in after  # the alternate screen is gone: the shell is as it was
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_the_queue_gives_the_reason_the_room_a_name_column_would_repeat(tmp_path):
    """Job ids as the scheduler makes them (``<name>-<8 hex>``) and reasons as it words them: the
    name column, which would repeat the ids, gives way, and the reason is shown without the
    reserve's explanation (``status`` has the whole sentence)."""
    data = json.loads(FIXTURE.read_text())
    renamed = {j["job_id"]: f"{j['name']}-{j['job_id']}00" for j in data["jobs"]}
    for job in data["jobs"]:
        job["job_id"] = renamed[job["job_id"]]
        job["reason"] = (job.get("reason") or "").replace(" GiB free (best:", " GiB usable (best:").replace(
            " GiB)", " GiB; usable = free minus the 0.5 GiB kept free on every GPU)")
    (tmp_path / "view.json").write_text(json.dumps(data))
    view = file_fetcher(tmp_path / "view.json")()
    for width in (100, 120):
        text = "\n".join(screen(view, width, 45))
        queue = text[text.index("Queue "):text.index("Recent events")]
        assert "why it waits" in queue and " name " not in queue.splitlines()[1]
        assert "kept free" not in queue and "inception-v3-bs128-13b5a800 " in queue
    assert "no GPU with 23.9 GiB usable (best: node1 gpu2, 20.0 GiB)" in queue


def test_a_job_whose_estimate_is_being_made_is_listed_with_its_reason():
    data = json.loads(FIXTURE.read_text())
    job = dict(data["jobs"][0], job_id="est-5e7a11", name="est", state="estimating", node=None, gpus=1,
               estimate_mib=None, reason="estimating: auto on mymodels:build (batch 32) for A100-40GB where the "
                                         "job's code lives, for 4 s")
    view = TopView.from_payloads(data["cluster"], [*data["jobs"], job], None, data["now"])
    text = "\n".join(screen(view, 160, 60))
    assert "1 estimating" in text and "estimating 1" in text
    assert "est-5e7a11" in text and "estim" in text and "auto on mymodels:build" in text


def queue_reasons(lines: list[str]) -> str:
    """The text of the queue's "why it waits" column, its wrapped lines joined."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Queue "))
    header = lines[start + 1]
    column = header.index("why it waits")
    body = []
    for line in lines[start + 2:]:
        if line.startswith(("Recent events", "q quits")):
            break
        body.append(line[column:].strip())
    return " ".join(body)


# as the scheduler words them on a 2 x 2 GPU cluster (a live run; hier_sched/core/scheduler_queries.wait_reason)
LIVE_REASONS = [
    "waiting: no GPU with 31.3 GiB usable (best: node1 gpu1, 25.2 GiB; usable = free minus the 0.5 GiB kept free "
    "on every GPU)",
    "waiting: needs 8.9 GiB usable on 1 GPU(s) of 1 node(s); node1: 0/1 GPU(s) pass the gates; gpu0: utilization "
    "gate (SMACT 0.93, SMOCC 0.59, DRAMA 0.49); gpu1: utilization gate (SMACT 0.87, SMOCC 0.54, DRAMA 0.45)",
    "waiting: needs 8.9 GiB usable on 1 GPU(s) of 1 node(s); a smaller job of the same kind could not start this "
    "cycle",
]


@pytest.mark.parametrize("width", [100, 120])
def test_wait_reasons_wrap_whole_in_their_column_at_100_and_120_columns(width):
    data = json.loads(FIXTURE.read_text())
    queued = [j for j in data["jobs"] if j["state"] == "queued"]
    for job, reason in zip(queued, LIVE_REASONS * 2):
        job.update(job_id=f"{job['name']}-{job['job_id']}00", reason=reason)  # ids as the scheduler makes them
    view = TopView.from_payloads(data["cluster"], data["jobs"], data["events"], data["now"])
    lines = screen(view, width, 40)
    assert len(lines) <= 40 and all(cell_len(line) <= width for line in lines)
    shown = queue_reasons(lines)
    for reason in LIVE_REASONS:
        assert short_reason(reason) in shown
    assert "…" not in shown


def test_a_short_screen_gives_each_section_a_row_before_a_reason_more_lines():
    data = json.loads(FIXTURE.read_text())
    for job in data["jobs"]:
        if job["state"] == "queued":
            job["reason"] = LIVE_REASONS[1]
    view = TopView.from_payloads(data["cluster"], data["jobs"], data["events"], data["now"])
    roomy = screen(view, 100, 40)
    assert queue_reasons(roomy).count("DRAMA") == 2 * 3  # whole: 3 rows shown of 6 (5 lines each)
    short = screen(view, 100, 24)
    assert len(short) <= 24
    assert "Recent events" in "\n".join(short) and "ago" in "\n".join(short)  # the events keep a row
    assert "…" in queue_reasons(short)  # the reason is cut, not the section


def test_on_an_emulated_cluster_times_are_wall_clock_with_the_emulated_time_beside_them():
    data = json.loads(FIXTURE.read_text())
    data["cluster"]["time_scale"] = 0.01  # 100 emulated seconds a wall second
    view = TopView.from_payloads(data["cluster"], data["jobs"], data["events"], data["now"])
    text = "\n".join(screen(view, 120, 50))
    assert "time x0.01" in text and "times: wall clock (emulated)" in text
    assert "36m (2d13)" in text  # 3e0b44 waited 2200 s, 61 emulated hours
    assert "up 48m (3d08)" not in text and "62%" in text  # a job that reports progress shows it
    assert " 95s (2h38) d4a0b3 preemption" in text  # the events, too
    plain = plain_text(view)
    assert "36m (2d13)" in plain
    real = "\n".join(screen(file_fetcher(FIXTURE)(), 120, 50))  # time x1: wall clock only
    assert "(emulated)" not in real and " 36m " in real


def test_a_running_job_takes_progress_and_peak_from_the_nodes_of_its_current_run():
    row = JobRow(job_id="g", state="running", attempts=2, observed_peak_mib=9000.0)
    runs = [RunDetail(job_id="g", attempt=2, progress=0.4, peak_mib=12000.0),
            RunDetail(job_id="g", attempt=2, progress=None, peak_mib=15000.0),  # another rank of the gang
            RunDetail(job_id="g", attempt=1, progress=0.9, peak_mib=30000.0)]  # an earlier run, not ended there yet
    live = row.with_runs(runs)
    assert (live.progress, live.observed_peak_mib) == (0.4, 15000.0)
    assert row.with_runs([]) == row  # the node says nothing (yet): the status object's own
    queued = row.model_copy(update={"state": "queued"})
    assert queued.with_runs(runs) == queued


def test_team_queues_get_a_section_and_waiting_jobs_name_their_queue():
    data = json.loads(FIXTURE.read_text())
    data["cluster"]["queues"] = [
        {"name": "team-a", "nominal_gpus": 2, "used_gpus": 3, "borrowed_gpus": 1, "fair_share_gpus": 2, "waiting": 0},
        {"name": "notebooks", "nominal_gpus": None, "nominal_mib": 81920, "used_gpus": 1, "used_mib": 20480,
         "fair_share_mib": 81920, "waiting": 2}]
    waiting = next(j for j in data["jobs"] if j["state"] == "queued" and not j.get("oom_crashes"))
    waiting["queue"] = "notebooks"
    view = TopView.from_payloads(data["cluster"], data["jobs"], data["events"], data["now"])
    text = plain_text(view)
    assert "Team queues 2" in text
    team_a = next(line for line in text.splitlines() if line.strip().startswith("team-a"))
    assert team_a.split()[1:] == ["3", "2", "2", "1", "0"]  # used, fair share, nominal, borrowed, waiting
    assert "80.0 GiB" in text
    row = next(line for line in text.splitlines() if waiting["job_id"] in line)
    assert "notebooks" in row
    lines = screen(view, 100, 40)
    assert all(cell_len(line) <= 100 for line in lines) and "Team queues 2" in "\n".join(lines)


def test_the_header_names_the_nodes_that_drain():
    data = json.loads(FIXTURE.read_text())
    data["cluster"]["drains"] = [{"node": "node1", "state": "draining", "reason": "kernel upgrade", "jobs": ["a"]}]
    view = TopView.from_payloads(data["cluster"], data["jobs"], data.get("events"), data["now"])
    assert "node1 draining" in plain_text(view).splitlines()[0]
    assert "draining" not in plain_text(file_fetcher(FIXTURE)()).splitlines()[0]


def test_api_fetcher_keeps_the_last_row_of_a_node_busy_with_a_ticks_exchange():
    api = FakeScheduler()
    fetch = ApiFetcher(api, clock=lambda: 1_750_000_000.0)
    names = [n.node for n in fetch().cluster.nodes]
    busy = names[0]
    api.cluster = {**api.cluster, "nodes": [n for n in api.cluster["nodes"] if n["node"] != busy],
                   "waiting_on": [busy]}
    assert sorted(n.node for n in fetch().cluster.nodes) == sorted(names)
    api.cluster = {**api.cluster, "waiting_on": []}  # gone for good (lost): no row
    assert busy not in [n.node for n in fetch().cluster.nodes]
