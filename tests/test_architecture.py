"""The import rules that keep one core for two shells (README: "How the code is laid out")."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
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


def test_live_shells_do_not_import_each_other_the_wrong_way():
    for path in (ROOT / "node_actor").rglob("*.py"):
        assert "global_queue" not in {top(n) for n in imports_of(path)}, path
