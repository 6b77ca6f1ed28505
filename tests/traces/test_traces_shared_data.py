"""Broken or missing shared data files: errors name ``file:line`` and the problem.

Each test builds a private shared directory (symlinks to the real files, one file replaced) and
points ``HIER_SCHED_SHARED`` at it; the loaders' caches are keyed by that directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from traces import TraceError, load_trace
from traces._paths import shared_dir

REAL = shared_dir()


def _shared_with(tmp_path: Path, monkeypatch, relative: str, text: str) -> Path:
    """A shared dir where ``data/<relative>`` holds ``text`` and everything else is the real data."""
    *folders, file_name = Path("data", relative).parts
    source, mirror = REAL, tmp_path / "shared"
    for keep in [*folders, file_name]:
        mirror.mkdir()
        for entry in source.iterdir():
            if entry.name != keep:
                (mirror / entry.name).symlink_to(entry)
        source, mirror = source / keep, mirror / keep
    mirror.write_text(text)
    monkeypatch.setenv("HIER_SCHED_SHARED", str(tmp_path / "shared"))
    return mirror


def _real_text(relative: str) -> str:
    return (REAL / "data" / relative).read_text()


def test_carma_row_with_a_bad_number(tmp_path, monkeypatch):
    lines = _real_text("traces/carma/traces.csv").splitlines()
    lines[2] = lines[2].replace(",73,", ",soon,", 1)  # philly_heavy job 1 (line 3): submit time
    path = _shared_with(tmp_path, monkeypatch, "traces/carma/traces.csv", "\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"{re.escape(str(path))}:3: submit_time_s: not a number"):
        load_trace("carma:philly_heavy-60-tasks")


def test_carma_workload_missing_from_the_workload_table(tmp_path, monkeypatch):
    text = "\n".join(line for line in _real_text("workloads/carma_workloads.csv").splitlines()
                     if not line.startswith("vgg3.rad"))
    _shared_with(tmp_path, monkeypatch, "workloads/carma_workloads.csv", text + "\n")
    with pytest.raises(TraceError, match=r"traces.csv:\d+: workload 'vgg3' is not in carma_workloads.csv"):
        load_trace("carma:philly_heavy-60-tasks")


def test_gavel_line_with_missing_fields(tmp_path, monkeypatch):
    lines = _real_text("traces/gavel/msr/seed=0/795a4c.trace").splitlines()
    lines[1] = "\t".join(lines[1].split("\t")[:5])
    path = _shared_with(tmp_path, monkeypatch, "traces/gavel/msr/seed=0/795a4c.trace", "\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"{re.escape(str(path))}:2: expected 7 tab-separated fields, got 5"):
        load_trace("gavel:795a4c")


def test_openb_node_with_an_unknown_gpu_model(tmp_path, monkeypatch):
    lines = _real_text("traces/alibaba-openb-2023/openb_node_list_gpu_node.csv").splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",MI300"
    path = _shared_with(tmp_path, monkeypatch, "traces/alibaba-openb-2023/openb_node_list_gpu_node.csv",
                        "\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"{re.escape(str(path))}:6: unknown GPU model 'MI300'"):
        load_trace("openb:default")


def test_missing_shared_data_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HIER_SCHED_SHARED", str(tmp_path / "nowhere"))
    with pytest.raises(TraceError, match=r"shared data not found: .*nowhere.*HIER_SCHED_SHARED"):
        load_trace("carma:test")
