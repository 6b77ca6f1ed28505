"""Launch orders on their way to the nodes, and their replies: the queue's launch round.

A tick's orders ride on the call that asks each node for its next report (``NodeSet.ask_all``,
at the tick's end), and each node's replies come back in that report (``NodeReport.launched``),
which the next tick reads first. One round trip per node and tick carries both ways, so a tick
neither pays a call per node it launches on nor waits for the nodes to start their runs: a node
slow to start them is one more node slow to answer (before, each tick sent its launch calls and
waited up to 30 s for the slowest answer; at 1,000 nodes they were most of a busy tick's tail,
BENCHMARKS.md, "Control plane at scale").

A launch is settled once every rank's node has replied: started (``RunStarted`` is logged before
any event its nodes report of the run), or declined by some node (the core takes the attempt
back). A node's report that does not carry the replies to orders its ask carried (its call
failed, or its answer was dropped) leaves them unanswered: declined, and the node's runs are
compared with the queue's (a run it did start is re-adopted). Orders wait here while their node
still has an earlier ask in flight; an order whose run the queue no longer wants is not sent at
all, and a launch with an order to a node that was lost is forgotten (``lost``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hier_sched.common.messages import LaunchOrder, LaunchReply, NodeReport
from hier_sched.core.events import Launch

__all__ = ["LaunchRound", "Settled"]


@dataclass(slots=True)
class _Launching:
    cmd: Launch
    orders: list[LaunchOrder]
    decided_s: float  # the queue's scheduler clock when the core decided it
    replies: dict[int, LaunchReply] = field(default_factory=dict)  # rank -> its node's reply
    started_s: float = 0.0  # the latest of its nodes' clocks when they replied


@dataclass(frozen=True, slots=True)
class Settled:
    """A launch whose every rank has a reply."""

    cmd: Launch
    orders: list[LaunchOrder]
    replies: list[LaunchReply]  # in rank order
    decided_s: float  # the queue's scheduler clock when the core decided it
    seconds: float  # from the decision to its last node's reply (scheduler seconds, the nodes' clocks)

    @property
    def started(self) -> bool:
        return all(r.launched for r in self.replies)


class LaunchRound:
    """The launches decided and not settled yet (no Ray, no clock: the service drives it)."""

    def __init__(self) -> None:
        self.launching: dict[str, _Launching] = {}  # job -> its launch, waiting for replies
        self.unsent: dict[str, list[LaunchOrder]] = {}  # node -> orders for its next ask
        self.sent: dict[str, list[LaunchOrder]] = {}  # node -> orders its ask in flight carried

    def add(self, cmd: Launch, orders: list[LaunchOrder], now_s: float) -> None:
        self.launching[cmd.job_id] = _Launching(cmd, orders, now_s)
        for order in orders:
            self.unsent.setdefault(order.placement.node, []).append(order)

    def awaits(self, job_id: str) -> bool:
        """Whether ``job_id`` has a launch not settled yet: its nodes' events of it wait."""
        return job_id in self.launching

    def to_send(self, refused: Callable[[LaunchOrder], str | None]) -> dict[str, list[LaunchOrder]]:
        """Each node's orders for its next ask; an order ``refused`` names a reason for is
        answered declined here instead (never sent)."""
        out: dict[str, list[LaunchOrder]] = {}
        for node, orders in list(self.unsent.items()):
            keep = []
            for order in orders:
                reason = refused(order)
                if reason is None:
                    keep.append(order)
                else:
                    self._reply(order, LaunchReply(False, reason), None)
            if keep:
                out[node] = self.unsent[node] = keep
            else:
                del self.unsent[node]
        return out

    def asked(self, nodes: Iterable[str]) -> None:
        """The asks of ``nodes`` went out, each with its orders from ``to_send``."""
        for node in nodes:
            if (orders := self.unsent.pop(node, None)) is not None:
                self.sent.setdefault(node, []).extend(orders)

    def answered(self, report: NodeReport) -> bool:
        """Take the replies ``report`` carries to its node's orders in flight; False when some
        went unanswered (the report answers a later ask than theirs)."""
        orders = self.sent.pop(report.node, None)
        if not orders:
            return True
        replies = report.launched
        for i, order in enumerate(orders):
            reply = replies[i] if i < len(replies) else LaunchReply(False, f"{report.node} did not answer")
            self._reply(order, reply, report.now_s)
        return len(replies) >= len(orders)

    def lost(self, node: str) -> None:
        """``node`` is lost: every launch with an order to it is forgotten, never settled (the
        core's ``NodeLost`` ended the run there, and a gang's run once its other ranks end; a
        decline now would take back an attempt the loss has already counted)."""
        jobs = {o.job_id for o in self.sent.get(node, []) + self.unsent.get(node, [])}
        if not jobs:
            return
        for job in jobs:
            self.launching.pop(job, None)
        for pending in (self.sent, self.unsent):
            for other in list(pending):
                pending[other] = [o for o in pending[other] if o.job_id not in jobs]
                if not pending[other]:
                    del pending[other]

    def settle(self) -> list[Settled]:
        """The launches whose every rank has a reply, taken out, in the order they were decided."""
        done = [job for job, launch in self.launching.items() if len(launch.replies) == len(launch.orders)]
        out = []
        for job in done:
            launch = self.launching.pop(job)
            out.append(Settled(launch.cmd, launch.orders, [launch.replies[o.rank] for o in launch.orders],
                               launch.decided_s, max(0.0, launch.started_s - launch.decided_s)))
        return out

    def _reply(self, order: LaunchOrder, reply: LaunchReply, node_now_s: float | None) -> None:
        launch = self.launching.get(order.job_id)
        if launch is None or launch.cmd.attempt != order.launch.attempt:
            return
        launch.replies[order.rank] = reply
        if node_now_s is not None:
            launch.started_s = max(launch.started_s, node_now_s)
