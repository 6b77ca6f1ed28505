"""The job's side of progress (``hs.report_progress``): a file the node reads for ``top``, named
in the job's environment, written at most once a second; nothing outside a scheduled job."""

from __future__ import annotations

import pytest

import hier_sched as hs
from hier_sched.common import progress
from hier_sched.common.progress import PROGRESS_FILE_ENV, read_progress


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    path = tmp_path / "attempt1.progress"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(path))
    monkeypatch.setattr(progress, "_last", None)  # a fresh job
    return path


def test_a_report_is_the_fraction_done_read_back_by_the_node(progress_file):
    assert read_progress(progress_file) is None  # nothing said yet
    assert hs.report_progress(40, 100)
    assert read_progress(progress_file) == 0.4
    assert oct(progress_file.stat().st_mode & 0o777) == "0o600"


def test_reports_are_written_at_most_once_a_second_and_the_end_at_once(progress_file, monkeypatch):
    clock = iter([100.0, 100.3, 100.6, 101.2, 101.3, 101.4])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    assert hs.report_progress(0.1)
    assert not hs.report_progress(0.2)  # 0.3 s later: skipped
    assert not hs.report_progress(0.3)
    assert hs.report_progress(0.4) and read_progress(progress_file) == 0.4  # 1.2 s after the first
    assert hs.report_progress(7, 7) and read_progress(progress_file) == 1.0  # done: at once
    assert not hs.report_progress(1.0)  # and only once


def test_outside_a_job_it_does_nothing(monkeypatch):
    monkeypatch.delenv(PROGRESS_FILE_ENV, raising=False)
    assert hs.report_progress(1, 2) is False
