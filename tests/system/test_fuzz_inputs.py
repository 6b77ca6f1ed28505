"""Bad input, generated: every reader answers with its documented error, never another exception.

* job specs (``parse_spec`` on mappings, ``load_spec`` on YAML / TOML / JSON files): a ``JobSpec``
  or a ``SpecError`` whose problems name a field, or the file;
* users' trace files (CSV, JSON, JSON Lines): a ``Trace`` or a ``TraceError`` naming the file
  (and the line, where a line is at fault);
* ``dcgmi dmon`` / ``dcgmi discovery`` text and device names as nvidia-smi and NVML print them:
  never an exception at all (a node's monitoring must outlive a garbled line);
* the client API's ``est=``: spec fields or a ``SpecError``.

Inputs are mutations of valid ones (fields replaced by other types, huge or non-finite numbers,
unicode, deep nesting, unknown fields, truncation, flipped and inserted bytes) and plain garbage.
Each test runs few examples so that this file takes well under a minute; for a full run set
``HIER_SCHED_FUZZ_EXAMPLES`` (e.g. ``HIER_SCHED_FUZZ_EXAMPLES=5000 pytest tests/system/test_fuzz_inputs.py``).
The inputs the fuzzers found that once broke a reader are kept at the end as plain regression
tests (RELIABILITY.md, "Bad input").
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hier_sched.common.spec_files import load_spec
from hier_sched.core.gpu import GpuSample
from hier_sched.core.spec import JobSpec, SpecError, _location, parse_spec
from node_actor.backends.base import MigDevice
from node_actor.backends.dcgm import DcgmBackend
from node_actor.backends.dcgm_dmon import DmonParser, parse_dcgmi_discovery
from node_actor.backends.device_names import gpu_type_for, is_compute_device
from node_actor.backends.nvml import _text
from traces.schema import Trace, TraceError
from traces.user_files import load_user_file

EXAMPLES = int(os.environ.get("HIER_SCHED_FUZZ_EXAMPLES", "0")) or None


def fuzz(default: int):
    """Hypothesis settings: ``default`` examples, or ``HIER_SCHED_FUZZ_EXAMPLES`` for a full run."""
    return settings(max_examples=EXAMPLES or default, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------ values
HUGE = st.sampled_from([2**63, -(2**63) - 1, 10**30, 10**400, 1e308, -1e308, 5e-324])
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), HUGE,
                    st.sampled_from([0, -1, 1, 0.0, -0.0]))
texts = st.one_of(st.text(max_size=30), st.sampled_from(["", " ", "\x00", "ünïcødé", "名前", "\U0001f600" * 3,
                                                         "a" * 10_000, "1e999", "NaN", "-inf", "0x10", "١٢٣"]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)), max_leaves=12)


def nested(depth: int, leaf=1):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


# ------------------------------------------------------------------------------ job specs
VALID_SPEC = {
    "name": "resnet50-bs64", "command": ["python", "train.py", "--batch-size", "64"], "gpus": 2,
    "gpus_per_node": 1, "memory_mib": 7106.0, "estimator": "auto", "priority": 1,
    "model": {"factory": "pkg.mod:build", "batch_size": 64, "input_shape": [3, 224, 224], "optimizer": "adam"},
    "slot": {"length_s": 43200, "grace_s": 600}, "checkpoint_dir": "./ckpt", "env": {"A": "1"},
    "emulation": {"peak_mib": 7106, "duration_s": 2130, "smact": 0.64},
    "retry": {"max_retries": 1, "on_exit_codes": [1, 2]}, "max_attempts": 4,
    "runtime_env": {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip", "pip": ["six"], "env_vars": {"B": "2"}},
}
SPEC_FIELDS = set(JobSpec.model_fields)


@st.composite
def mutated_specs(draw):
    spec = json.loads(json.dumps(VALID_SPEC))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["replace", "replace", "nested", "drop", "add", "deep"]))
        if action == "replace":
            spec[draw(st.sampled_from(sorted(VALID_SPEC)))] = draw(values)
        elif action == "nested":
            outer = draw(st.sampled_from(["model", "slot", "emulation", "retry", "runtime_env"]))
            if isinstance(spec.get(outer), dict) and spec[outer]:
                spec[outer][draw(st.sampled_from(sorted(spec[outer])))] = draw(values)
        elif action == "drop" and spec:
            spec.pop(draw(st.sampled_from(sorted(spec))))
        elif action == "add":
            spec[draw(texts)] = draw(values)
        else:
            spec[draw(st.sampled_from(sorted(VALID_SPEC)))] = nested(draw(st.integers(1, 150)))
    return spec


def assert_names_a_field(err: SpecError, data) -> None:
    """Every problem starts with the field it is about (or ``spec`` for the whole spec); an odd
    key (empty, with a dot, not a string, very long) is quoted and cut (``_location``)."""
    names = SPEC_FIELDS | {"spec"} | ({_location(k) for k in data} if isinstance(data, dict) else set())
    for problem in err.problems:
        if problem.startswith(("expected a mapping", "line ", "not valid ", "cannot read")):
            continue
        assert any(problem.startswith((name + ":", name + ".")) for name in names), problem


@fuzz(150)
@given(mutated_specs())
@example({**VALID_SPEC, "memory_mib": float("nan")})
@example({**VALID_SPEC, "priority": 10**400})
@example({**VALID_SPEC, "command": {"python", "train.py"}})
@example({**VALID_SPEC, "env": {"a" * 10_000: None}})  # found at 5,000 examples: the whole key was printed
def test_a_spec_mapping_is_accepted_or_refused_with_its_fields_named(data):
    try:
        spec = parse_spec(data)
    except SpecError as err:
        assert_names_a_field(err, data)
        assert len(str(err)) < 20_000  # a huge or deeply nested value is cut, not printed whole
        return
    for value in (spec.memory_mib, spec.slot and spec.slot.length_s, spec.emulation and spec.emulation.peak_mib):
        assert value is None or math.isfinite(value)
    assert all(-(2**63) <= v < 2**63 for v in (spec.gpus, spec.priority, spec.max_attempts))


def _spec_texts():
    """Documents in every syntax, valid ones damaged, and garbage."""
    yaml_text = yaml.safe_dump(VALID_SPEC)
    json_text = json.dumps(VALID_SPEC)
    toml_text = "\n".join(['name = "x"', 'command = ["a", "b"]', "gpus = 2", "memory_mib = 7106.0",
                           "[slot]", "length_s = 100", "grace_s = 10"])
    damaged = st.builds(
        lambda text, cut, pos, junk: (text[:cut] if cut else text[:pos] + junk + text[pos:]),
        st.sampled_from([yaml_text, json_text, toml_text]), st.one_of(st.just(0), st.integers(1, 400)),
        st.integers(0, 400), st.text(max_size=8))
    documents = st.one_of(
        mutated_specs().map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
        mutated_specs().map(lambda d: json.dumps(d, ensure_ascii=False)),
        st.integers(1, 1_500).map(lambda n: "a: " + "[" * n + "]" * n),
        st.integers(1, 60_000).map(lambda n: '{"name": ' + "[" * n + "]" * n + "}"),
    )
    as_bytes = st.one_of(damaged, documents, st.text(max_size=200)).map(lambda t: t.encode("utf-8", "surrogatepass"))
    flipped = st.builds(lambda b, i, x: b[:i] + bytes([x]) + b[i + 1:],
                        st.sampled_from([yaml_text.encode(), json_text.encode(), toml_text.encode()]),
                        st.integers(0, 300), st.integers(0, 255))
    return st.one_of(as_bytes, flipped, st.binary(max_size=200))


@fuzz(150)
@given(_spec_texts(), st.sampled_from([".yaml", ".yml", ".json", ".toml"]))
def test_a_spec_file_is_accepted_or_refused_naming_the_file(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("spec") / f"job{suffix}"
    path.write_bytes(content)
    try:
        load_spec(path)
    except SpecError as err:
        assert str(path) in str(err)
        assert len(str(err)) < 20_000


# ------------------------------------------------------------------------------ user trace files
TRACE_FIELDS = ["job_id", "submit_s", "gpus", "duration_s", "peak_mib", "smact", "gpus_per_node", "gpu_milli",
                "priority", "user", "workload"]
cells = st.one_of(st.sampled_from(["0", "1", "4", "10.5", "7106", "", "-1", "nan", "inf", "1e999", "9" * 5000,
                                   "0.5", "x", "名", "\x00", '"', '"a,b"', "1,2"]), st.text(max_size=10))


@st.composite
def csv_texts(draw):
    header = draw(st.lists(st.sampled_from(TRACE_FIELDS + ["bogus", "ünï", ""]), min_size=0, max_size=8))
    if draw(st.booleans()):
        header = ["submit_s", "gpus", "duration_s", "peak_mib"] + header
    lines = [",".join(header)]
    for _ in range(draw(st.integers(0, 6))):
        width = len(header) + draw(st.sampled_from([0, 0, 0, -1, 1]))
        lines.append(",".join(draw(cells) for _ in range(max(width, 0))))
    text = "\n".join(lines)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


REQUIRED = ("submit_s", "gpus", "duration_s", "peak_mib")
trace_jobs = st.one_of(
    st.fixed_dictionaries({k: st.one_of(numbers, st.just(1)) for k in REQUIRED},
                          optional={k: values for k in TRACE_FIELDS if k not in REQUIRED}),
    values)


@st.composite
def json_traces(draw):
    """A JSON document (a list of jobs, or an object with ``jobs``), or JSON Lines (a job a line)."""
    jobs = draw(st.lists(trace_jobs, max_size=5))
    ascii_only = draw(st.booleans())
    if draw(st.booleans()):
        text = "\n".join(json.dumps(j, ensure_ascii=ascii_only) for j in jobs)
    else:
        doc = draw(st.one_of(st.just(jobs), st.fixed_dictionaries(
            {"jobs": st.just(jobs)}, optional={"name": values, "cluster": values, "extra": values}), values))
        text = json.dumps(doc, ensure_ascii=ascii_only, indent=draw(st.sampled_from([None, 1])))
    return text.encode("utf-8", "surrogatepass")


@fuzz(150)
@given(st.one_of(st.tuples(st.just(".csv"), csv_texts()), st.tuples(st.sampled_from([".json", ".jsonl"]), json_traces()),
                 st.tuples(st.sampled_from([".csv", ".json", ".jsonl"]), st.binary(max_size=300)),
                 st.tuples(st.sampled_from([".json", ".jsonl"]),
                           st.integers(1, 60_000).map(lambda n: ("[" * n + "]" * n).encode()))))
def test_a_user_trace_file_is_loaded_or_refused_naming_the_file(tmp_path_factory, case):
    suffix, content = case
    path = tmp_path_factory.mktemp("trace") / f"jobs{suffix}"
    path.write_bytes(content)
    try:
        trace = load_user_file(path)
    except TraceError as err:
        message = str(err)
        assert message.startswith(str(path)), message
        lines = len(re.split(rb"\r\n|\r|\n", content))  # a lone CR ends a line too (the csv module's count)
        for line in re.findall(rf"{re.escape(str(path))}:(\d+)", message):  # file:line points into the file
            assert 1 <= int(line) <= lines
        return
    assert isinstance(trace, Trace) and trace.jobs
    assert all(math.isfinite(j.submit_s) and j.duration_s > 0 and j.peak_mib > 0 for j in trace.jobs)


# ------------------------------------------------------------------------------ device text
RECORDED_DMON = [
    "#Entity   GPUTL   MCUTL   GRACT   SMACT   SMOCC   TENSO   DRAMA",
    "ID",
    "GPU 0     91      0       0.488   0.081   0.027   0.002   0.000",
    "GPU 1     N/A     N/A     N/A     N/A     N/A     N/A     N/A",
    "GPU-I 2   1       2       0.1     0.2     0.3     0.0     0.4",
]


@st.composite
def dmon_lines(draw):
    line = draw(st.sampled_from(RECORDED_DMON))
    kind = draw(st.sampled_from(["as is", "cut", "insert", "replace", "garbage", "bytes"]))
    if kind == "cut":
        return line[: draw(st.integers(0, len(line)))]
    if kind == "insert":
        i = draw(st.integers(0, len(line)))
        return line[:i] + draw(st.one_of(texts, st.sampled_from(["²", "٣", "9" * 5000, "1_000", "∞", " -1 ", "nan"]))) + line[i:]
    if kind == "replace":
        tokens = line.split()
        if tokens:
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(texts)
        return " ".join(tokens)
    if kind == "garbage":
        return draw(st.text(max_size=120))
    return draw(st.binary(max_size=120)).decode("utf-8", "replace")
    # "as is" falls through to the recorded line


@fuzz(200)
@given(st.lists(dmon_lines(), max_size=40), st.booleans())
def test_dcgmi_dmon_text_never_raises_and_keeps_only_sane_values(lines, with_ids):
    parser = DmonParser(field_ids=(203, 204, 1001, 1002, 1003, 1004, 1005) if with_ids else None)
    rows = parser.feed_lines(lines)
    assert parser.rows_parsed == len(rows)
    for entity in ("GPU", "GPU-I"):
        for entity_id, fields in parser.latest(entity).items():
            assert 0 <= entity_id < 10**9
            assert all(math.isfinite(v) and v >= 0 for v in fields.values())


@fuzz(150)
@given(st.lists(st.one_of(
    st.sampled_from(["| 0 | Name: NVIDIA A100-SXM4-40GB |", "|   | Device UUID: GPU-abc |", "+---+", "| ² |",
                     "| " + "9" * 5000 + " | x |", "| 1 |"]),
    st.text(max_size=80)), max_size=20))
def test_dcgmi_discovery_text_never_raises(lines):
    uuids = parse_dcgmi_discovery("\n".join(lines))
    assert all(isinstance(k, int) and 0 <= k < 10**9 and isinstance(v, str) for k, v in uuids.items())


@fuzz(150)
@given(st.one_of(st.text(max_size=60), st.sampled_from(["NVIDIA A100-SXM4-40GB", "NVIDIA DGX Display", "Tesla T4",
                                                        "A100\x00", "ＮＶＩＤＩＡ Ａ１００", ""])),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63), 2**63)),
       st.binary(max_size=60))
def test_device_names_as_nvidia_smi_and_nvml_print_them_never_raise(name, memory_mib, raw):
    assert isinstance(is_compute_device(name), bool)
    assert isinstance(gpu_type_for(name, memory_mib), str)
    assert isinstance(_text(raw), str) and _text(name) == name


class _StaticMemory:
    """A memory source with fixed readings, standing in for NVML."""

    name = "static"

    def __init__(self) -> None:
        self.samples = [GpuSample(0, "GPU-0", 40960, 1000, smact=0.5)]

    def gpu_count(self) -> int:
        return 1

    def sample(self) -> list[GpuSample]:
        return list(self.samples)

    def gpu_type(self) -> str:
        return "A100-40GB"

    def uuids(self) -> list[str]:
        return ["GPU-0"]

    def mig_devices(self) -> list[MigDevice]:
        return []

    def close(self) -> None:
        pass


def test_a_dcgmi_stream_with_bytes_that_are_not_utf8_keeps_being_read():
    """Found by the parser fuzzing above: the reader thread decoded dcgmi's output strictly, so
    one byte that was not UTF-8 (or not in the locale's encoding) killed it and the readings went
    stale for good while dcgmi kept running."""
    script = ("import sys, time; w = sys.stdout.buffer.write; "
              "w(b'#Entity SMACT DRAMA\\nGPU 0 \\xff\\xfe 0.1\\n'); sys.stdout.flush(); time.sleep(0.3); "
              "w(b'GPU 0 0.25 0.5\\n'); sys.stdout.flush(); time.sleep(5)")
    backend = DcgmBackend(_StaticMemory(), command=[sys.executable, "-c", script], dcgm_to_index={0: 0},
                          stale_after_s=10)
    try:
        deadline = time.monotonic() + 10
        while backend.rows_parsed < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend.latest_fields() == {0: {1002: 0.25, 1005: 0.5}}
        assert backend.skipped == {"non-numeric value": 1}
    finally:
        backend.close()


# ------------------------------------------------------------------------------ client API
def _spec_with_est(est):
    from hier_sched.front.client import spec_from_est

    return parse_spec({"name": "x", "command": ["true"], **spec_from_est(est)})


class _Estimate:
    def __init__(self, peak):
        self.peak_mib = peak


def _float_sized(value) -> bool:
    """Not an integer beyond a float's range: that one has its own test below."""
    return not (isinstance(value, int) and abs(value) > 1e300)


@fuzz(150)
@given(st.one_of(scalars.filter(_float_sized), st.dictionaries(texts, values, max_size=4), st.lists(values, max_size=3),
                 st.floats(allow_nan=True, allow_infinity=True).map(_Estimate),
                 values.filter(_float_sized).map(_Estimate)))
def test_the_client_est_argument_gives_spec_fields_or_a_spec_error(est):
    try:
        spec = _spec_with_est(est)
    except SpecError as err:
        assert err.problems and all(p.startswith(("est", "memory_mib", "estimator", "model")) for p in err.problems), err
        return
    assert spec.memory_mib is None or math.isfinite(spec.memory_mib)


@pytest.mark.parametrize("est", [10**400, _Estimate(10**400)], ids=["int", "estimate"])
def test_an_est_too_big_for_a_float_is_a_spec_error(est):
    with pytest.raises(SpecError, match="est|memory_mib"):
        _spec_with_est(est)


def test_submitting_an_empty_command_is_a_spec_error():
    from hier_sched.front.client import submit

    with pytest.raises(SpecError, match="command"):
        submit([])


# ------------------------------------------------------------------------------ found, kept
def _write(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(("name", "content", "message"), [
    ("bad.yaml", b"name: x\ncommand: [a]\nuser: \xff\n", r"bad.yaml: line 3: not UTF-8 text \(byte 0xff\)"),
    ("utf16.json", '{"name": "x"}'.encode("utf-16"), "not UTF-8 text"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "not valid json: nested too deeply"),
    ("deep.yaml", b"a: " + b"[" * 2_000 + b"]" * 2_000, "not valid yaml: nested too deeply"),
    ("deep.toml", b"a = " + b"[" * 5_000 + b"]" * 5_000, "not valid toml: nested too deeply"),
    ("long.json", b'{"name": "x", "command": ["a"], "gpus": ' + b"9" * 5_000 + b"}", "not valid json: .*digits"),
    ("twice.json", b'{"name": "x", "name": "y", "command": ["a"]}', "key 'name' given twice"),
    ("twice.yaml", b"name: x\ncommand: [a]\nname: y\n", "key 'name' given twice"),
    ("inf.json", b'{"name": "x", "command": ["a"], "memory_mib": Infinity}', "memory_mib: .*finite number"),
    ("inf.yaml", b"name: x\ncommand: [a]\nemulation: {peak_mib: .inf, duration_s: 10}\n",
     r"emulation.peak_mib: .*finite number"),
    ("set.yaml", b"name: x\ncommand: !!set {a: null, b: null}\n", r"command: must be a list"),
    ("shape.yaml", b"name: x\ncommand: [a]\nmodel: {input_shape: !!set {3: null, 224: null}}\n",
     r"model.input_shape: .*a set has no order"),
    ("prio.yaml", b"name: x\ncommand: [a]\npriority: 100000000000000000000\n", r"priority: .*less than or equal"),
    ("nul.json", b'{"name": "x", "command": ["a\\u0000b"]}', "command: an argument contains a NUL"),
    ("env.yaml", b"name: x\ncommand: [a]\nenv: {'A=B': '1'}\n", "env: 'A=B': a variable needs a non-empty name"),
])
def test_spec_inputs_that_broke_the_reader(tmp_path, name, content, message):
    """Each once escaped as UnicodeDecodeError, RecursionError or ValueError, or was accepted:
    an infinite memory need, a set's arbitrary order as argv, a priority the 64-bit event log
    cannot hold, a NUL byte no exec can take, a repeated key silently overriding the first."""
    with pytest.raises(SpecError, match=message):
        load_spec(_write(tmp_path, name, content))


def test_a_spec_file_may_start_with_a_byte_order_mark(tmp_path):
    assert load_spec(_write(tmp_path, "bom.json", b'\xef\xbb\xbf{"name": "x", "command": ["a"]}')).name == "x"


def test_a_huge_nested_value_is_cut_in_the_message():
    bomb = nested(40)
    for _ in range(8):
        bomb = [bomb] * 9  # a YAML alias bomb: shared, so cheap to build, 9**8 leaves to print
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "x", "command": ["a"], "env": {"X": bomb}})
    assert len(str(err.value)) < 1000


H = b"submit_s,gpus,duration_s,peak_mib\n"


@pytest.mark.parametrize(("name", "content", "message"), [
    ("latin1.csv", H + b"0,1,10,1000\n0,1,10,caf\xe9\n", r"latin1.csv:3: not UTF-8 text"),
    ("wide.csv", H + b"0,1,10," + b"1" * 200_000 + b"\n", r"wide.csv:2: not a readable CSV row"),
    ("twice.csv", b"submit_s,gpus,gpus,duration_s,peak_mib\n0,1,2,10,1000\n", r"twice.csv:1: column\(s\) given twice: gpus"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "deep.json: not valid JSON: nested too deeply"),
    ("long.json", b'[{"submit_s": 0, "gpus": ' + b"9" * 5_000 + b', "duration_s": 1, "peak_mib": 1}]',
     "long.json: not valid JSON"),
    ("long.jsonl", b'{"submit_s": 0, "gpus": ' + b"9" * 5_000 + b', "duration_s": 1, "peak_mib": 1}\n',
     r"long.jsonl:1: not valid JSON"),
    ("bad.jsonl", b'{"submit_s": 0, "gpus": 1, "duration_s": 1, "peak_mib": 1}\n{"user": "\xff"}\n',
     r"bad.jsonl:2: not UTF-8 text"),
    ("sep.jsonl", '{"submit_s": 0, "gpus": 1, "duration_s": 1, "peak_mib": 1, "user": "a\u2028b"}\n'.encode(), None),
    ("cluster.json", b'{"jobs": [{"submit_s": 0, "gpus": 1, "duration_s": 1, "peak_mib": 1}], '
                     b'"cluster": {"nodes": -1, "gpus_per_node": 0}}', "cluster: nodes, gpus_per_node .* >= 1"),
    ("name.json", b'{"jobs": [{"submit_s": 0, "gpus": 1, "duration_s": 1, "peak_mib": 1}], "name": [1]}',
     "name: expected a string"),
])
def test_trace_files_that_broke_the_reader(tmp_path, name, content, message):
    """Each once escaped as UnicodeDecodeError, csv.Error, RecursionError or ValueError, or was
    accepted: a repeated column silently taking the last value, a cluster of -1 nodes. A JSON
    Lines record with a U+2028 (legal, unescaped, inside a JSON string) was cut in two."""
    path = _write(tmp_path, name, content)
    if message is None:
        assert load_user_file(path).jobs[0].user == "a\u2028b"
        return
    with pytest.raises(TraceError, match=message):
        load_user_file(path)


def test_a_csv_trace_from_a_spreadsheet_with_a_byte_order_mark_loads(tmp_path):
    """It used to fail with ``unknown field(s) \\ufeffsubmit_s``."""
    trace = load_user_file(_write(tmp_path, "excel.csv", b"\xef\xbb\xbf" + H + b"0,1,10,1000\n"))
    assert [j.gpus for j in trace.jobs] == [1]


@pytest.mark.parametrize("line", ["GPU ² 0.5 0.5", "GPU " + "9" * 5000 + " 0.5 0.5", "GPU ٣ 0.5 0.5"])
def test_dmon_rows_with_ids_that_broke_the_parser_are_skipped(line):
    """``str.isdigit`` passed a superscript two and a 5,000-digit id to ``int``, which raised."""
    parser = DmonParser(field_ids=(1002, 1005))
    assert parser.feed(line) is None and parser.skipped == {"not a header or an entity row": 1}


@pytest.mark.parametrize("value", ["1_000", "١٫٥", "0x10", "∞"])
def test_dmon_values_float_would_misread_are_not_numbers(value):
    parser = DmonParser(field_ids=(1002, 1005))
    assert parser.feed(f"GPU 0 {value} 0.5") is None and parser.skipped == {"non-numeric value": 1}


def test_dcgmi_discovery_with_an_absurd_id_is_left_out():
    text = "| " + "9" * 5000 + " | Name: x |\n|   | Device UUID: GPU-x |\n| 1 | Name: y |\n|   | Device UUID: GPU-y |"
    assert parse_dcgmi_discovery(text) == {1: "GPU-y"}


def test_a_device_name_that_is_not_utf8_is_read_not_raised():
    assert _text(b"NVIDIA A100\xff") == "NVIDIA A100\ufffd"
