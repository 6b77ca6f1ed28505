"""What the scheduler believes a job needs per GPU, by estimator: one rule table for both shells.

A shell knows *how* to ask an estimator (the live queue traces the user's model factory; the
replay reads the value a trace recorded, or asks the same library for a trace's workload); the
rules of *which* answer counts are here:

- a declared need (a spec's ``memory_mib``, a trace pod's declared GPU share) wins, whatever the
  estimator;
- ``none`` gives no estimate (the fixed no-estimate gate applies);
- ``oracle`` takes the true peak (and, in the replay, the true solo utilisation);
- every other estimator is asked (``ask``); only ``auto`` learns: once a job of the same
  signature has run, its measured peak replaces the estimate (``learning.PeakLearner``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["EstimatorRule", "Belief", "RULES", "ESTIMATORS", "ALIASES", "rule", "learns_peak", "believe"]


@dataclass(frozen=True, slots=True)
class EstimatorRule:
    name: str
    kind: Literal["none", "oracle", "model"]
    learns: bool = False  # a measured peak of the same job replaces this estimator's estimate
    recorded_in_traces: bool = False  # the thesis' traces carry this estimator's value per job


@dataclass(frozen=True, slots=True)
class Belief:
    """What is believed of a job at submission: its need per GPU (None: no estimate), where that
    came from (for status), its solo utilisation if known, and whether a measured peak replaces it."""

    need_mib: float | None
    source: str
    smact: float | None = None
    learns: bool = False
    needs: tuple[tuple[str, float], ...] = ()  # per GPU type, (type name, MiB), where the need depends on it


RULES: dict[str, EstimatorRule] = {r.name: r for r in (
    EstimatorRule("auto", "model", learns=True),
    EstimatorRule("horus", "model", recorded_in_traces=True),
    EstimatorRule("faketensor", "model", recorded_in_traces=True),
    EstimatorRule("ml", "model"),
    EstimatorRule("gpumemnet", "model", recorded_in_traces=True),
    EstimatorRule("none", "none"),
    EstimatorRule("oracle", "oracle"),
)}
ESTIMATORS = tuple(RULES)
ALIASES = {"ours": "auto"}  # the replay's (and the thesis') name for the project's own estimators


def rule(name: str) -> EstimatorRule:
    found = RULES.get(ALIASES.get(name, name))
    if found is None:
        known = ", ".join([*RULES, *ALIASES])
        raise ValueError(f"unknown estimator {name!r}; known: {known}")
    return found


def learns_peak(estimator: str, *, declared: bool) -> bool:
    """Whether a measured peak of the same job replaces the estimate: never a declared need."""
    return rule(estimator).learns and not declared


def believe(estimator: str, *, declared_mib: float | None, true_mib: float | None = None,
            true_smact: float | None = None,
            ask: Callable[[EstimatorRule], tuple[float | None, str]]) -> Belief:
    """The belief about one job. ``true_*``: the truth, known to the oracle only (an emulated
    job's profile, a trace's measurement); ``ask(rule)`` -> (MiB or None, source) asks a model
    estimator the shell's way."""
    r = rule(estimator)
    smact = true_smact if r.kind == "oracle" else None
    if declared_mib is not None:
        return Belief(declared_mib, "declared memory_mib", smact)
    if r.kind == "none":
        return Belief(None, "no estimate (estimator: none)")
    if r.kind == "oracle":
        return Belief(true_mib, "oracle (the true peak)", smact)
    need, source = ask(r)
    return Belief(need, source, learns=learns_peak(r.name, declared=False))
