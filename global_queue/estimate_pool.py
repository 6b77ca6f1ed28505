"""The estimates the queue waits for: one per estimate key, however many jobs share it.

The queue never waits on an estimate. ``request`` hands a job's estimate request to a runner
(a Ray task in the job's ``runtime_env``: ``global_queue.estimate_task``; a thread in tests)
unless one for the same key is under way already (the job joins it) or was made recently (the
cache answers). Each tick ``poll`` collects what finished and what ran past its deadline (the
runner is told to cancel it), as ``(job, outcome)`` pairs; an outcome is
``estimators.job_estimate``'s plain dict. ``describe`` is the live reason ``status`` shows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from estimators.job_estimate import request_subject
from global_queue.estimates import request_what

__all__ = ["EstimateRunner", "EstimatePool", "ThreadEstimateRunner", "deadline_s", "CACHE_SIZE"]

CACHE_SIZE = 256  # estimate keys whose outcome is kept
# Beyond the build and the traces themselves, what a task may take to start: a worker with the
# job's runtime_env (a working_dir fetched, a pip install) and the tracing worker's warm-up.
START_SLACK_S = 120.0
PIP_SLACK_S = 600.0


def deadline_s(request: Mapping[str, Any]) -> float:
    """How long the queue waits for an estimate before cancelling it: the build and one trace per
    GPU type (two when the trace is retried with real tensors), plus the start-up slack."""
    env = request.get("runtime_env") or {}
    slack = PIP_SLACK_S if any(k in env for k in ("pip", "uv", "conda")) else START_SLACK_S
    return float(request["timeout_s"]) * (1 + 2 * len(request["gpu_types"])) + slack


def _content_addressed(request: Mapping[str, Any]) -> bool:
    """Whether the request names its code by content (a ``working_dir`` URI of an upload: edited
    code is another URI), so that its estimate may be reused. Code named by a path may change
    under it, and a failure may be fixed under the same name: neither is kept."""
    return isinstance((request.get("runtime_env") or {}).get("working_dir"), str)


class EstimateRunner(Protocol):
    def start(self, key: str, request: Mapping[str, Any]) -> None:
        """Begin making the estimate (never blocks on it)."""
        ...

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        """The estimates that finished since the last poll: ``(key, outcome)``."""
        ...

    def cancel(self, key: str) -> None:
        """Stop making it (its outcome, if any, is never polled)."""
        ...


@dataclass(slots=True)
class _Pending:
    jobs: list[str]
    request: Mapping[str, Any]
    started_s: float
    deadline_s: float


@dataclass(slots=True)
class EstimatePool:
    runner: EstimateRunner
    clock: Callable[[], float]
    pending: dict[str, _Pending] = field(default_factory=dict)  # key -> the estimate under way
    key_of: dict[str, str] = field(default_factory=dict)  # job -> its key, while it waits
    cache: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    ready: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (job, outcome) for the next poll

    def request(self, job_id: str, key: str, request: Mapping[str, Any]) -> None:
        if key in self.cache:
            self.cache.move_to_end(key)
            self.ready.append((job_id, self.cache[key]))
            return
        self.key_of[job_id] = key
        if key in self.pending:
            self.pending[key].jobs.append(job_id)
            return
        now = self.clock()
        self.pending[key] = _Pending([job_id], request, now, now + deadline_s(request))
        self.runner.start(key, request)

    def forget(self, job_id: str) -> None:
        """The job no longer waits (cancelled); the last job of a key cancels its estimate."""
        key = self.key_of.pop(job_id, None)
        if key is None or key not in self.pending:
            return
        jobs = self.pending[key].jobs
        jobs.remove(job_id)
        if not jobs:
            del self.pending[key]
            self.runner.cancel(key)

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.ready = self.ready, []
        for key, outcome in self.runner.poll():
            waiting = self.pending.pop(key, None)
            if waiting is None:
                continue
            if "needs" in outcome and _content_addressed(waiting.request):
                self.cache[key] = outcome
                while len(self.cache) > CACHE_SIZE:
                    self.cache.popitem(last=False)
            out += self._settle(waiting, outcome)
        now = self.clock()
        for key in [k for k, p in self.pending.items() if now > p.deadline_s]:
            waiting = self.pending.pop(key)
            self.runner.cancel(key)
            out += self._settle(waiting, {"reject": (
                f"{request_subject(waiting.request)}: no answer from the estimate within "
                f"{waiting.deadline_s - waiting.started_s:.0f} s (the job's runtime_env could not be set up, or "
                "its code hung outside the budgets)")})
        return out

    def _settle(self, waiting: _Pending, outcome: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        for job_id in waiting.jobs:
            self.key_of.pop(job_id, None)
        return [(job_id, outcome) for job_id in waiting.jobs]

    def describe(self, job_id: str) -> str | None:
        """What is being done for the job's estimate, for ``status``; None when nothing is."""
        key = self.key_of.get(job_id)
        waiting = self.pending.get(key) if key is not None else None
        if waiting is None:
            return None
        r = waiting.request
        return (f"estimating: {r['estimator']} on {request_what(r)} for {', '.join(r['gpu_types'])} where the job's "
                f"code lives, for {self.clock() - waiting.started_s:.0f} s (budgets: {float(r['timeout_s']):.0f} s per "
                f"step, {float(r['host_budget_mib']):.0f} MiB of host memory)")


class ThreadEstimateRunner:
    """Makes each estimate with ``estimate(request)`` in a thread of this process (tests, and
    callers whose estimate function runs the user's code elsewhere itself). ``cancel`` only
    drops the outcome: a thread cannot be stopped."""

    def __init__(self, estimate: Callable[[Mapping[str, Any]], dict[str, Any]]):
        self.estimate = estimate
        self.lock = threading.Lock()
        self.done: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: set[str] = set()
        self.started: list[str] = []

    def start(self, key: str, request: Mapping[str, Any]) -> None:
        self.started.append(key)
        self.cancelled.discard(key)
        threading.Thread(target=self._run, args=(key, request), daemon=True, name=f"estimate-{key[:8]}").start()

    def _run(self, key: str, request: Mapping[str, Any]) -> None:
        try:
            outcome = self.estimate(request)
        except Exception as exc:  # noqa: BLE001 - reported as the estimate's failure
            outcome = {"reject": f"{request_subject(request)}: the estimate failed: "
                                 f"{type(exc).__name__}: {exc}"}
        with self.lock:
            self.done.append((key, outcome))

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            done, self.done = self.done, []
        return [(k, o) for k, o in done if k not in self.cancelled]

    def cancel(self, key: str) -> None:
        self.cancelled.add(key)
