"""The import rules that keep one core for two shells (README: "How the code is laid out")."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT


def imports_of(path: Path, source: str | None = None) -> set[str]:
    """Absolute module names ``path`` imports; a relative import is resolved against its package
    (``from ..global_queue import x`` in ``node_actor/a.py`` counts as ``global_queue``)."""
    package = path.relative_to(ROOT).parent.parts
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.add(node.module or "")
            else:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                names.add(".".join([*base, *([node.module] if node.module else [])]) or ".")
    return names


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", sorted((ROOT / "hier_sched" / "core").glob("*.py")), ids=lambda p: p.name)
def test_core_is_pure(path):
    """No Ray, no clock, no environment, no shell package: the simulator and the live actors
    must be able to drive it with their own clocks."""
    found = {top(n) for n in imports_of(path)}
    assert not found & {"ray", "time", "datetime", "os", "random", "subprocess"}, found
    assert not found & {"node_actor", "global_queue", "replay", "estimators", "traces"}, found


@pytest.mark.parametrize("package", ["replay", "traces", "estimators"])
def test_offline_packages_never_import_ray_or_the_live_shells(package):
    for path in (ROOT / package).rglob("*.py"):
        found = {top(n) for n in imports_of(path)}
        assert not found & {"ray", "node_actor", "global_queue"}, f"{path}: {found}"


@pytest.mark.parametrize("package, other", [("node_actor", "global_queue"), ("global_queue", "node_actor")])
def test_the_live_shells_never_import_each_other(package, other):
    """They share message types through ``hier_sched`` (``hier_sched.common.messages``), nothing else."""
    for path in (ROOT / package).rglob("*.py"):
        assert other not in {top(n) for n in imports_of(path)}, path


def test_relative_imports_are_resolved():
    """The rule above cannot be dodged with ``from ..global_queue import x``."""
    source = "from ..global_queue import actor\nfrom . import mps\n"
    assert {top(n) for n in imports_of(ROOT / "node_actor" / "probe.py", source)} == {"global_queue", "node_actor"}
