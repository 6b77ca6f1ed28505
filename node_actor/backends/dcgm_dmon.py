"""A streaming parser for the text ``dcgmi dmon`` prints (DCGM has no Python bindings on PyPI,
and RAD-RM read DCGM exactly this way).

What the tool prints (recorded sample: ``shared/data/telemetry/pmdlt/1024.128.dcgmi.txt``)::

    #Entity   GPUTL   MCUTL   GRACT   SMACT   SMOCC   TENSO   DRAMA
    ID
    GPU 0     91      0       0.488   0.081   0.027   0.002   0.000
    GPU 1     N/A     N/A     N/A     N/A     N/A     N/A     N/A

``#Entity`` starts a header naming each column by its short name; the following ``ID`` line
carries units (``W``, ``mJ``) or nothing. Then one row per entity and tick: the entity type
(``GPU``, or ``GPU-I``/``GPU-CI`` for MIG instances), its id, one value per column; ``N/A`` where
DCGM has no value. A header may be printed again mid-stream.

The parser never raises on its input: a line it cannot use is skipped and counted by reason in
``skipped`` (the first occurrence of each reason is logged as a warning), so a garbled line from
a dying tool cannot take the node actor down.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DCGM_FIELD_IDS",
    "THESIS_FIELD_IDS",
    "DmonRow",
    "DmonParser",
    "parse_dcgmi_discovery",
]

log = logging.getLogger(__name__)

# Column short name as dcgmi prints it -> DCGM field id (``dcgmi dmon --list``).
DCGM_FIELD_IDS: dict[str, int] = {
    "POWER": 155,  # W
    "TOTEC": 156,  # total energy since boot, mJ
    "GPUTL": 203,  # %, time any kernel ran
    "MCUTL": 204,  # %, memory-copy engine
    "FBTTL": 250,  # MiB
    "FBFRE": 251,  # MiB
    "FBUSD": 252,  # MiB
    "GRACT": 1001,  # ratios 0..1 from here to 1008
    "SMACT": 1002,
    "SMOCC": 1003,
    "TENSO": 1004,
    "DRAMA": 1005,
    "FP64A": 1006,
    "FP32A": 1007,
    "FP16A": 1008,
    "PCITX": 1009,  # bytes/s
    "PCIRX": 1010,
    "NVLTX": 1011,
    "NVLRX": 1012,
}

# The exact ``-e`` list RAD-RM monitored with (FIELD_NOTES §1), in its order.
THESIS_FIELD_IDS: tuple[int, ...] = (
    203, 1001, 1002, 1003, 1006, 1007, 1008, 1004, 204, 1005, 1009, 1010, 1011, 1012, 155, 156,
)

_NOT_AVAILABLE = "N/A"
_ENTITY = re.compile(r"^[A-Za-z][A-Za-z-]*$")
_ENTITY_ID = re.compile(r"^[0-9]{1,9}$")  # DCGM ids are small; str.isdigit() would pass "²" and 5,000 digits
_GARBLED = object()  # marks a value token that is not a number at all


@dataclass(frozen=True, slots=True)
class DmonRow:
    """One entity's values at one tick; ``None`` where dcgmi printed N/A or an invalid value."""

    entity: str  # "GPU", "GPU-I", "GPU-CI", ...
    entity_id: int
    values: Mapping[int, float | None]  # DCGM field id -> value


class DmonParser:
    """Feed it ``dcgmi dmon`` output line by line; it keeps the newest row of every entity.

    ``field_ids``: the column order when no header has been seen yet — the caller that started
    ``dcgmi dmon -e <ids>`` knows it. A header line, when it comes, always wins.
    """

    def __init__(self, field_ids: Sequence[int] | None = None) -> None:
        self._columns: tuple[int | None, ...] | None = tuple(field_ids) if field_ids else None
        self._latest: dict[tuple[str, int], DmonRow] = {}
        self.rows_parsed = 0
        self.skipped: Counter[str] = Counter()

    def feed(self, line: str) -> DmonRow | None:
        """Parse one line; returns the row it carried, or ``None`` (header, blank, skipped)."""
        tokens = line.split()
        if not tokens:
            return None
        head = tokens[0].upper()
        if head == "#ENTITY":
            self._read_header(tokens[1:])
            return None
        if head == "ID":
            return None  # the units line under a header
        row = self._read_row(tokens)
        if row is not None:
            self._latest[(row.entity, row.entity_id)] = row
            self.rows_parsed += 1
        return row

    def feed_lines(self, lines: Iterable[str]) -> list[DmonRow]:
        return [row for row in map(self.feed, lines) if row is not None]

    def latest(self, entity: str = "GPU") -> dict[int, dict[int, float]]:
        """Newest values per entity id of one type, N/A fields left out."""
        return {
            entity_id: {field: value for field, value in row.values.items() if value is not None}
            for (kind, entity_id), row in self._latest.items()
            if kind == entity
        }

    def _read_header(self, names: list[str]) -> None:
        columns = []
        for name in names:
            field = DCGM_FIELD_IDS.get(name.upper())
            if field is None:
                self._skip(f"unknown column {name!r} (its values are ignored)", " ".join(names))
            columns.append(field)
        self._columns = tuple(columns)

    def _read_row(self, tokens: list[str]) -> DmonRow | None:
        line = " ".join(tokens)
        if len(tokens) < 2 or not _ENTITY.match(tokens[0]) or not _ENTITY_ID.match(tokens[1]):
            return self._skip("not a header or an entity row", line)
        if self._columns is None:
            return self._skip("entity row before any header", line)
        raw_values = tokens[2:]
        if len(raw_values) != len(self._columns):
            return self._skip(
                f"{len(raw_values)} values for {len(self._columns)} columns (truncated or garbled)",
                line,
            )
        values: dict[int, float | None] = {}
        for field, raw in zip(self._columns, raw_values):
            value = self._read_value(raw, line)
            if value is _GARBLED:
                return self._skip("non-numeric value", line)
            if field is not None:
                values[field] = value
        return DmonRow(tokens[0].upper(), int(tokens[1]), values)

    def _read_value(self, raw: str, line: str) -> float | None | object:
        if raw.upper() == _NOT_AVAILABLE:
            return None
        if not raw.isascii() or "_" in raw:  # float() would read "1_000" and other scripts' digits ("١٫٥")
            return _GARBLED
        try:
            value = float(raw)
        except ValueError:
            return _GARBLED
        if not math.isfinite(value) or value < 0:
            # Every monitored field is a non-negative ratio, rate or counter: keep the rest of
            # the row, drop this value.
            self._skip("negative or non-finite value dropped", line)
            return None
        return value

    def _skip(self, reason: str, line: str) -> None:
        if reason not in self.skipped:
            log.warning("dcgmi dmon output: %s: %r", reason, line[:200])
        self.skipped[reason] += 1
        return None


def parse_dcgmi_discovery(text: str) -> dict[int, str]:
    """DCGM GPU id -> UUID from ``dcgmi discovery -l``.

    DCGM numbers GPUs its own way, which need not be NVML's order; the UUID is the join key.
    The table looks like ``| 0 | Name: NVIDIA A100-SXM4-40GB |`` followed by
    ``|   | Device UUID: GPU-... |``.
    """
    uuids: dict[int, str] = {}
    current: int | None = None
    for line in text.splitlines():
        id_cell = re.match(r"^\|\s*([0-9]{1,9})\s*\|", line)
        if id_cell:
            current = int(id_cell.group(1))
        uuid = re.search(r"Device UUID:\s*(\S+)", line)
        if uuid and current is not None:
            uuids[current] = uuid.group(1)
    return uuids
