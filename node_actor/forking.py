"""Starting our own Python stages by ``fork`` instead of a fresh interpreter.

A job on a node is an OS process tree whose first stages are our own modules (the emulated
training process, the runner of a ``hier_sched.submit(fn)`` payload). Started as
``python -m <module>`` each costs an interpreter start and its imports -- ~0.1 s of CPU, per
job, on the machine that runs the jobs. Forked from a process that imported them already
(``node_actor.fork_server``, or a stage forking the next) it costs a few milliseconds, and the
child is the same: its own PID, process group membership, environment, working directory and
exit code. Anything else (a user's command, another interpreter) is exec'd as before.

``IN_PROCESS`` lists the modules that may run this way; each has ``main(argv) -> int``.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Sequence

__all__ = ["IN_PROCESS", "runs_in_process", "run_module_and_exit", "reset_child_state", "ForkedProcess",
           "start_process"]

IN_PROCESS = frozenset({"node_actor.emulated_job", "node_actor.run_callable"})
_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)


def runs_in_process(argv: Sequence[str]) -> bool:
    """``argv`` is ``<this interpreter> -m <one of ours> ...``: it can be forked, not exec'd."""
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in IN_PROCESS


def reset_child_state() -> None:
    """What a forked child must not inherit from its parent: caught signals (a parent that
    shrugs off SIGTERM must not make its job do so) and a seeded numpy generator (every job
    would draw the same numbers; ``random`` reseeds itself at fork)."""
    for sig in _DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_module_and_exit(argv: Sequence[str]) -> None:
    """Run ``python -m MODULE ARGS`` in this (forked) process and exit with its code, as the
    interpreter would: an uncaught exception prints its traceback and exits 1."""
    code = 1
    try:
        # what ``python -m`` would put first: the working directory, then PYTHONPATH
        first = [os.getcwd(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        sys.path[:] = list(dict.fromkeys([*first, *sys.path]))
        module = importlib.import_module(argv[2])
        sys.argv = [module.__file__ or argv[2], *argv[3:]]
        code = module.main(list(argv[3:]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the job's own failure, reported through its log
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not change the exit code
                pass
        os._exit(code if isinstance(code, int) else 1)


class ForkedProcess:
    """The part of ``subprocess.Popen`` a parent stage uses, for a child started by ``fork``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            # a process file descriptor turns readable when the child exits: woken then, not polled
            pidfd = os.pidfd_open(self.pid)
            try:
                select.select([pidfd], [], [], timeout)
            finally:
                os.close(pidfd)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a PID that was reaped: it may be someone else's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_process(argv: Sequence[str]) -> subprocess.Popen | ForkedProcess:
    """Start a child stage with this process's environment, directory and output: forked when
    it is one of ours (``runs_in_process``), else exec'd (``OSError`` when it cannot start)."""
    if not runs_in_process(argv):
        return subprocess.Popen(list(argv))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would write the parent's buffered lines a second time
    pid = os.fork()
    if pid == 0:
        reset_child_state()
        run_module_and_exit(argv)
    return ForkedProcess(pid)
