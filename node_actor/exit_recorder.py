"""Runs a job's command and records how it ended, even when the process that started it is gone.

    python -m node_actor.exit_recorder --pid-file P --exit-file E [--cwd DIR] [--detach] -- ARGV...

The job's Ray task starts this in a new session (its own process group). It starts ARGV, writes
the job's PID, waits, and writes ``{"exit_code", "start_error"}`` to the exit file atomically. A
restarted node actor re-adopts a run from these two files alone: the job's Ray task (and with
it the process that waited on the job) does not outlive the node actor that owned it, but the
job's process group does. The recorder shrugs off the signals meant for the job (the group gets
them all); only SIGKILL ends it early, and then the missing exit file says the job was killed.

``--detach``: the recorder forks and its first process exits at once, so the recorder is no child
of the process that started it. When a Ray worker dies (its owner, the node actor, was killed)
Ray SIGKILLs the worker's children (``RAY_kill_child_processes_on_worker_exit``, on by
default): a recorder that were one would die with it and leave a job that then ends unrecorded.
The process group (and the session) keeps the first process's id, so the starter waits on that.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from hier_sched.checkpointing import atomic_write  # its temporary file, renamed into place, is 0600
from hier_sched.private_files import write_private

_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
_COMMAND_NOT_FOUND, _NOT_EXECUTABLE = 127, 126  # the shell's codes, which classify_failure names


def _write(path: str, exit_code: int, start_error: str = "") -> None:
    data = json.dumps({"exit_code": exit_code, "start_error": start_error}).encode()
    atomic_write(path, lambda fh: fh.write(data))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m node_actor.exit_recorder")
    p.add_argument("--pid-file", required=True)
    p.add_argument("--exit-file", required=True)
    p.add_argument("--cwd")
    p.add_argument("--detach", action="store_true", help="fork; the first process exits at once (module docstring)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("a command after -- is required")
    if args.detach and os.fork() > 0:
        os._exit(0)
    for sig in _IGNORED:  # caught, not ignored: a caught signal is reset to default in the child on exec
        signal.signal(sig, lambda *_: None)
    try:
        proc = subprocess.Popen(command, cwd=args.cwd or None)
    except OSError as exc:  # FileNotFoundError, PermissionError, a bad working directory
        bad_dir = args.cwd and not os.path.isdir(args.cwd)
        what = f"working directory {args.cwd!r}" if bad_dir else f"command {command[0]!r}"
        reason = f"cannot start {what}: {exc.strerror or exc}"
        print(f"hier_sched: {reason}", file=sys.stderr, flush=True)
        code = _COMMAND_NOT_FOUND if isinstance(exc, FileNotFoundError) and not bad_dir else _NOT_EXECUTABLE
        _write(args.exit_file, code, reason)
        return code
    write_private(args.pid_file, str(proc.pid))
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    _write(args.exit_file, code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
