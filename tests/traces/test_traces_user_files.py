"""Users' CSV / JSON / JSONL traces: the documented schema, and errors at ``file:line``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces import TraceError, load_trace


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_with_required_and_optional_columns(tmp_path):
    path = _write(tmp_path, "mine.csv",
                  "submit_s,gpus,duration_s,peak_mib,workload,smact,horus_mib,gpus_per_node\n"
                  "30,1,600,4000,resnet,0.7,,\n"
                  "0,4,1200,9000,bert,,12000,2\n")
    trace = load_trace(path)
    assert [j.job_id for j in trace.jobs] == ["mine-1", "mine-0"]  # submit order; ids from row order
    late, early = trace.jobs[1], trace.jobs[0]
    assert (late.workload, late.smact, late.horus_mib, late.gpus_per_node) == ("resnet", 0.7, None, None)
    assert (early.gpus, early.gpus_per_node, early.horus_mib, early.smact) == (4, 2, 12000.0, 0.5)
    assert trace.cluster is None and trace.name == path


def test_json_object_with_cluster_and_jsonl(tmp_path):
    doc = {"name": "lab", "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu_type": "H100-80GB"},
           "jobs": [{"job_id": 7, "submit_s": 0, "gpus": 1, "duration_s": 60, "peak_mib": 1000}]}
    trace = load_trace(_write(tmp_path, "t.json", json.dumps(doc, indent=2)))
    assert trace.name == "lab" and trace.cluster.gpu_type == "H100-80GB" and trace.jobs[0].job_id == "7"
    lines = "\n".join(json.dumps({"submit_s": s, "gpus": 1, "duration_s": 5, "peak_mib": 10}) for s in (3, 1))
    assert [j.submit_s for j in load_trace(_write(tmp_path, "t.jsonl", lines)).jobs] == [1.0, 3.0]


@pytest.mark.parametrize("body,where,problem", [
    ("submit_s,gpus,duration_s\n0,1,5\n", ":1:", "missing required field(s) peak_mib"),
    ("submit_s,gpus,duration_s,peak_mib,colour\n0,1,5,5,red\n", ":1:", "unknown field(s) colour"),
    ("submit_s,gpus,duration_s,peak_mib\n0,1,5,5\n0,one,5,5\n", ":3:", "gpus: Input should be a valid integer"),
    ("submit_s,gpus,duration_s,peak_mib\n0,0,5,5\n", ":2:", "gpus: must be >= 1"),
    ("submit_s,gpus,duration_s,peak_mib\n0,1,-5,5\n", ":2:", "duration_s: must be a finite number > 0"),
    ("submit_s,gpus,duration_s,peak_mib,smact\n0,1,5,5,1.5\n", ":2:", "smact: must be within [0, 1]"),
    ("submit_s,gpus,duration_s,peak_mib,gpus_per_node\n0,4,5,5,3\n", ":2:", "gpus_per_node: must divide"),
    ("submit_s,gpus,duration_s,peak_mib,gpu_milli\n0,2,5,5,500\n", ":2:", "fractional share needs gpus == 1"),
    ("job_id,submit_s,gpus,duration_s,peak_mib\na,0,1,5,5\na,1,1,5,5\n", ":3:", "'a' already used at"),
    ("submit_s,gpus,duration_s,peak_mib\n0,1,5\n", ":2:", "expected 4 fields"),
])
def test_csv_problems_name_file_and_line(tmp_path, body, where, problem):
    path = _write(tmp_path, "bad.csv", body)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}{where} " in str(err.value)
    assert problem in str(err.value)


def test_json_problems_name_the_line_of_the_job(tmp_path):
    jobs = [{"submit_s": 0, "gpus": 1, "duration_s": 5, "peak_mib": 5},
            {"submit_s": 1, "gpus": 1, "duration_s": 5, "peak_mib": -1}]
    path = _write(tmp_path, "bad.json", json.dumps({"jobs": jobs}, indent=2))
    bad_line = json.dumps({"jobs": jobs}, indent=2).splitlines().index("    {", 3) + 1
    with pytest.raises(TraceError, match=f"bad.json:{bad_line}: peak_mib: must be"):
        load_trace(path)


def test_all_problems_are_reported_together(tmp_path):
    rows = "".join(f"{i},0,5,5\n" for i in range(30))
    with pytest.raises(TraceError, match=r"30 problem\(s\)[\s\S]*and 10 more"):
        load_trace(_write(tmp_path, "many.csv", "submit_s,gpus,duration_s,peak_mib\n" + rows))


@pytest.mark.parametrize("name,text,match", [
    ("syntax.json", '[\n  {"submit_s": 0,\n  }\n]', r"syntax.json:3: not valid JSON"),
    ("scalar.json", "42", "expected a list of jobs"),
    ("gpu.json", json.dumps({"cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_type": "B200"}, "jobs": []}),
     "unknown GPU type"),
    ("empty.csv", "submit_s,gpus,duration_s,peak_mib\n", "no jobs"),
    ("trace.xlsx", "", "unsupported trace file type"),
])
def test_malformed_files(tmp_path, name, text, match):
    with pytest.raises(TraceError, match=match):
        load_trace(_write(tmp_path, name, text))


def test_missing_file_and_unknown_name():
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace("/nonexistent/trace.csv")
    with pytest.raises(TraceError, match=r"carma:philly_mix-90-tasks.*openb:default.*synthetic:philly"):
        load_trace("philly-mix")
