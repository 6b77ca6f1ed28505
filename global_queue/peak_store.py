"""The live cluster's memory of measured peaks: the file behind the core's ``PeakLearner``.

A JSON object ``{signature: MiB}`` in the state directory, loaded once and rewritten atomically on
every new observation (a few per finished job at most), so a crash never loses the earlier ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from hier_sched.common.checkpointing import atomic_write
from hier_sched.common.private_files import private_dir

__all__ = ["JsonPeakStore"]


class JsonPeakStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"learned peaks file {self.path} is unreadable ({exc}); move it away to start afresh") from None
        self._peaks = {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def get(self, signature: str, default: float | None = None) -> float | None:
        return self._peaks.get(signature, default)

    def __setitem__(self, signature: str, mib: float) -> None:
        self._peaks[signature] = float(mib)
        text = json.dumps(self._peaks, indent=1, sort_keys=True).encode()
        private_dir(self.path.parent)
        atomic_write(self.path, lambda fh: fh.write(text))
