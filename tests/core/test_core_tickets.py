"""One ticket rule for both shells (core.tickets, core.estimate_rules, core.slots)."""

from __future__ import annotations

import pytest

from hier_sched.core.estimate_rules import ESTIMATORS, Belief, believe, learns_peak, rule
from hier_sched.core.events import JobTicket
from hier_sched.core.slots import SLOT_GRACE_S, SLOT_KILL_AFTER_S, Slot
from hier_sched.core.spec import JobSpec, parse_spec, ticket_for_spec
from hier_sched.core.tickets import make_ticket


def _asked(r):
    return 1234.0, f"asked {r.name}"


def test_a_declared_need_wins_over_every_estimator_and_is_never_replaced_by_a_learned_peak():
    for name in ESTIMATORS:
        b = believe(name, declared_mib=4096.0, true_mib=9999.0, ask=_asked)
        assert (b.need_mib, b.source, b.learns) == (4096.0, "declared memory_mib", False)


def test_none_oracle_and_model_estimators_each_give_their_own_answer():
    assert believe("none", declared_mib=None, true_mib=9999.0, ask=_asked).need_mib is None
    oracle = believe("oracle", declared_mib=None, true_mib=9999.0, true_smact=0.4, ask=_asked)
    assert (oracle.need_mib, oracle.smact) == (9999.0, 0.4)
    horus = believe("horus", declared_mib=None, true_mib=9999.0, true_smact=0.4, ask=_asked)
    assert (horus.need_mib, horus.source, horus.smact, horus.learns) == (1234.0, "asked horus", None, False)


def test_only_auto_learns_and_ours_is_auto():
    assert [n for n in ESTIMATORS if learns_peak(n, declared=False)] == ["auto"]
    assert not learns_peak("auto", declared=True)
    assert rule("ours") is rule("auto")
    assert believe("ours", declared_mib=None, ask=_asked).learns
    with pytest.raises(ValueError, match="unknown estimator 'guess'"):
        rule("guess")


def test_the_spec_accepts_exactly_the_rule_tables_estimators():
    assert JobSpec.model_fields["estimator"].annotation.__args__ == ESTIMATORS


def test_the_signature_leaves_the_gpu_type_out_and_the_slot_defaults_are_written_once():
    belief = Belief(1000.0, "declared memory_mib")
    a = make_ticket("j", "j", workload="w", batch_size=8, gpus=1, gpus_per_node=None, belief=belief)
    b = make_ticket("j", "j", workload="w", batch_size=16, gpus=1, gpus_per_node=None, belief=belief)
    assert a.signature == make_ticket("k", "k", workload="w", batch_size=8, gpus=1, gpus_per_node=None,
                                      belief=belief).signature  # peaks are learned per (signature, GPU type)
    assert a.signature != b.signature
    assert a.slot_s is None and (a.slot_grace_s, a.kill_after_s) == (SLOT_GRACE_S, SLOT_KILL_AFTER_S)
    assert JobTicket("x", "x").slot_grace_s == SLOT_GRACE_S == Slot(100.0).grace_s


def test_the_live_ticket_carries_the_specs_slot_retries_and_belief():
    spec = parse_spec({"name": "j", "command": ["train"], "gpus": 2, "memory_mib": 5000, "priority": 3,
                       "slot": {"length_s": 3600, "grace_s": 120, "kill_after_s": 5, "extend_when_idle": True},
                       "retry": {"max_retries": 2, "on_exit_codes": [7]}})
    t = ticket_for_spec("j-1", spec, believe(spec.estimator, declared_mib=spec.memory_mib, ask=_asked))
    assert (t.need_mib, t.learn_peak, t.gpus, t.priority) == (5000, False, 2, 3)
    assert (t.slot_s, t.slot_grace_s, t.kill_after_s, t.slot_extends) == (3600, 120, 5, True)
    assert (t.max_retries, t.retry_exit_codes, t.max_attempts) == (2, (7,), 4)
    default_slot = ticket_for_spec("j-2", parse_spec({"name": "j", "command": ["t"], "slot": {"length_s": 3600}}),
                                   Belief(None, ""))
    assert (default_slot.slot_grace_s, default_slot.kill_after_s) == (SLOT_GRACE_S, SLOT_KILL_AFTER_S)
