"""The job's side of settled memory (``hs.memory_settled``): a file the node watches, named in the
job's environment; nothing outside a scheduled job."""

from __future__ import annotations

import hier_sched as hs
from hier_sched.common.settling import SETTLED_FILE_ENV


def test_inside_a_job_it_writes_what_the_job_holds_for_its_node(tmp_path, monkeypatch):
    path = tmp_path / "attempt1.settled"
    monkeypatch.setenv(SETTLED_FILE_ENV, str(path))
    assert hs.memory_settled(7106.4)
    assert float(path.read_text()) == 7106.4
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_outside_a_job_it_does_nothing(monkeypatch):
    monkeypatch.delenv(SETTLED_FILE_ENV, raising=False)
    assert hs.memory_settled(1000.0) is False
