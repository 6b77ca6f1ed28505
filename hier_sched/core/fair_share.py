"""Fair shares and decayed use: the two numbers that make team queues fair.

* ``water_fill``: a weighted max-min division of a capacity. Each claimant first gets its floor
  (what its nominal quota guarantees of what it asks for), then the rest is filled by weight, each
  up to its cap (what it asks for, within its borrowing limit). A queue's **fair share** is what
  this gives it; a queue below its fair share with jobs waiting takes back what queues above
  theirs hold (``quota_book.QuotaBook.reclaim``), which is how KAI reclaims up to fair share.
* ``decayed``: an exponentially weighted average of a queue's use over time with a half-life
  (Slurm's fair-share decay, Kueue's admission fair sharing); the order across queues follows the
  weighted dominant share of it (``QuotaBook.order_share``), so a queue that used much lately
  waits behind one that did not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["water_fill", "decayed"]


def water_fill(floors: Mapping[str, float], caps: Mapping[str, float], weights: Mapping[str, float],
               capacity: float) -> dict[str, float]:
    """Divide ``capacity``: floors first (scaled down alike when they exceed it), then the rest
    in proportion to the weights, none beyond its cap (>= its floor). Returns name -> share."""
    total_floor = sum(floors.values())
    if total_floor >= capacity:
        scale = capacity / total_floor if total_floor > 0 else 0.0
        return {name: floor * scale for name, floor in floors.items()}
    left = capacity - total_floor
    # Raise a common level x (share = floor + weight * x) until the capacity is spent; a claimant
    # reaching its cap stops there. Visiting them in the order they reach their cap makes it exact.
    room = sorted(((caps[n] - floors[n]) / weights[n], n) for n in floors if caps[n] > floors[n] and weights[n] > 0)
    active_weight = sum(weights[n] for _, n in room)
    level = 0.0
    for reach, name in room:
        step = (reach - level) * active_weight
        if step >= left:
            level += left / active_weight
            break
        left -= step
        level = reach
        active_weight -= weights[name]
    share = dict(floors)
    for reach, name in room:
        share[name] = floors[name] + weights[name] * min(level, reach)
    return share


def kept_fraction(elapsed_s: float, half_life_s: float) -> float:
    """How much of a decayed average is left after ``elapsed_s`` (none without a half-life): one
    power for every queue and currency a step folds in."""
    return math.pow(0.5, elapsed_s / half_life_s) if half_life_s > 0 else 0.0


def decayed(average: float, current: float, kept: float) -> float:
    """The use ``current`` (held while ``kept`` of the past decayed, ``kept_fraction``) folded
    into the decayed ``average``."""
    return average * kept + current * (1.0 - kept)
