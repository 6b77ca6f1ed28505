"""The job's side of progress: "I am this far", for ``hier-sched top``.

A job that knows how far it is can say so, as often as it likes (every step is fine)::

    import hier_sched as hs

    for step in range(start, steps):
        train_one_step()
        hs.report_progress(step + 1, steps)

The node reads the last report of each running job and ``top`` draws it as a bar; a job that
reports nothing shows how long it has been running instead. Reports are written to the run's own
file, named in the job's environment, at most once a second (and at once when it reaches 100 %),
so a report costs nothing a training step would notice. Outside a job the scheduler started, it
does nothing. Standard library only (``import hier_sched`` stays light).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hier_sched.common.private_files import replace_private

__all__ = ["PROGRESS_FILE_ENV", "report_progress", "read_progress"]

# Where the node actor reads it: a run's own file, named in the job's environment.
PROGRESS_FILE_ENV = "HIER_SCHED_PROGRESS_FILE"
_EVERY_S = 1.0  # the most often a report is written (monotonic seconds)

_last: tuple[float, float] | None = None  # (when, fraction) of the last report written


def report_progress(done: float, total: float | None = None) -> bool:
    """Report how far this job is: ``done`` of ``total`` (steps, epochs, samples...), or ``done``
    alone as a fraction of 1. Returns whether the report was written (False outside a scheduled
    job, or when the last one was written less than a second ago)."""
    global _last
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return False
    fraction = min(max(float(done / total if total else done), 0.0), 1.0)
    now = time.monotonic()
    if _last is not None and (fraction == _last[1] or (fraction < 1.0 and now - _last[0] < _EVERY_S)):
        return False
    replace_private(path, f"{fraction:.4f}\n")
    _last = (now, fraction)
    return True


def read_progress(path: str | os.PathLike[str]) -> float | None:
    """The fraction a run last reported (``report_progress``), or None when it reported none."""
    try:
        return min(max(float(Path(path).read_text()), 0.0), 1.0)
    except (OSError, ValueError):  # not reported (yet)
        return None
