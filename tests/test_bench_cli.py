"""``hier-sched bench decide`` runs at a small size and reports what it measured (no figures are
asserted: measurements go to BENCHMARKS.md)."""

import json

from click.testing import CliRunner

from hier_sched.cli import main


def test_bench_decide_reports_its_decisions_at_a_small_size():
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "16", "--queued", "40", "--repeat", "25",
                                       "--warmup", "600", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["decisions"] == 25 and figures["queued"] == 40 and figures["nodes"] == 2
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["gpus_busy"] > 0 and not figures["supply_exhausted"]
    assert "Scheduler.step" in figures["what"]


def test_bench_decide_refuses_gpus_that_do_not_split_into_nodes():
    result = CliRunner().invoke(main, ["bench", "decide", "--gpus", "12", "--nodes-of", "8", "--json"])
    assert result.exit_code == 2 and "--gpus" in result.output and "nodes of 8" in result.output
