"""Job specs and queue configurations from files: TOML or JSON by suffix, anything else YAML;
validated by the core's ``parse_spec`` and ``parse_queues``.

Reading and decoding live here because the core does no I/O. Whatever the file holds, the answer
is a ``JobSpec`` or a ``SpecError`` naming the file: unreadable, not UTF-8, not valid YAML, TOML or
JSON (nested too deeply included), or a key given twice (the stock decoders keep the last value).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

from hier_sched.core.queues_spec import parse_queues
from hier_sched.core.quotas import QueueSetup
from hier_sched.core.spec import JobSpec, SpecError, parse_spec

__all__ = ["load_spec", "load_queues"]


def load_spec(path: str | Path) -> JobSpec:
    """Load a spec file (.yaml/.yml, .toml or .json), UTF-8 (a byte-order mark is allowed)."""
    data = _load(Path(path))
    return parse_spec(data if data is not None else {}, source=str(path))


def load_queues(path: str | Path) -> QueueSetup:
    """Load a queue configuration file (``hier-sched queues apply``; the same formats)."""
    return parse_queues(_load(Path(path)), source=str(path))


def _load(p: Path) -> Any:
    """The file's decoded content, or a ``SpecError`` naming the file."""
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError([f"cannot read file: {exc.strerror or exc}"], str(p)) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError([f"line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"], str(p)) from None
    kind = p.suffix.lstrip(".") or "YAML"
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_no_repeated_keys)
        else:
            data = yaml.load(text, Loader=_SpecYamlLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise SpecError([f"not valid {kind}: nested too deeply"], str(p)) from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: the decoders' errors, numbers too long
        raise SpecError([f"not valid {kind}: {exc}"], str(p)) from None
    return data


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose key is given twice is refused: one of the two values would be lost."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key!r} given twice")
        data[key] = value
    return data


class _SpecYamlLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a mapping key given twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"key {key!r} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)
