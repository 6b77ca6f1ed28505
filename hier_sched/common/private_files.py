"""Files and directories only their owner may read: the scheduler's state, logs and job files.

Everything hier_sched keeps (write-ahead log, learned peaks, each job's log, payload, result and
run records, the MPS daemon's pipe and log directories) is created through these helpers, so it
is private (directories 0700, files 0600) whatever the umask of the process that writes it --
a Ray worker's umask is the ``ray start`` shell's, typically 022, which would make files
readable by every user of the machine. ``docs/security.md`` has the whole trust model.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "NotOwnedError", "private_dir", "write_private", "replace_private",
           "open_private"]

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class NotOwnedError(PermissionError):
    """A directory hier_sched would keep private belongs to another OS user."""


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory only this user can enter: created 0700 when missing (its missing
    parents too), tightened to 0700 when it exists. One that belongs to another user is refused,
    never shared: state (and an MPS daemon's pipes) of two users must not meet."""
    directory = Path(path)
    missing: list[Path] = []  # from the deepest up to the first ancestor that exists (usually none)
    candidate = directory
    while not candidate.exists():
        missing.append(candidate)
        candidate = candidate.parent
    for missing_dir in reversed(missing):
        try:
            missing_dir.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:  # made meanwhile by another process of ours
            pass
    owner = directory.stat().st_uid
    if owner != os.geteuid():
        raise NotOwnedError(f"{directory} belongs to another user (uid {owner}, this process runs as uid "
                            f"{os.geteuid()}): hier_sched never shares its state between OS users; give each "
                            "user their own state directory (HIER_SCHED_STATE_DIR or `hier-sched up --state-dir`)")
    os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is cut by the umask; an existing one may be looser
    return directory


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor on ``path``, the file created 0600 (and made 0600 if it existed looser)."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path``'s content with ``data``, the file private (0600)."""
    raw = data.encode() if isinstance(data, str) else data
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(raw)


def replace_private(path: str | os.PathLike[str], data: bytes | str) -> None:
    """``write_private`` through a temporary file beside ``path`` renamed over it: a reader sees
    the old content or the new, never half of it (not synced: for files a crash may lose)."""
    raw = data.encode() if isinstance(data, str) else data
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")  # created 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
