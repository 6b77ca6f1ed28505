"""Where hier_sched reads shared data and keeps its own state.

* shared data (read-only, never copied into the repository): ``$HIER_SCHED_SHARED``, else
  ``<repo root>/../shared``;
* state (the note ``hier-sched up`` leaves, job logs, learned estimates, emulated device files):
  ``$HIER_SCHED_STATE_DIR``, else ``~/.hier_sched``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["shared_dir", "state_dir", "job_path"]

_REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    env = os.environ.get("HIER_SCHED_SHARED")
    return Path(env) if env else _REPO_ROOT.parent / "shared"


def state_dir() -> Path:
    env = os.environ.get("HIER_SCHED_STATE_DIR")
    return Path(env) if env else Path.home() / ".hier_sched"


def job_path(path: str, workdir: str | None) -> Path:
    """A path from a job spec: relative to the job's working directory when it has one."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or not workdir else Path(workdir) / p
