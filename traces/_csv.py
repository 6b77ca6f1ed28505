"""Reading CSV tables with ``file:line`` in every error.

Line numbers are those a person sees in an editor: the header is line 1, the first row line 2.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from traces.schema import TraceError

__all__ = ["Row", "read_rows"]


class Row:
    """One CSV row with typed accessors that name ``file:line`` and the column on bad input."""

    __slots__ = ("values", "where")

    def __init__(self, values: dict[str, str], where: str):
        self.values = values
        self.where = where

    def error(self, problem: str) -> TraceError:
        return TraceError(f"{self.where}: {problem}")

    def text(self, column: str) -> str:
        return self.values[column].strip()

    def number(self, column: str) -> float:
        raw = self.text(column)
        try:
            return float(raw)
        except ValueError:
            raise self.error(f"{column}: not a number ({raw!r})") from None

    def optional_number(self, column: str) -> float | None:
        return self.number(column) if self.text(column) else None

    def integer(self, column: str) -> int:
        value = self.number(column)
        if not value.is_integer():
            raise self.error(f"{column}: not a whole number ({self.text(column)!r})")
        return int(value)


def read_rows(path: Path, required: Sequence[str]) -> Iterator[Row]:
    """The rows of a CSV file with a header; the header must hold every ``required`` column."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise TraceError(f"{path}:{reader.line_num}: expected {len(reader.fieldnames)} fields")
            yield Row(row, f"{path}:{reader.line_num}")
