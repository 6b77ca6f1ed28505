"""Pickling by fields for the records that cross Ray on every tick.

A frozen dataclass with slots pickles through ``dataclasses``' own ``__getstate__`` and
``__setstate__``, which call ``fields()`` and ``object.__setattr__`` field by field: a node's report
(eight ``GpuState`` and its runs) took ~400 us to pickle and unpickle, and the global queue reads
one per changed node per tick. Rebuilt through the constructor from a tuple, it takes half that
(measured in BENCHMARKS.md, "Control plane at scale"). Only for classes whose ``__init__`` takes
every field positionally, in declaration order, and checks nothing: the constructor sees what the
sender's object held.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["pickled_by_fields"]

T = TypeVar("T", bound=type)


def pickled_by_fields(cls: T) -> T:
    """Give dataclass ``cls`` a ``__reduce__`` that rebuilds it from its fields, in order."""
    names = tuple(f.name for f in fields(cls) if f.init)
    if len(names) != len(fields(cls)):
        raise TypeError(f"{cls.__name__}: every field must be an __init__ argument to be pickled by fields")

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        return cls, tuple([getattr(self, name) for name in names])

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls
