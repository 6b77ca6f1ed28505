"""Where the shared (read-only) data lives, and the GPUMemNet training data with its fixed split.

The split is a hash of each row's ``Filename`` (the generated model's name), so it does not depend
on row order or on which other rows exist: the same model is always in the same part.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from estimators.features import ModelDescription
from estimators.gpumemnet_rows import description_from_row
from estimators.types import EstimatorError
from hier_sched.common.paths import shared_dir  # re-exported: the estimators CLI reads the GPUMemNet data there

__all__ = ["read_jsonl", "shared_dir", "gpumemnet_dir", "LabelledRow", "load_kind", "split_of", "family_of", "KIND_FILES", "LABEL", "SMACT"]

LABEL = "Max GPU Memory (MiB)"
SMACT = "Avg SMACT"
KIND_FILES = {"mlp": ("mlp_step1.csv", "mlp_step2.csv"), "cnn": ("cnn_partial.csv",)}
SPLITS = ("train", "calib", "test")


def read_jsonl(path: Path, what: str) -> list[dict]:
    """The rows of one of our resumable result files (one JSON object a line; an empty list when
    it does not exist yet); a damaged line is an error naming the file, the line and ``what`` a
    row should be."""
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise EstimatorError(f"{path}:{number}: not a {what} ({exc})") from None
    return rows


def gpumemnet_dir() -> Path:
    return shared_dir() / "data" / "gpumemnet"


def family_of(filename: str) -> str:
    """The generator's architecture family named in a row's file name (``..._arch:pyramid_batch:717.out``)."""
    found = re.search(r"arch:([a-z]+)", filename)
    return found.group(1) if found else ""


def split_of(filename: str) -> str:
    """70 % train, 10 % calibration (conformal bounds), 20 % held-out test."""
    bucket = int(hashlib.sha1(filename.encode()).hexdigest()[:8], 16) % 10
    return "test" if bucket < 2 else "calib" if bucket == 2 else "train"


@dataclass(frozen=True, slots=True)
class LabelledRow:
    source: str  # "mlp_step1.csv:17"
    description: ModelDescription
    peak_mib: float
    fits: bool  # False for CNN rows that crashed with OOM on the 40 GB A100
    smact: float | None  # None where DCGM logged nothing (-1 in the CSV)
    split: str
    family: str = ""  # the generator's architecture family ("pyramid", "residual", ...), from ``Filename``


@lru_cache(maxsize=8)
def load_kind(kind: str, data_dir: Path | None = None) -> tuple[tuple[LabelledRow, ...], tuple[str, ...]]:
    """All usable labelled rows of one model kind ("mlp" or "cnn"), and the sources of skipped ones.

    Cached (the rows are immutable). Skipped: 70 CNN rows whose generator failed to build a model (empty layer list, ``Depth`` 0;
    45 of them also have a 0 MiB label) — there is nothing to learn from them."""
    if kind not in KIND_FILES:
        raise EstimatorError(f"no training data for kind {kind!r}; have {', '.join(KIND_FILES)}")
    base = Path(data_dir) if data_dir else gpumemnet_dir()
    rows: list[LabelledRow] = []
    skipped: list[str] = []
    for name in KIND_FILES[kind]:
        path = base / name
        if not path.is_file():
            raise EstimatorError(f"training data not found: {path} (set HIER_SCHED_SHARED or --data)")
        with path.open(newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                where = f"{name}:{i}"
                if row["Activations-Params"].strip() == "[]" or float(row[LABEL]) <= 0:
                    skipped.append(where)
                    continue
                peak = float(row[LABEL])
                status = row.get("Status", "SUCCESSFUL")
                smact = float(row[SMACT]) if row.get(SMACT) not in (None, "") else -1.0
                rows.append(LabelledRow(
                    where, description_from_row(row, where), peak, status != "OOM_CRASH",
                    smact if smact >= 0 else None, split_of(row["Filename"]), family_of(row["Filename"]),
                ))
    return tuple(rows), tuple(skipped)
