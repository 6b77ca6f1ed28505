"""Team queues: what a queue is guaranteed and may use, in two currencies, and the priority classes.

A cluster's capacity is shared by **queues**, grouped in **cohorts** (teams). A queue has, in
each currency it names (``CURRENCIES``: GPUs, counted whole per request as Kubernetes counts
``nvidia.com/gpu``, and GPU memory in MiB, the currency of fractional collocation):

* a **nominal quota**: what it is guaranteed;
* a **borrowing limit**: how much beyond its nominal quota it may use while others leave
  capacity idle (None: no limit);
* a **lending limit**: how much of its unused nominal quota its cohort-mates may borrow (None:
  all of it); the rest stays free for it;
* a **weight**: its part of the capacity beyond the guarantees (fair share), and how fast its
  use counts against it in the order across queues.

A currency a queue does not name is neither limited nor counted for it. A queue that names
neither is nominal 0 GPUs: it runs on what others leave idle, as ``default`` does (the queue of
jobs that name none and whose user has no queue of their own).

**Cohorts.** A cohort you name is closed: its queues borrow only what its members lend. Queues
that name no cohort form the cluster's open cohort: they borrow whatever the cluster has room for,
collocation included, that no named cohort guarantees.

**Priority classes** (``PriorityClass``) name priorities; a class may say whether its jobs can
be preempted. The book that applies all this is ``quota_book``; the fair shares are
``fair_share``'s; the file format is ``queues_spec``'s.
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CURRENCIES", "DEFAULT_QUEUE", "DEFAULT_HALF_LIFE_S", "ZERO", "Charge", "QueueQuota", "PriorityClass", "QueueSetup",
    "resolve_queue", "resolve_priority",
]

DEFAULT_QUEUE = "default"
CURRENCIES = ("gpus", "mib")
DEFAULT_HALF_LIFE_S = 3600.0


_new_tuple = tuple.__new__


class Charge(NamedTuple):
    """An amount in both currencies: GPUs (requests, counted whole) and GPU memory (MiB). A
    named tuple: the planner adds many of them per cycle."""

    gpus: float = 0.0
    mib: float = 0.0

    # (built by ``tuple.__new__``: a named tuple's own constructor costs twice as much, and a
    # contended replay adds millions of charges)
    def __add__(self, other: "Charge") -> "Charge":  # type: ignore[override]  # sums, not concatenation
        return _new_tuple(Charge, (self[0] + other[0], self[1] + other[1]))

    def __sub__(self, other: "Charge") -> "Charge":
        return _new_tuple(Charge, (self[0] - other[0], self[1] - other[1]))

    def of(self, currency: str) -> float:
        return self[0] if currency == "gpus" else self[1]


ZERO = Charge()


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """One queue. Field names are those of the write-ahead log's records (version 1 wrote the
    first three)."""

    name: str
    nominal_gpus: float | None = 0  # None: GPUs not governed (the queue names memory only)
    borrowing_limit_gpus: float | None = None  # beyond nominal; None: no limit
    nominal_mib: float | None = None  # None: memory not governed
    borrowing_limit_mib: float | None = None
    lending_limit_gpus: float | None = None  # of its unused nominal its cohort-mates may borrow; None: all
    lending_limit_mib: float | None = None
    cohort: str | None = None  # None: the cluster's open cohort
    weight: float = 1.0
    # Other queues may take back what it borrows (its runs are preempted, checkpoint first); False:
    # what it borrows it keeps until its runs end.
    reclaimable: bool = True
    # A waiting job may preempt the queue's own runs of lower priority (checkpoint first).
    priority_preemption: bool = False
    min_runtime_s: float = 0.0  # a run is never preempted before it has run this long

    def governs(self, currency: str) -> bool:
        return self.nominal(currency) is not None

    def nominal(self, currency: str) -> float | None:
        return self.nominal_gpus if currency == "gpus" else self.nominal_mib

    def borrowing_limit(self, currency: str) -> float | None:
        return self.borrowing_limit_gpus if currency == "gpus" else self.borrowing_limit_mib

    def lending_limit(self, currency: str) -> float | None:
        return self.lending_limit_gpus if currency == "gpus" else self.lending_limit_mib

    def ceiling(self, currency: str) -> float:
        """The most its runs may hold at once (inf: not governed, or no borrowing limit)."""
        nominal, limit = self.nominal(currency), self.borrowing_limit(currency)
        return math.inf if nominal is None or limit is None else nominal + limit

    def lendable(self, currency: str) -> float:
        """How much of its nominal quota its cohort-mates may borrow while it does not use it."""
        nominal = self.nominal(currency) or 0.0
        limit = self.lending_limit(currency)
        return nominal if limit is None else min(nominal, limit)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool | None = None  # None: as the job and its queue say


@dataclass(frozen=True, slots=True)
class QueueSetup:
    """Everything ``hier-sched queues apply`` sets: the queues, the priority classes, and how
    the order across queues and the reclaim work."""

    queues: tuple[QueueQuota, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = ()
    # The half-life of the use that orders queues (dominant share, decayed); 0: use now only.
    half_life_s: float = DEFAULT_HALF_LIFE_S
    # Up to where a queue whose jobs wait takes back what others hold: its fair share (further
    # than Kueue and KAI go), or its nominal quota ("nominal", as they do).
    reclaim: str = "fair_share"


def resolve_queue(names: Container[str], queue: str | None, user: str) -> str:
    """A job's queue, decided when it is submitted: the one it names, else the queue named like
    its user if there is one (``names``: the queues configured), else ``default``."""
    if queue is not None:
        return queue
    return user if user in names else DEFAULT_QUEUE


def resolve_priority(classes: dict[str, PriorityClass], priority_class: str | None, priority: int) -> int:
    """A job's priority: its class's value when it names a class (known: checked at admission)."""
    if priority_class is None:
        return priority
    known = classes.get(priority_class)
    return known.value if known is not None else priority
