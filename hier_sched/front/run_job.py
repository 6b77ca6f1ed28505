"""``hier-sched run SPEC``: submit, stream the job's output as it arrives, exit with its code.

The blocking entrypoint for wrappers such as ``ray job submit -- hier-sched run spec.yaml``:
the job's output goes to stdout, what the scheduler says to stderr, and the exit code is

=====  ==================================================================================
0      the job succeeded
N      the job failed with exit code N (128 + S when a signal S killed it)
1      the job failed without an exit code of its own (e.g. it could not be launched)
65     rejected at submit: an invalid spec, or no GPU of the cluster can ever hold the job
69     the scheduler is unreachable: no Ray cluster, no scheduler on it, or it stopped answering
75     the job was cancelled (by ``hier-sched cancel``, or by SIGINT/SIGTERM to ``run``)
=====  ==================================================================================

65, 69 and 75 are the BSD ``sysexits.h`` codes for bad input data, an unavailable service and
a temporary failure (submit again), which training jobs seldom use themselves.
SIGINT or SIGTERM (``ray job stop`` sends SIGTERM) cancels the scheduled job before ``run``
exits: a job whose waiting client is gone must not run on.
"""

from __future__ import annotations

import signal
import sys
import time
from enum import IntEnum
from typing import Any, TextIO

from hier_sched.front.connection import Scheduler, SchedulerUnavailable

__all__ = ["RunExit", "run_job", "job_exit_code"]


class RunExit(IntEnum):
    SUCCEEDED = 0
    FAILED_WITHOUT_CODE = 1
    REJECTED = 65
    UNREACHABLE = 69
    CANCELLED = 75


class _Interrupted(Exception):
    pass


def job_exit_code(job: dict[str, Any]) -> int:
    """What ``run`` exits with for a job that ended (``job``: its status object)."""
    if job["state"] == "succeeded":
        return RunExit.SUCCEEDED
    if job["state"] == "cancelled":
        return RunExit.CANCELLED
    code = job.get("exit_code")
    if not code:
        return RunExit.FAILED_WITHOUT_CODE
    return code if code > 0 else 128 - code  # subprocess's -S for a signal: the shell's 128 + S


def run_job(scheduler: Scheduler, spec: dict[str, Any], *, poll_s: float = 0.5, out: TextIO | None = None,
            err: TextIO | None = None) -> int:
    """Submit ``spec`` and follow the job to its end; returns the exit code (``RunExit``)."""
    out, err = out or sys.stdout, err or sys.stderr
    interrupt = _Interrupt()
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            answer = scheduler.submit(spec)  # a signal now is noted: the job is cancelled once known
        except SchedulerUnavailable as exc:
            print(f"hier-sched run: {exc}", file=err)
            return RunExit.UNREACHABLE
        if "error" in answer:
            print(f"hier-sched run: rejected: {answer['error']}", file=err)
            return RunExit.REJECTED
        job_id = answer["job_id"]
        print(f"hier-sched run: job {job_id} submitted; its output follows", file=err, flush=True)
        try:
            interrupt.arm()
            job = _follow(scheduler, job_id, poll_s, out)
        except _Interrupted:
            return _cancel(scheduler, job_id, err)
        except SchedulerUnavailable as exc:
            print(f"hier-sched run: job {job_id}: {exc}", file=err)
            return RunExit.UNREACHABLE
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = job_exit_code(job)
    print(f"hier-sched run: job {job_id} {job['state']}: {job['reason']} (exit {code})", file=err)
    return code


class _Interrupt:
    """The SIGINT/SIGTERM handler: until ``arm`` (while submitting) it only notes the signal,
    since the job's id is not known yet; armed, it interrupts following the job -- at once
    if a signal came earlier."""

    def __init__(self) -> None:
        self.armed = False
        self.pending = False

    def __call__(self, *_: Any) -> None:
        self.pending = True
        if self.armed:
            raise _Interrupted

    def arm(self) -> None:
        self.armed = True
        if self.pending:
            raise _Interrupted


def _follow(scheduler: Scheduler, job_id: str, poll_s: float, out: TextIO) -> dict[str, Any]:
    """Print the job's log as it grows; return its status once it ended and all was printed."""
    offset = 0
    while True:
        chunk = scheduler.call("read_log", job_id, offset)
        if chunk["text"]:
            out.write(chunk["text"])
            out.flush()
        offset = chunk["offset"]
        if chunk["done"] and not chunk["text"]:  # `done` is read before the logs: nothing is left
            return scheduler.call("status", job_id)
        time.sleep(poll_s)


def _cancel(scheduler: Scheduler, job_id: str, err: TextIO) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the job running
    try:
        answer = scheduler.call("cancel", job_id, timeout=10)
    except SchedulerUnavailable as exc:
        print(f"hier-sched run: interrupted; cancelling job {job_id} failed: {exc}", file=err)
        return RunExit.UNREACHABLE
    print(f"hier-sched run: interrupted; job {job_id} {answer.get('state', answer)}", file=err)
    return RunExit.CANCELLED
