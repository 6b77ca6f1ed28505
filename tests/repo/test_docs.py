"""The docs say what the code does: every job-spec field is documented with its default, every
error shown is the one the validation gives, and every link between the docs resolves."""

from __future__ import annotations

import re

import pytest
import yaml
from conftest import ROOT
from pydantic import BaseModel

from hier_sched.core.spec import JobSpec, SpecError, parse_spec

SPEC_DOC = (ROOT / "docs" / "job-spec.md").read_text()
BASE = {"name": "x", "command": ["python", "train.py"]}


def _fields(model: type[BaseModel], prefix: str = ""):
    """(dotted name, field info) of the model and of its nested spec models."""
    for name, info in model.model_fields.items():
        yield prefix + name, info
        nested = info.annotation
        for candidate in getattr(nested, "__args__", (nested,)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                yield from _fields(candidate, f"{prefix}{name}.")


def _rows(text: str) -> dict[str, list[str]]:
    """The doc's field tables: first cell `name` -> the row's cells."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"`([\w.]+)`", cells[0])):
            rows.setdefault(m.group(1), cells)
    return rows


def _shown(default) -> str | None:
    """How the doc writes a scalar default (None: a structured one, described in words)."""
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, (int, float)):
        return f"`{default:g}`"
    if isinstance(default, str):
        return f"`{default}`"
    return None


@pytest.mark.parametrize("field, info", list(_fields(JobSpec)), ids=lambda v: v if isinstance(v, str) else "")
def test_every_spec_field_is_documented_with_its_default(field, info):
    rows = _rows(SPEC_DOC)
    assert field in rows, f"docs/job-spec.md has no row for `{field}`"
    default_cell = rows[field][2]
    if info.is_required():
        assert default_cell == "required", (field, default_cell)
    elif info.default is None:
        assert default_cell == "none" or "`" in default_cell or "directory" in default_cell, (field, default_cell)
    elif (shown := _shown(info.default)) is not None:
        assert default_cell.startswith(shown), (field, default_cell, shown)


def _error_rows():
    section = SPEC_DOC.split("## Errors, exactly as the scheduler says them", 1)[1]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`") and cells[2].startswith("`"):
            yield cells[1].strip("`"), cells[2].strip("`")


@pytest.mark.parametrize("wrote, says", list(_error_rows()))
def test_every_documented_error_is_the_one_the_scheduler_gives(wrote, says):
    data = {**BASE, **yaml.safe_load(wrote)}
    if data.get("command") is None:
        data.pop("command")
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert says in str(err.value)


def test_the_error_table_covers_many_fields():
    assert len(list(_error_rows())) >= 25


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"], ids=lambda p: p.name)
def test_links_between_docs_resolve(doc):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"
