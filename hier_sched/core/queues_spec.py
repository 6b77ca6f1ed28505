"""The queue configuration file, validated: ``parse_queues`` turns a mapping (read from YAML by
the front door) into a ``quotas.QueueSetup``, or a ``SpecError`` naming each bad field in the job
spec's words (``spec.describe_error``). The shape (only ``queues`` and each queue's ``name`` are
required)::

    queues:
      - {name: team-a, nominal: {gpus: 2}, borrowing_limit: {gpus: 2}}
      - {name: team-b, nominal: {gpus: 2}}   # no borrowing_limit: may borrow any idle GPU
      - name: vision
        cohort: research                 # a closed cohort: borrows only what its members lend
        nominal: {gpus: 4, memory_mib: 163840}
        lending_limit: {gpus: 2}         # keeps 2 GPUs free for itself while it does not use them
        weight: 2                        # twice the share of what no one is guaranteed
        reclaimable: true                # others may take back what it borrows (preempting its runs)
        priority_preemption: false       # its jobs may preempt its own runs of lower priority
        min_runtime_s: 600               # no run preempted before it ran 10 minutes
    priority_classes:
      - {name: production, value: 100, preemptible: false}
      - {name: batch, value: 0}
    fair_sharing: {half_life_s: 3600, reclaim: fair_share}   # or reclaim: nominal
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hier_sched.core.quotas import DEFAULT_HALF_LIFE_S, PriorityClass, QueueQuota, QueueSetup
from hier_sched.core.spec import SpecError, describe_error

__all__ = ["parse_queues"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_LARGE = 2.0**53


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Amount(_Strict):
    gpus: int | None = Field(None, ge=0, le=2**31)
    memory_mib: float | None = Field(None, ge=0, le=_LARGE)


class _QueueSpec(_Strict):
    name: str = Field(pattern=_NAME)
    cohort: str | None = Field(None, pattern=_NAME)
    nominal: _Amount = _Amount()
    borrowing_limit: _Amount | None = None
    lending_limit: _Amount | None = None
    weight: float = Field(1.0, gt=0, le=1e6)
    reclaimable: bool = True
    priority_preemption: bool = False
    min_runtime_s: float = Field(0.0, ge=0, le=_LARGE)

    @model_validator(mode="after")
    def _limits_in_named_currencies(self) -> "_QueueSpec":
        named = {"memory_mib"} if self.nominal.memory_mib is not None else set()
        if self.nominal.gpus is not None or not named:  # naming nothing is nominal 0 GPUs
            named.add("gpus")
        for field, amount in (("borrowing_limit", self.borrowing_limit), ("lending_limit", self.lending_limit)):
            for currency in ("gpus", "memory_mib"):
                if amount is not None and getattr(amount, currency) is not None and currency not in named:
                    raise ValueError(f"{field}.{currency} limits a currency the nominal quota does not name "
                                     f"(add nominal.{currency})")
        return self

    def quota(self) -> QueueQuota:
        nominal = self.nominal
        # A queue that names no currency is nominal 0 GPUs; one that names memory only is not
        # limited in GPUs.
        gpus = nominal.gpus if nominal.gpus is not None or nominal.memory_mib is not None else 0
        borrow, lend = self.borrowing_limit or _Amount(), self.lending_limit or _Amount()
        return QueueQuota(self.name, nominal_gpus=gpus, borrowing_limit_gpus=borrow.gpus,
                          nominal_mib=nominal.memory_mib, borrowing_limit_mib=borrow.memory_mib,
                          lending_limit_gpus=lend.gpus, lending_limit_mib=lend.memory_mib, cohort=self.cohort,
                          weight=self.weight, reclaimable=self.reclaimable,
                          priority_preemption=self.priority_preemption, min_runtime_s=self.min_runtime_s)


class _ClassSpec(_Strict):
    name: str = Field(pattern=_NAME)
    value: int = Field(ge=-(2**31), le=2**31)
    preemptible: bool | None = None


class _FairSharing(_Strict):
    half_life_s: float = Field(DEFAULT_HALF_LIFE_S, ge=0, le=_LARGE)
    reclaim: Literal["fair_share", "nominal"] = "fair_share"


def _unique(kind: str, items: tuple[Any, ...]) -> tuple[Any, ...]:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise ValueError(f"{kind} {item.name!r} is defined twice")
        seen.add(item.name)
    return items


class _QueuesSpec(_Strict):
    queues: tuple[_QueueSpec, ...]
    priority_classes: tuple[_ClassSpec, ...] = ()
    fair_sharing: _FairSharing = _FairSharing()

    @field_validator("queues")
    @classmethod
    def _unique_queues(cls, queues: tuple[_QueueSpec, ...]) -> tuple[_QueueSpec, ...]:
        return _unique("queue", queues)

    @field_validator("priority_classes")
    @classmethod
    def _unique_classes(cls, classes: tuple[_ClassSpec, ...]) -> tuple[_ClassSpec, ...]:
        return _unique("priority class", classes)


def parse_queues(data: Any, source: str = "queue configuration") -> QueueSetup:
    """Validate a mapping (the shape above) into a ``QueueSetup``, or raise ``SpecError`` naming
    each bad field (``queues.1.nominal.gpus: ...``)."""
    if not isinstance(data, Mapping):
        raise SpecError([f"expected a mapping with a 'queues' list, got {type(data).__name__}"], source)
    try:
        spec = _QueuesSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise SpecError([describe_error(e, _QueuesSpec) for e in exc.errors()], source) from None
    return QueueSetup(tuple(q.quota() for q in spec.queues),
                      tuple(PriorityClass(c.name, c.value, c.preemptible) for c in spec.priority_classes),
                      half_life_s=spec.fair_sharing.half_life_s, reclaim=spec.fair_sharing.reclaim)
