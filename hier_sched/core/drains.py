"""Drained nodes (``Drains``): a node taken out of service without losing its jobs' work.

A drain (``NodeDraining``: an operator's ``hier-sched drain``, or Ray's own drain request or
preemption notice) closes the node to new work at once (``ClusterIndex.close``). Each run there
that saves checkpoints gets the checkpoint signal, exits with the requeue code and resumes
elsewhere; one that has not exited when its grace ends is stopped, as at a slot's end. A run that
cannot checkpoint runs on to its end -- stopping it would only throw its work away -- unless the
drain has a deadline: what still runs on the node then is stopped (a gang with it, every rank)
and requeued once it has exited, to start again from its last checkpoint, if any (``RunEvicted``,
logged).
``NodeUndrained`` opens the node again.

A drain outlives the node's loss and return (a machine drained for maintenance comes back
drained) and a restart of the queue (its events are logged); a node with no run left is drained.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hier_sched.core.events import Command, NodeDraining, NodeUndrained, RunEvicted, Stop
from hier_sched.core.job import JobState
from hier_sched.core.managed_job import ManagedJob

__all__ = ["Drain", "Drains"]

Preempt = Callable[[ManagedJob, float, str, list[Command]], None]  # signal, then stop after grace (``JobLifecycle``)
Evict = Callable[[RunEvicted, float, list[Command]], None]  # the run is stopped; the job requeued once it has ended


@dataclass(frozen=True, slots=True)
class Drain:
    reason: str
    since_s: float
    deadline_s: float | None  # when what still runs there is stopped (None: runs end by themselves)


class Drains:
    def __init__(self, with_runs: Mapping[str, ManagedJob], preempt: Preempt, evict: Evict):
        self._with_runs = with_runs  # the jobs with a run (``JobLifecycle.with_runs``)
        self._preempt = preempt
        self._evict = evict
        self.nodes: dict[str, Drain] = {}  # node -> its drain
        self._deadlines: list[tuple[float, str]] = []  # (deadline, node); one whose drain changed is dropped

    @property
    def next_at(self) -> float | None:
        """When the next drain deadline falls (None: none is due)."""
        return self._deadlines[0][0] if self._deadlines else None

    def closed(self) -> Iterable[str]:
        """The nodes that take no new work."""
        return self.nodes.keys()

    def on_draining(self, e: NodeDraining, now_s: float, out: list[Command]) -> None:
        """Close the node and signal its runs that checkpoint. A node drained again keeps the
        earlier of the two deadlines (a later request never buys a run more time)."""
        held = self.nodes.get(e.node)
        deadline = e.deadline_s
        if held is not None and held.deadline_s is not None:
            deadline = held.deadline_s if deadline is None else min(deadline, held.deadline_s)
        self.nodes[e.node] = Drain(e.reason, held.since_s if held else now_s, deadline)
        if deadline is not None and (held is None or held.deadline_s != deadline):
            heapq.heappush(self._deadlines, (deadline, e.node))
        why = f"node {e.node} drains ({e.reason})"
        for job in self.runs_on(e.node):
            if job.record.state is JobState.RUNNING and job.ticket.checkpoints:
                job.drained_from = e.node
                self._preempt(job, now_s, why, out)

    def on_undrained(self, e: NodeUndrained, now_s: float, out: list[Command]) -> None:
        """The node takes work again (runs already signalled go on saving and requeue)."""
        self.nodes.pop(e.node, None)

    def act(self, now_s: float, out: list[Command]) -> list[RunEvicted]:
        """Stop what still runs on the nodes whose deadline has come (each job requeued when its
        run has ended); returns the evictions, applied already, for the shell's log."""
        evicted: list[RunEvicted] = []
        while self._deadlines and self._deadlines[0][0] <= now_s:
            due, node = heapq.heappop(self._deadlines)
            drain = self.nodes.get(node)
            if drain is None or drain.deadline_s != due:
                continue  # undrained, or drained again with an earlier deadline
            why = f"node {node} drained: its deadline came ({drain.reason})"
            for job in self.runs_on(node):
                if job.evicted_for is not None:
                    continue  # stopped already (a queue rebuilt from its log meets the deadline again)
                event = RunEvicted(job.ticket.job_id, job.record.attempts, why)
                out.append(Stop(event.job_id, event.attempt, why, job.ticket.kill_after_s, job.nodes))
                self._evict(event, now_s, out)
                evicted.append(event)
        return evicted

    def runs_on(self, node: str) -> list[ManagedJob]:
        """The jobs with a run (or a gang's rank) on ``node``."""
        return [j for j in self._with_runs.values() if node in j.nodes]
