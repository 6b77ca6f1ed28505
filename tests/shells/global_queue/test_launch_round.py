"""The queue's launch round (``global_queue.launches``): orders ride on the nodes' next asks, their
replies on the reports those asks return, and a launch is settled once every rank has one."""

from __future__ import annotations

from global_queue.launches import LaunchRound
from hier_sched.common.messages import LaunchOrder, LaunchReply, LaunchSpec, NodeReport
from hier_sched.core.events import Launch
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest

SPEC = LaunchSpec(["true"], None, None, None, {}, None, None)


def launch(job: str, *nodes: str, attempt: int = 1) -> tuple[Launch, list[LaunchOrder]]:
    cmd = Launch(job, attempt, tuple(Placement(job, n, (0,), 1000.0) for n in nodes), None, PlacementRequest(job))
    return cmd, [LaunchOrder(cmd, rank, SPEC) for rank in range(len(nodes))]


def report(node: str, now_s: float, *replies: LaunchReply) -> NodeReport:
    return NodeReport(node, now_s, [], "inc", [], [], launched=list(replies))


OK = LaunchReply(True, "fits")


def test_orders_go_with_the_next_ask_and_a_launch_settles_when_its_node_replies():
    round_ = LaunchRound()
    round_.add(*launch("a", "n0"), now_s=10.0)
    assert round_.awaits("a")
    orders = round_.to_send(lambda order: None)
    assert [o.job_id for o in orders["n0"]] == ["a"]
    assert round_.settle() == []  # not asked yet
    round_.asked({"n0"})
    assert round_.answered(report("n0", 10.4, OK))
    (settled,) = round_.settle()
    assert settled.started and settled.cmd.job_id == "a" and abs(settled.seconds - 0.4) < 1e-9
    assert not round_.awaits("a") and round_.settle() == []


def test_orders_wait_while_their_node_has_an_ask_in_flight():
    round_ = LaunchRound()
    round_.add(*launch("a", "n0"), now_s=0.0)
    round_.to_send(lambda order: None)
    round_.asked(set())  # n0's last ask had not been answered: not asked now
    assert round_.answered(report("n0", 1.0))  # the answer to that earlier ask: nothing of ours in it
    assert round_.settle() == [] and "n0" in round_.to_send(lambda order: None)


def test_a_report_without_the_replies_leaves_the_orders_unanswered_and_declined():
    round_ = LaunchRound()
    round_.add(*launch("a", "n0"), now_s=0.0)
    round_.to_send(lambda order: None)
    round_.asked({"n0"})
    assert not round_.answered(report("n0", 1.0))  # its answer was lost: this report answers a later ask
    (settled,) = round_.settle()
    assert not settled.started and settled.replies[0].reason == "n0 did not answer"


def test_a_gang_settles_once_every_rank_replied_and_one_decline_declines_it():
    round_ = LaunchRound()
    round_.add(*launch("g", "n0", "n1"), now_s=0.0)
    round_.asked(round_.to_send(lambda order: None))
    round_.answered(report("n0", 1.0, OK))
    assert round_.settle() == [] and round_.awaits("g")
    round_.answered(report("n1", 2.0, LaunchReply(False, "no longer fits")))
    (settled,) = round_.settle()
    assert not settled.started and [r.launched for r in settled.replies] == [True, False]


def test_an_order_the_queue_no_longer_wants_is_declined_without_being_sent():
    round_ = LaunchRound()
    round_.add(*launch("a", "n0"), now_s=0.0)
    assert round_.to_send(lambda order: "no longer wanted") == {}
    (settled,) = round_.settle()
    assert not settled.started and settled.replies[0].reason == "no longer wanted"


def test_a_launch_with_an_order_to_a_lost_node_is_forgotten_with_all_its_orders():
    round_ = LaunchRound()
    round_.add(*launch("g", "n0", "n1"), now_s=0.0)
    round_.add(*launch("b", "n1"), now_s=0.0)
    round_.to_send(lambda order: None)
    round_.asked({"n0"})  # n1's orders still wait
    round_.lost("n1")
    assert not round_.awaits("g") and round_.awaits("b") is False
    assert round_.answered(report("n0", 1.0, OK)) and round_.settle() == []
    assert round_.to_send(lambda order: None) == {}


def test_a_reply_to_an_older_attempt_changes_nothing():
    round_ = LaunchRound()
    old_cmd, old_orders = launch("a", "n0", attempt=1)
    round_.add(old_cmd, old_orders, now_s=0.0)
    round_.asked(round_.to_send(lambda order: None))
    round_.add(*launch("a", "n1", attempt=2), now_s=1.0)  # the core moved on (its first node was lost)
    round_.answered(report("n0", 1.0, OK))
    assert round_.settle() == [] and round_.awaits("a")
