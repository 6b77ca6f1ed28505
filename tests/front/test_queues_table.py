"""``hier-sched queues``: the table a user reads, from a real scheduler's rows."""

from __future__ import annotations

import json

from hier_sched.core.events import JobTicket, NodeJoined, QueuesConfigured, Submitted
from hier_sched.core.presets import preset
from hier_sched.core.queues_spec import parse_queues
from hier_sched.core.scheduler import Scheduler
from hier_sched.front.cluster_cli import _print_queues


def rows() -> list[dict]:
    s = Scheduler(preset("magm"))
    s.apply([NodeJoined("n0", (40960.0,) * 4),
             QueuesConfigured(parse_queues({"queues": [
                 {"name": "team-a", "nominal": {"gpus": 1}, "borrowing_limit": {"gpus": 2}},
                 {"name": "notebooks", "cohort": "lab", "nominal": {"memory_mib": 40960}, "weight": 2}]}))], 0.0)
    s.step([Submitted(JobTicket(f"a{i}", f"a{i}", need_mib=30000.0, queue="team-a")) for i in (1, 2, 3, 4)], None, 1.0)
    return s.queue_usage()


def test_the_table_shows_each_queues_quota_use_fair_share_and_waiting_jobs(capsys):
    _print_queues(rows(), as_json=False)
    out = capsys.readouterr().out
    team_a = next(line for line in out.splitlines() if "team-a" in line)
    # nominal 1 GPU, may borrow 2 more; nothing runs yet (no snapshots); 4 wait, a fair share of 3
    assert [cell.strip() for cell in team_a.split("│")[1:-1]] == \
        ["team-a", "-", "1", "1 GPUs", "2 GPUs", "0 GPUs + 0.0 GiB", "0 GPUs", "3 GPUs", "4"]
    notebooks = next(line for line in out.splitlines() if "notebooks" in line)
    assert "lab" in notebooks and "40.0 GiB" in notebooks and "any idle" in notebooks


def test_json_gives_every_figure_in_mib_and_none_where_nothing_is_limited(capsys):
    _print_queues(rows(), as_json=True)
    team_a, notebooks = json.loads(capsys.readouterr().out)
    assert (team_a["nominal_gpus"], team_a["borrowing_limit_gpus"], team_a["nominal_mib"]) == (1, 2, None)
    assert (notebooks["nominal_gpus"], notebooks["nominal_mib"], notebooks["fair_share_gpus"]) == (None, 40960, None)
    assert team_a["fair_share_gpus"] == 3 and team_a["waiting"] == 4
