"""Typed messages as plain data (msgpack-able: dicts, lists, strings, numbers, bytes) and back.

``to_plain(value, kind)`` and ``from_plain(data, kind)`` follow the declared type ``kind`` — a
frozen dataclass, and whatever its fields' annotations say: tuples, lists, dicts, enums,
literals, ``X | None`` and unions of dataclasses — so a message needs no codec of its own. A union
of several dataclasses (a node's run events) travels as ``[class name, fields]``, since their
fields alone may not tell them apart.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Literal, Union

__all__ = ["to_plain", "from_plain"]


def to_plain(value: Any, kind: Any) -> Any:
    """``value`` (of declared type ``kind``) as plain data."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if value is None or kind is Any or origin is Literal:
        return value
    if origin in (Union, types.UnionType):
        member = _member_of(value, args)
        plain = to_plain(value, member)
        return [member.__name__, plain] if _tagged(args) else plain
    if dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        return {f.name: to_plain(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(kind)}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return value.value
    if origin in (tuple, list):
        return [to_plain(item, item_kind) for item, item_kind in zip(value, _item_kinds(args, len(value)))]
    if origin is dict:
        key_kind, value_kind = args
        return {to_plain(k, key_kind): to_plain(v, value_kind) for k, v in value.items()}
    return value  # str, int, float, bool, bytes, and untyped containers (dict[str, Any])


def from_plain(data: Any, kind: Any) -> Any:
    """The value of declared type ``kind`` that ``to_plain`` turned into ``data``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if data is None or kind is Any or origin is Literal:
        return data
    if origin in (Union, types.UnionType):
        if _tagged(args):
            name, fields = data
            member = next((a for a in args if getattr(a, "__name__", None) == name), None)
            if member is None:
                raise ValueError(f"{name!r} is not one of {[a.__name__ for a in args if a is not type(None)]}")
            return from_plain(fields, member)
        return from_plain(data, _member_of(data, args))
    if dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        return kind(**{f.name: from_plain(data[f.name], hints[f.name])
                       for f in dataclasses.fields(kind) if f.name in data})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if origin in (tuple, list):
        items = [from_plain(item, item_kind) for item, item_kind in zip(data, _item_kinds(args, len(data)))]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        key_kind, value_kind = args
        return {from_plain(k, key_kind): from_plain(v, value_kind) for k, v in data.items()}
    return data


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _item_kinds(args: tuple[Any, ...], length: int) -> tuple[Any, ...]:
    """Each item's type: ``tuple[X, ...]`` and ``list[X]`` repeat X; ``tuple[A, B]`` names each."""
    if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
        return (args[0],) * length
    if len(args) != length:
        raise ValueError(f"expected {len(args)} items, got {length}")
    return args


def _tagged(args: tuple[Any, ...]) -> bool:
    return sum(dataclasses.is_dataclass(a) for a in args) > 1


def _member_of(value: Any, args: tuple[Any, ...]) -> Any:
    """The member of a union that ``value`` is (``X | None``: X, an int passing for a float)."""
    members = [a for a in args if a is not type(None)]
    if len(members) == 1:
        return members[0]
    for member in members:
        if isinstance(member, type) and isinstance(value, member):
            return member
        origin = typing.get_origin(member)  # a parametrised member (tuple[int, ...]): by its origin
        if isinstance(origin, type) and isinstance(value, origin):
            return member
    raise TypeError(f"{type(value).__name__} is none of {members}")
