"""Users' own trace files: CSV, JSON or JSON Lines, one job per row / object.

Columns (CSV header) or keys (JSON) are ``TraceJob`` field names:

* required: ``submit_s`` (s from trace start), ``gpus``, ``duration_s`` (solo run time on an
  A100-40GB), ``peak_mib`` (true peak GPU memory per GPU);
* optional: ``job_id`` (default ``<file stem>-<n>``), ``workload`` (default ``custom``),
  ``smact``/``smocc``/``drama`` (solo means, 0-1), ``gpus_per_node`` (gang shape), ``batch_size``,
  ``model_kind``, ``horus_mib``/``faketensor_mib``/``gpumemnet_mib`` (recorded estimates),
  ``gpu_milli`` (fractional GPU share, 1-1000), ``user``, ``priority``.

An empty CSV cell or a JSON ``null`` in an optional column means "not given". A JSON file is either
a list of job objects or ``{"name": ..., "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu_type":
"A100-40GB"}, "jobs": [...]}``. Every problem is reported as ``file:line: field: problem`` (up to
``MAX_REPORTED`` of them at once); jobs are returned in submit order. Files are UTF-8 text (a
byte-order mark, as spreadsheet programs write, is allowed); anything else — other encodings,
binary data, JSON nested too deeply, numbers too long to read — is a ``TraceError`` with the
file and, where it can be known, the line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from hier_sched.core.gpu_types import GPU_TYPES
from traces.schema import ClusterHint, Trace, TraceError, TraceJob
from traces.validate import job_problems

__all__ = ["USER_SUFFIXES", "REQUIRED", "load_user_file"]

USER_SUFFIXES = (".csv", ".json", ".jsonl")
REQUIRED = ("submit_s", "gpus", "duration_s", "peak_mib")
MAX_REPORTED = 20
_FIELDS = tuple(f.name for f in fields(TraceJob))
_JOB = TypeAdapter(TraceJob)
_CLUSTER = TypeAdapter(ClusterHint)


class _Problems:
    """Collects ``where: problem`` lines and raises them together."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[str] = []

    def add(self, where: str, problem: str) -> None:
        self.lines.append(f"{where}: {problem}")

    def raise_if_any(self) -> None:
        if self.lines:
            shown = self.lines[:MAX_REPORTED]
            more = len(self.lines) - len(shown)
            tail = f"\n  ... and {more} more" if more else ""
            raise TraceError(f"{self.path}: {len(self.lines)} problem(s):\n  " + "\n  ".join(shown) + tail)


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None


def _csv_records(path: Path, problems: _Problems) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    try:
        header = reader.fieldnames or []
        _check_keys(header, f"{path}:1", problems)
        repeated = sorted({k for k in header if header.count(k) > 1})
        if repeated:
            problems.add(f"{path}:1", f"column(s) given twice: {', '.join(repeated)}")
        problems.raise_if_any()
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                problems.add(where, f"expected {len(header)} fields")
                continue
            yield where, {k: v.strip() for k, v in row.items() if v.strip() != ""}
    except csv.Error as exc:  # e.g. a field longer than the csv module takes (the row after the last read)
        raise TraceError(f"{path}:{reader.line_num + 1}: not a readable CSV row: {exc}") from None


def _check_keys(keys: Any, where: str, problems: _Problems) -> None:
    unknown = [k for k in keys if k not in _FIELDS]
    if unknown:
        problems.add(where, f"unknown field(s) {', '.join(map(str, unknown))}; known: {', '.join(_FIELDS)}")
    missing = [k for k in REQUIRED if k not in keys]
    if missing:
        problems.add(where, f"missing required field(s) {', '.join(missing)}")


def _element_lines(text: str, open_bracket: int) -> list[int]:
    """Line of each element of the JSON array whose ``[`` is at ``open_bracket``."""
    decoder = json.JSONDecoder()
    separators = re.compile(r"[\s,]*")
    lines, line, pos = [], 1 + text.count("\n", 0, open_bracket), open_bracket
    i = open_bracket + 1
    while True:
        i = separators.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return lines
        line += text.count("\n", pos, i)
        pos = i
        lines.append(line)
        _, i = decoder.raw_decode(text, i)


def _json_value(text: str) -> Any:
    """``json.loads``, with every way it can refuse a text as ``json.JSONDecodeError``-like
    ``ValueError``: nesting too deep for the decoder and integers too long to convert too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _json_document(path: Path, problems: _Problems) -> tuple[list, list[str], str | None, ClusterHint | None]:
    text = _read_text(path)
    try:
        doc = _json_value(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise TraceError(f"{path}: not valid JSON: {exc}") from None
    name = cluster = None
    if isinstance(doc, dict):
        extra = set(doc) - {"name", "cluster", "jobs"}
        if extra or not isinstance(doc.get("jobs"), list):
            raise TraceError(f"{path}:1: expected a list of jobs or an object with a 'jobs' list "
                             f"(and optional 'name', 'cluster'); got keys {sorted(doc)}")
        name = doc.get("name")
        if name is not None and not isinstance(name, str):
            raise TraceError(f"{path}: name: expected a string (got {type(name).__name__})")
        if "cluster" in doc:
            cluster = _cluster_hint(doc["cluster"], path)
        items, match = doc["jobs"], re.search(r'"jobs"\s*:\s*\[', text)
        start = match.end() - 1 if match else -1
    elif isinstance(doc, list):
        items, start = doc, text.index("[")
    else:
        raise TraceError(f"{path}:1: expected a list of jobs or an object with a 'jobs' list")
    lines = _element_lines(text, start) if start >= 0 else []
    wheres = [f"{path}:{n}" for n in lines] if len(lines) == len(items) else [
        f"{path}: jobs[{i}]" for i in range(len(items))]
    return items, wheres, name, cluster


def _cluster_hint(raw: Any, path: Path) -> ClusterHint:
    try:
        hint = _CLUSTER.validate_python(raw)
    except ValidationError as exc:
        raise TraceError(f"{path}: cluster: {_pydantic_problems(exc)}") from None
    if hint.nodes < 1 or hint.gpus_per_node < 1 or any(g < 1 for g, _ in hint.node_list):
        raise TraceError(f"{path}: cluster: nodes, gpus_per_node and each node's GPU count must be >= 1 "
                         f"(got nodes {hint.nodes}, gpus_per_node {hint.gpus_per_node}"
                         f"{', node_list ' + str(list(hint.node_list)) if hint.node_list else ''})")
    types = {hint.gpu_type} | {t for _, t in hint.node_list}
    unknown = sorted(types - GPU_TYPES.keys())
    if unknown:
        raise TraceError(f"{path}: cluster: unknown GPU type(s) {', '.join(unknown)}; known: {', '.join(GPU_TYPES)}")
    return hint


def _json_records(path: Path, problems: _Problems, lines: bool) -> tuple[list[tuple[str, Any]], str | None,
                                                                       ClusterHint | None]:
    if lines:
        records = []
        # JSON Lines ends a record at "\n" only: str.splitlines() would also cut at U+2028 and
        # the like, which JSON allows unescaped inside a string.
        for n, line in enumerate(_read_text(path).split("\n"), start=1):
            if line.strip():
                try:
                    records.append((f"{path}:{n}", _json_value(line)))
                except json.JSONDecodeError as exc:
                    problems.add(f"{path}:{n}", f"not valid JSON: {exc.msg}")
                except ValueError as exc:
                    problems.add(f"{path}:{n}", f"not valid JSON: {exc}")
        return records, None, None
    items, wheres, name, cluster = _json_document(path, problems)
    return list(zip(wheres, items, strict=True)), name, cluster


def _pydantic_problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


def load_user_file(path: Path) -> Trace:
    suffix = path.suffix.lower()
    if suffix not in USER_SUFFIXES:
        raise TraceError(f"{path}: unsupported trace file type {suffix!r}; use {', '.join(USER_SUFFIXES)}")
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    problems = _Problems(path)
    name = cluster = None
    if suffix == ".csv":
        records: list[tuple[str, Any]] = list(_csv_records(path, problems))
    else:
        records, name, cluster = _json_records(path, problems, lines=suffix == ".jsonl")
    jobs: list[TraceJob] = []
    seen: dict[str, str] = {}
    for n, (where, record) in enumerate(records):
        if not isinstance(record, dict):
            problems.add(where, f"expected an object with job fields, got {type(record).__name__}")
            continue
        if suffix != ".csv":
            before = len(problems.lines)
            _check_keys(record, where, problems)
            if len(problems.lines) > before:
                continue
        values = {"job_id": f"{path.stem}-{n}", "workload": "custom"}
        values.update({k: v for k, v in record.items() if v is not None})
        if isinstance(values["job_id"], int):  # numeric ids are common in JSON; TraceJob keeps strings
            values["job_id"] = str(values["job_id"])
        try:
            job = _JOB.validate_python(values)
        except ValidationError as exc:
            problems.add(where, _pydantic_problems(exc))
            continue
        for problem in job_problems(job):
            problems.add(where, problem)
        if job.job_id in seen:
            problems.add(where, f"job_id: {job.job_id!r} already used at {seen[job.job_id]}")
        seen.setdefault(job.job_id, where)
        jobs.append(job)
    if not records and not problems.lines:
        problems.add(str(path), "no jobs")
    problems.raise_if_any()
    jobs.sort(key=lambda j: j.submit_s)
    return Trace(name=name or str(path), jobs=jobs, cluster=cluster, source=str(path))
