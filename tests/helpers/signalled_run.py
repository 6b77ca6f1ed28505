"""Run a job's command and send it the checkpoint signal mid-run, at a line it prints.

Its stdout is a one-page pipe read unbuffered: the job cannot print more than a page of lines
ahead of this reader, so the signal lands mid-run however slow the machine is."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

PIPE_BYTES = 4096  # the smallest pipe Linux makes


def run_until_signalled(command: list[str], env: dict[str, str], line_start: str, *,
                        cwd: Path | None = None, timeout_s: float = 240) -> tuple[int, str, str]:
    """Start ``command``, send it SIGUSR1 once a line of its stdout starts with ``line_start``
    (followed by a space), and return its exit code, stdout and stderr."""
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=write_fd, stderr=subprocess.PIPE, text=True)
    os.close(write_fd)
    with open(read_fd, "rb", buffering=0) as stdout:
        head = bytearray(b"\n")
        while not head.endswith(f"\n{line_start} ".encode()) and (byte := stdout.read(1)):
            head += byte
        proc.send_signal(signal.SIGUSR1)
        out = bytes(head[1:]) + stdout.readall()
    err = proc.stderr.read()
    proc.wait(timeout=timeout_s)
    return proc.returncode, out.decode(), err
