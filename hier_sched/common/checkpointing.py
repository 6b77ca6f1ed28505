"""The job's side of the checkpoint-signal protocol (fixed time slots).

A job that runs in a time slot hears, ``grace_s`` before the slot ends, the checkpoint signal
(SIGUSR1). It then saves its state and exits with ``REQUEUE_EXIT_CODE``; the scheduler requeues it
and later restarts it with ``HIER_SCHED_RESUME=1`` and ``HIER_SCHED_CHECKPOINT_DIR`` set. At the
slot's end a job still running gets SIGTERM, and SIGKILL after a further grace::

    import hier_sched as hs

    hs.install_checkpoint_handler()          # first thing: SIGUSR1 would otherwise kill the job
    start = load(hs.checkpoint_dir()) if hs.resuming() else 0
    for step in range(start, steps):
        train_one_step()
        if hs.checkpoint_requested():
            save(hs.checkpoint_dir(), step)  # e.g. with hs.atomic_write
            hs.exit_for_requeue()

Until a handler is installed, SIGUSR1 keeps its default action: the process dies at once ("killed
by SIGUSR1", not a requeue) and restarts from its last checkpoint, if any. So install it before
anything slow (data loading, model building); ``checkpoint_requested()`` and
``TrainingCheckpoint`` install it too, as a safety net, on first use.

Standard library only: ``import hier_sched`` must stay light (no torch, no Ray).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# Shared with the scheduler side, which classifies this exit code as a checkpoint-and-requeue.
from hier_sched.core.failures import REQUEUE_EXIT_CODE

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_SIGNAL",
    "REQUEUE_EXIT_CODE",
    "RESUME_ENV",
    "CheckpointDirError",
    "atomic_save",
    "atomic_write",
    "checkpoint_dir",
    "checkpoint_requested",
    "exit_for_requeue",
    "fsync_file",
    "install_checkpoint_handler",
    "resuming",
]

# The environment the scheduler gives a (re)started job; node actors import these names.
RESUME_ENV = "HIER_SCHED_RESUME"  # "1" when this run continues a preempted one
CHECKPOINT_DIR_ENV = "HIER_SCHED_CHECKPOINT_DIR"  # the job spec's checkpoint_dir, resolved
CHECKPOINT_SIGNAL = signal.SIGUSR1

_requested = threading.Event()  # readable from any thread (e.g. a data-loading thread)
_installed = False
_install_lock = threading.Lock()


class CheckpointDirError(RuntimeError):
    """The checkpoint directory is not given or cannot be written."""


def install_checkpoint_handler() -> None:
    """Catch the checkpoint signal from now on (idempotent). Must run in the main thread, as
    every Python signal handler must. A handler the job had installed before keeps being called
    (e.g. a framework's own SIGUSR1 hook)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "hier_sched.install_checkpoint_handler() must be called from the main thread "
                "(Python runs signal handlers there only); call it at the start of the job"
            )
        previous = signal.getsignal(CHECKPOINT_SIGNAL)

        def on_checkpoint_signal(signum: int, frame: object) -> None:
            _requested.set()
            if callable(previous):
                previous(signum, frame)

        signal.signal(CHECKPOINT_SIGNAL, on_checkpoint_signal)
        _installed = True


def checkpoint_requested() -> bool:
    """True once the checkpoint signal arrived: save now and call ``exit_for_requeue()``.
    Cheap enough to call every step; installs the handler on its first call."""
    if not _installed:
        install_checkpoint_handler()
    return _requested.is_set()


def resuming() -> bool:
    """True when the scheduler restarted this job after a preemption (``HIER_SCHED_RESUME=1``):
    load the latest checkpoint, if there is one."""
    return os.environ.get(RESUME_ENV) == "1"


def checkpoint_dir() -> Path:
    """The job's checkpoint directory (``HIER_SCHED_CHECKPOINT_DIR``), created if missing.

    Raises ``CheckpointDirError`` naming the variable when it is unset, and the directory when it
    cannot be created or written -- better at start-up than at the first save, minutes before
    the slot ends."""
    value = os.environ.get(CHECKPOINT_DIR_ENV, "").strip()
    if not value:
        raise CheckpointDirError(
            f"{CHECKPOINT_DIR_ENV} is not set: give the job spec a checkpoint_dir "
            f"(or set {CHECKPOINT_DIR_ENV} when running the job by hand)"
        )
    path = Path(value).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)  # created private; an existing one is the user's
        # a real write, not os.access: access() says yes to root on a read-only file system
        with tempfile.TemporaryFile(dir=path, prefix=".write-test"):
            pass
    except OSError as exc:
        raise CheckpointDirError(
            f"{CHECKPOINT_DIR_ENV}={value}: the checkpoint directory cannot be written "
            f"({exc.strerror or exc})"
        ) from None
    return path


def exit_for_requeue() -> None:
    """End the job with ``REQUEUE_EXIT_CODE``: "my checkpoint is saved, requeue me". Raises
    ``SystemExit``, so ``finally`` blocks and ``atexit`` hooks still run."""
    print(f"hier_sched: checkpoint saved; exiting with code {REQUEUE_EXIT_CODE} to be requeued",
          file=sys.stderr, flush=True)
    sys.exit(REQUEUE_EXIT_CODE)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> Path:
    """Write a file so that it is either the old or the complete new version, whatever happens.

    ``write`` fills a temporary file (created 0600: private) in the same directory; it is flushed
    to disk, renamed over ``path`` (atomic on POSIX) and the directory entry is synced too. A crash or SIGKILL midway
    leaves the previous file untouched (and a stray temporary, removed by the next write).
    A SIGTERM arriving during the write (the slot ended while the job was saving) is held back
    until the file is in place, then takes effect as usual."""

    def fill(temporary: Path) -> None:
        with open(temporary, "wb") as fh:
            write(fh)

    return atomic_save(path, fill)


def atomic_save(path: str | os.PathLike[str], save: Callable[[Path], None]) -> Path:
    """``atomic_write`` for a library's own save function that takes a path (e.g. Lightning's
    ``trainer.save_checkpoint``): ``save`` writes the file at the temporary path it is given."""
    target = Path(path)
    directory = target.parent
    _remove_stale_temporaries(target)
    with _termination_held():
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            save(Path(tmp))
            fsync_file(tmp)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_file(directory)  # the rename is durable only once the directory itself is on disk
    return target


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Force a file's (or a directory's entries') written data to disk: a rename is only as
    durable as what it renames."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temporaries(target: Path) -> None:
    """Temporaries of a write that was killed (only this file's, by their name pattern)."""
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        stale.unlink(missing_ok=True)


@contextmanager
def _termination_held() -> Iterator[None]:
    """Defer SIGTERM for the duration of the block, then re-deliver it to the previous handler.
    Outside the main thread handlers cannot be changed, and a handler installed from C cannot be
    put back; the write is still atomic in both cases."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            signal.raise_signal(signal.SIGTERM)
