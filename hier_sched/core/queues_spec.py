"""The queue configuration file, validated: ``parse_queues`` turns a mapping (read from YAML by
the front door) into the queues' quotas (``quotas.QueueQuota``) or a ``SpecError`` naming each bad
field, in the job spec's words (``spec.describe_error``). The shape::

    queues:
      - {name: team-a, nominal: {gpus: 2}, borrowing_limit: {gpus: 2}}
      - {name: team-b, nominal: {gpus: 2}}   # no borrowing_limit: may borrow any idle GPU
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hier_sched.core.quotas import QueueQuota
from hier_sched.core.spec import SpecError, describe_error

__all__ = ["parse_queues"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Gpus(_Strict):
    gpus: int = Field(ge=0, le=2**31)


class _QueueSpec(_Strict):
    name: str = Field(pattern=_NAME)
    nominal: _Gpus = _Gpus(gpus=0)
    borrowing_limit: _Gpus | None = None


class _QueuesSpec(_Strict):
    queues: tuple[_QueueSpec, ...]

    @field_validator("queues")
    @classmethod
    def _unique(cls, queues: tuple[_QueueSpec, ...]) -> tuple[_QueueSpec, ...]:
        seen: set[str] = set()
        for q in queues:
            if q.name in seen:
                raise ValueError(f"queue {q.name!r} is defined twice")
            seen.add(q.name)
        return queues


def parse_queues(data: Any, source: str = "queue configuration") -> tuple[QueueQuota, ...]:
    """Validate a mapping (``{queues: [{name, nominal: {gpus}, borrowing_limit: {gpus}}, ...]}``)
    into the queues, or raise ``SpecError`` naming each bad field (``queues.1.nominal.gpus: ...``)."""
    if not isinstance(data, Mapping):
        raise SpecError([f"expected a mapping with a 'queues' list, got {type(data).__name__}"], source)
    try:
        spec = _QueuesSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise SpecError([describe_error(e) for e in exc.errors()], source) from None
    return tuple(QueueQuota(q.name, q.nominal.gpus, None if q.borrowing_limit is None else q.borrowing_limit.gpus)
                 for q in spec.queues)
