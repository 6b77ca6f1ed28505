"""Replay on a cluster of several node types: ``--nodes-spec`` / ``--cluster`` and per-type placement."""

import json

import pytest
from click.testing import CliRunner

from hier_sched.core.gpu import SharingMode
from hier_sched.core.presets import preset
from hier_sched.front.cli import main
from replay.cluster_spec import load_cluster_file, parse_nodes_spec, shape_of_groups
from replay.engine import Simulator
from replay.estimates import estimator_for
from replay.run import ReplayOptions, shape_for
from traces.schema import Trace, TraceJob


def job(jid, submit, duration, peak, gpus=1, priority=0):
    return TraceJob(jid, submit, "w", gpus, duration, peak, smact=0.5, smocc=0.2, drama=0.2, priority=priority)


def test_the_compact_grammar_and_the_file_give_the_same_nodes_in_order(tmp_path):
    groups = parse_nodes_spec("V100-16GB:2x4, A100-40GB:1x8")
    assert groups == (("V100-16GB", 2, 4), ("A100-40GB", 1, 8))
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - {type: V100-16GB, count: 2, gpus: 4}\n  - {type: A100-40GB, count: 1, gpus: 8}\n")
    assert load_cluster_file(path) == groups
    (tmp_path / "cluster.json").write_text(json.dumps([{"type": "V100-16GB", "count": 2, "gpus": 4},
                                                       {"type": "A100-40GB", "count": 1, "gpus": 8}]))
    assert load_cluster_file(tmp_path / "cluster.json") == groups
    shape = shape_of_groups(groups, SharingMode.MPS)
    assert shape.nodes == (("node0000", 4, "V100-16GB"), ("node0001", 4, "V100-16GB"), ("node0002", 8, "A100-40GB"))


@pytest.mark.parametrize("text, words", [("A100-40GB:4", "expected TYPE:COUNTxGPUS"),
                                         ("B200:1x4", "unknown GPU type 'B200'"),
                                         ("A100-40GB:0x4", "count must be a whole number >= 1")])
def test_a_bad_nodes_spec_names_the_part_and_what_is_expected(text, words):
    with pytest.raises(ValueError, match=words):
        parse_nodes_spec(text)


def test_a_bad_cluster_file_names_the_group(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- {type: A100-40GB, count: 1}\n")
    with pytest.raises(ValueError, match="node group 1: expected exactly the fields type, count, gpus"):
        load_cluster_file(path)


def test_node_groups_exclude_the_uniform_flags():
    with pytest.raises(ValueError, match="leave out --nodes"):
        shape_for(Trace("t", [job("a", 0, 10, 1000)]), ReplayOptions(nodes=2, node_groups=(("T4", 1, 1),)))


def test_a_job_too_big_for_the_small_gpus_runs_on_the_big_ones_and_aware_placement_keeps_them_for_it():
    """One A100-40GB node and one V100-16GB node, one GPU each, no sharing. The 30 GB job waits
    for the busy A100; small jobs of a higher priority queue up before it. Type-aware placement
    keeps the A100 for the big job (the small ones wait for the V100), so it starts as soon as the
    A100 frees; type-agnostic placement lets the small jobs take it first."""
    jobs = ([job("first", 0, 100, 3000), job("big", 1, 100, 30000)]
            + [job(f"s{i}", 2 + i, 100, 3000, priority=1) for i in range(4)])
    shape = shape_of_groups(parse_nodes_spec("A100-40GB:1x1,V100-16GB:1x1"), SharingMode.NONE)
    starts = {}
    for aware in (True, False):
        sim = Simulator(Trace("t", jobs), shape, preset("auto", type_aware=aware), estimator_for("oracle"))
        sim.run()
        assert all(j.state == "done" for j in sim.jobs.values())
        assert sim.jobs["big"].oom_crashes == 0
        starts[aware] = sim.jobs["big"].first_start_s
    assert starts[True] < starts[False]


def test_the_cli_runs_a_mixed_cluster_both_ways(tmp_path):
    for extra in ([], ["--type-agnostic"]):
        out = tmp_path / f"r{len(extra)}.json"
        res = CliRunner().invoke(main, ["replay", "--trace", "carma:test", "--estimator", "oracle", "--quiet",
                                        "--nodes-spec", "V100-16GB:1x2,A100-40GB:1x2", "--json", str(out), *extra])
        assert res.exit_code == 0, res.output
        data = json.loads(out.read_text())
        assert (data["nodes"], data["gpus"], data["completed"]) == (2, 4, 5)
    res = CliRunner().invoke(main, ["replay", "--trace", "carma:test", "--nodes-spec", "A100-40GB:1x2",
                                    "--nodes", "3"])
    assert res.exit_code != 0 and "leave out --nodes" in res.output
