"""Where hier_sched reads shared data and keeps its own state.

* shared data (read-only, never copied into the repository): ``$HIER_SCHED_SHARED``, else
  ``<repo root>/../shared``;
* state (the note ``hier-sched up`` leaves, job logs, learned estimates, emulated device files):
  ``$HIER_SCHED_STATE_DIR``, else ``~/.hier_sched``; private to its owner (``private_files``).

A job's own files on a node live in ``<state>/nodes/<node>/jobs/<job id>/``: a job id is a name
(``check_job_id``), never a path. The paths a spec names (``workdir``, ``checkpoint_dir``) are
the job's; a cluster started with ``hier-sched up --allowed-root DIR`` accepts only those that
resolve inside one of its roots (``outside_roots``; ``docs/security.md``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["shared_dir", "state_dir", "job_path", "check_job_id", "outside_roots"]

_REPO_ROOT = Path(__file__).resolve().parents[2]  # hier_sched/common/paths.py -> the repository


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


_JOB_ID = re.compile(r"[\w-]{1,100}")  # what global_queue's ids are made of: no '.', no '/'


def check_job_id(job_id: str) -> str:
    """``job_id`` if it can only name one directory: letters, digits, '-' and '_'. A job's files
    are found by its id, so an id like ``../other`` must never reach a path."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {str(job_id)[:80]!r} (letters, digits, '-' and '_' only)")
    return job_id


def outside_roots(workdir: str | None, checkpoint_dir: str | None, roots: Sequence[str]) -> list[str]:
    """Problems, one per field, of a spec's paths under ``roots`` (none when ``roots`` is empty:
    no confinement configured). Each path is judged as the job will use it -- ``checkpoint_dir``
    relative to ``workdir`` -- after resolving ``..`` and the symbolic links that exist on this
    machine, so neither can lead out of a root. A path with no absolute anchor cannot be judged
    (it would be relative to wherever Ray starts the job) and is refused too."""
    if not roots:
        return []
    real_roots = [os.path.realpath(os.path.expanduser(r)) for r in roots]
    problems = []
    for field, value in (("workdir", workdir), ("checkpoint_dir", checkpoint_dir)):
        if value is None:
            continue
        path = job_path(value, workdir) if field == "checkpoint_dir" else Path(value).expanduser()
        if not path.is_absolute():
            problems.append(f"{field}: {value!r} must be absolute (or relative to an absolute workdir): this "
                            f"cluster confines job paths to {', '.join(real_roots)}")
            continue
        real = os.path.realpath(path)
        if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in real_roots):
            shown = f"{value!r}" + (f" (resolves to {real})" if real != value else "")
            problems.append(f"{field}: {shown} is outside the allowed roots ({', '.join(real_roots)}; "
                            "`hier-sched up --allowed-root`)")
    return problems
