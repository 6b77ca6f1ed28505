"""After a restart from a log: holding placement until every node has answered, and reconciling
what each node says it runs with what the scheduler knows.

A node that took a launch order just before the crash reports that run in its first answer, and
it is re-adopted; placed before that answer, the job could start a second time elsewhere (found
by the chaos benchmark's review, RELIABILITY.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hier_sched.core.events import Event, RunStarted, Stop
from hier_sched.core.gpu import Placement
from hier_sched.core.job import JobState
from hier_sched.core.managed_job import RUN_STATES, ManagedJob

__all__ = ["reconcile", "owed_stops"]


def reconcile(jobs: Mapping[str, ManagedJob], node: str,
              runs: Iterable[tuple[str, int, Placement]]) -> tuple[list[Event], list[Stop]]:
    """What a node says it runs against what the scheduler knows. A run the scheduler was about to
    learn of (launched just before a restart: the next attempt of a queued job) is adopted; a run
    the scheduler does not count as running there — its job ended, was requeued after the node was
    lost, or runs another attempt — is a stray to stop, so that no job ever runs twice. Returns
    (events to apply, stops to carry out)."""
    adopt: list[Event] = []
    stray: list[Stop] = []
    for job_id, attempt, placement in runs:
        job = jobs.get(job_id)
        if job is not None and job.record.state in RUN_STATES:
            if job.record.attempts == attempt and node in job.nodes:
                continue
        elif job is not None and job.record.state is JobState.QUEUED and attempt == job.record.attempts + 1:
            adopt.append(RunStarted(job_id, attempt, (placement,)))
            continue
        stray.append(Stop(job_id, attempt, f"stray run on {node}: the scheduler does not count it as running there",
                          kill_after_s=10.0, nodes=(node,)))
    return adopt, stray


def owed_stops(jobs: Mapping[str, ManagedJob]) -> list[Stop]:
    """The stops still owed after a rebuild: runs whose cancel was logged, to stop again."""
    return [Stop(job_id, job.record.attempts, "cancelled by the user", nodes=job.nodes)
            for job_id, job in jobs.items() if job.cancel_requested and job.record.state in RUN_STATES]
