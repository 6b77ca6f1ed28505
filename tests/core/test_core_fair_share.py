"""Fair shares (weighted max-min with guarantees) and decayed use, on their own."""

from __future__ import annotations

import math

import pytest

from hier_sched.core.fair_share import decayed, kept_fraction, water_fill
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quotas import Charge, QueueQuota, QueueSetup


def test_floors_come_first_then_the_rest_goes_by_weight_up_to_each_cap():
    assert water_fill({"a": 2, "b": 2}, {"a": 4, "b": 2}, {"a": 1, "b": 1}, 4) == {"a": 2, "b": 2}
    # 9 to share, no floors: a is capped at 1; b and c split the other 8 as 1:2
    shares = water_fill({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 10, "c": 10}, {"a": 1, "b": 1, "c": 2}, 9)
    assert shares == pytest.approx({"a": 1, "b": 8 / 3, "c": 16 / 3})
    # more capacity than anyone asks: everyone gets its cap
    assert water_fill({"a": 1, "b": 0}, {"a": 2, "b": 3}, {"a": 1, "b": 1}, 10) == {"a": 2, "b": 3}


def test_floors_beyond_the_capacity_are_scaled_down_alike():
    assert water_fill({"a": 3, "b": 1}, {"a": 3, "b": 1}, {"a": 1, "b": 1}, 2) == {"a": 1.5, "b": 0.5}


def test_decayed_use_halves_its_past_each_half_life_and_follows_the_present():
    assert decayed(8.0, 0.0, kept_fraction(3600.0, 3600.0)) == 4.0
    assert decayed(0.0, 2.0, kept_fraction(7200.0, 3600.0)) == pytest.approx(1.5)
    assert decayed(8.0, 2.0, kept_fraction(1.0, 0.0)) == 2.0  # no half-life: the use now


def book(*queues: QueueQuota, gpus: float = 8, mib: float = 8 * 40960.0, **setup) -> QuotaBook:
    b = QuotaBook(QueueSetup(queues, **setup))
    b.set_capacity(Charge(gpus, mib))
    return b


def test_a_fair_share_is_the_guarantee_plus_a_weighted_part_of_what_no_one_is_guaranteed():
    b = book(QueueQuota("a", 2), QueueQuota("b", 2, weight=3.0), QueueQuota("c", 0, borrowing_limit_gpus=1))
    fair = b.fair_shares({"a": Charge(8), "b": Charge(8), "c": Charge(8)})
    # the 4 GPUs that are nobody's go 1:3:1 by weight (c stays under its borrowing limit of 1)
    assert (fair["a"].gpus, fair["b"].gpus, fair["c"].gpus) == pytest.approx((2.8, 4.4, 0.8))
    assert math.isinf(fair["a"].mib)  # memory is not governed by these queues
    idle_b = b.fair_shares({"a": Charge(8), "c": Charge(1)})
    assert idle_b["a"].gpus == pytest.approx(7.0) and idle_b["b"].gpus == 0  # b's unused quota is lent


def test_a_named_cohort_shares_only_what_its_members_lend():
    b = book(QueueQuota("x1", 2, cohort="x"), QueueQuota("x2", 2, cohort="x", lending_limit_gpus=1),
             QueueQuota("open", 0))
    fair = b.fair_shares({"x1": Charge(8), "open": Charge(8)})
    # x2 asks nothing but lends only 1 of its 2; the 4 GPUs nobody is guaranteed go to the open cohort
    assert (fair["x1"].gpus, fair["open"].gpus) == (3.0, 4.0)


def test_memory_quotas_are_shared_in_mib():
    b = book(QueueQuota("a", None, nominal_mib=40960.0), QueueQuota("b", None, nominal_mib=40960.0),
             gpus=2, mib=2 * 40960.0)
    fair = b.fair_shares({"a": Charge(3, 3 * 30000.0), "b": Charge(1, 10000.0)})
    assert fair["b"].mib == 10000.0 and fair["a"].mib == pytest.approx(2 * 40960.0 - 10000.0)
    assert math.isinf(fair["a"].gpus)  # GPUs are not governed for a memory-only queue


def test_the_order_share_is_the_weighted_dominant_share_of_decayed_use():
    b = book(QueueQuota("a", 0, nominal_mib=0.0), QueueQuota("b", 0, weight=2.0), half_life_s=100.0)
    b.advance(0.0)
    b.start(QuotaRun("j", "a", Charge(1, 6 * 40960.0), 0, 0.0, True, True), 0.0)
    b.start(QuotaRun("k", "b", Charge(4, 4 * 40960.0), 0, 0.0, True, True), 0.0)
    b.advance(100.0)  # half of the use now
    # a: memory dominates (6 of 8 GPUs' memory -> 0.75, half of it decayed in: 0.375);
    # b: 4 of 8 GPUs (memory not governed) -> 0.5 -> 0.25, weight 2 -> 0.125
    assert b.order_share("a") == pytest.approx(0.375) and b.order_share("b") == pytest.approx(0.125)
    b.end("j", 100.0)
    b.advance(300.0)
    assert b.order_share("a") == pytest.approx(0.375 / 4)  # two half-lives of no use


def test_a_queues_refusal_follows_its_runs_as_they_start_shrink_and_end():
    """The quota check a cycle asks of every job is looked up once per queue until a run starts,
    shrinks or ends: each of those changes what it answers, and what the cycle gave counts at once."""
    b = book(QueueQuota("a", 2, borrowing_limit_gpus=0), QueueQuota("m", None, nominal_mib=40000.0,
                                                                     borrowing_limit_mib=0.0))
    one, none_given = Charge(1, 10000.0), {}
    assert b.refusal("a", one, none_given) is None
    b.start(QuotaRun("j", "a", one, 0, 0.0, True, False), 0.0)
    assert b.refusal("a", one, none_given) is None
    assert "borrowing limit reached" in b.refusal("a", one, {"a": one})  # the cycle gave it its second GPU
    b.start(QuotaRun("k", "a", one, 0, 0.0, True, False), 0.0)
    assert "borrowing limit reached" in b.refusal("a", one, none_given)
    b.end("k", 1.0)
    assert b.refusal("a", one, none_given) is None
    b.start(QuotaRun("big", "m", Charge(1, 35000.0), 0, 0.0, True, False), 0.0)
    assert "borrowing limit reached" in b.refusal("m", one, none_given)
    b.resize("big", 25000.0, 2.0)  # it settled below what it reserved
    assert b.refusal("m", one, none_given) is None
