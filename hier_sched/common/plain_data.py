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
import itertools
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, Union

__all__ = ["to_plain", "from_plain"]


def to_plain(value: Any, kind: Any) -> Any:
    """``value`` (of declared type ``kind``) as plain data."""
    return _encoder(kind)(value)


def from_plain(data: Any, kind: Any) -> Any:
    """The value of declared type ``kind`` that ``to_plain`` turned into ``data``."""
    return _decoder(kind)(data)


# Each type's codec is worked out once from its annotations and kept: read from the annotations
# on every call, a launch spec took ~0.15 ms each way, paid at every submission and every launch.
Codec = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


class _Lazy:
    """The codec of ``kind``, looked up on first use (a type may refer to itself) and kept."""

    __slots__ = ("kind", "codec_of", "codec")

    def __init__(self, kind: Any, codec_of: Callable[[Any], Codec]):
        self.kind, self.codec_of, self.codec = kind, codec_of, None

    def __call__(self, value: Any) -> Any:
        if self.codec is None:
            self.codec = self.codec_of(self.kind)
        return self.codec(value)


def _none_passes(codec: Codec) -> Codec:
    return lambda value: None if value is None else codec(value)


@functools.cache
def _encoder(kind: Any) -> Codec:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or origin is Literal:
        return _same
    if origin in (Union, types.UnionType):
        tagged = _tagged(args)

        def union(value: Any) -> Any:
            member = _member_of(value, args)
            plain = _encoder(member)(value)
            return [member.__name__, plain] if tagged else plain
        return _none_passes(union)
    if dataclasses.is_dataclass(kind):
        fields = _fields(kind, _encoder)
        return _none_passes(lambda value: {name: codec(getattr(value, name)) for name, codec in fields})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _none_passes(lambda value: value.value)
    if origin in (tuple, list):
        each = _each(args, _encoder)
        return _none_passes(lambda value: [codec(item) for item, codec in zip(value, each(len(value)))])
    if origin is dict:
        key, item = (_encoder(a) for a in args)
        return _none_passes(lambda value: {key(k): item(v) for k, v in value.items()})
    return _same  # str, int, float, bool, bytes, and untyped containers (dict[str, Any])


@functools.cache
def _decoder(kind: Any) -> Codec:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or origin is Literal:
        return _same
    if origin in (Union, types.UnionType):
        if _tagged(args):
            members = {a.__name__: a for a in args if a is not type(None)}

            def tagged(data: Any) -> Any:
                name, fields = data
                member = members.get(name)
                if member is None:
                    raise ValueError(f"{name!r} is not one of {list(members)}")
                return _decoder(member)(fields)
            return _none_passes(tagged)
        return _none_passes(lambda data: _decoder(_member_of(data, args))(data))
    if dataclasses.is_dataclass(kind):
        fields = _fields(kind, _decoder)
        return _none_passes(lambda data: kind(**{name: codec(data[name]) for name, codec in fields if name in data}))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _none_passes(kind)
    if origin in (tuple, list):
        each = _each(args, _decoder)

        def items(data: Any) -> list[Any]:
            return [codec(item) for item, codec in zip(data, each(len(data)))]
        return _none_passes((lambda data: tuple(items(data))) if origin is tuple else items)
    if origin is dict:
        key, item = (_decoder(a) for a in args)
        return _none_passes(lambda data: {key(k): item(v) for k, v in data.items()})
    return _same


def _fields(kind: type, codec_of: Callable[[Any], Codec]) -> list[tuple[str, _Lazy]]:
    hints = _hints(kind)
    return [(f.name, _Lazy(hints[f.name], codec_of)) for f in dataclasses.fields(kind)]


def _each(args: tuple[Any, ...], codec_of: Callable[[Any], Codec]) -> Callable[[int], Iterable[_Lazy]]:
    """The codecs of a tuple's or list's items, given its length: ``tuple[X, ...]`` and ``list[X]``
    repeat X's; ``tuple[A, B]`` names each (``_item_kinds``)."""
    if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
        codec = _Lazy(args[0], codec_of)
        return lambda length: itertools.repeat(codec, length)
    fixed = [_Lazy(a, codec_of) for a in args]

    def named(length: int) -> Iterable[_Lazy]:
        _item_kinds(args, length)  # raises on a wrong length
        return fixed
    return named


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
