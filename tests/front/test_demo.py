"""The demo's door: what a new user meets before any cluster starts."""

from click.testing import CliRunner

from hier_sched.front.cli import main


def test_the_demo_without_the_shared_data_says_where_it_looked_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HIER_SCHED_SHARED", str(tmp_path / "nowhere"))
    res = CliRunner().invoke(main, ["demo"])
    assert res.exit_code == 1
    assert "shared data not found" in res.output and "HIER_SCHED_SHARED" in res.output
    assert isinstance(res.exception, SystemExit)  # a clean exit, not an exception with its traceback
