"""The import rules that keep one core for two shells (README: "How the code is laid out").

The floors, from the bottom: the core (pure), the shared floor (``hier_sched.common``) and beside it
the device model (``hier_sched.device``: the emulated GPU, which the core's decisions never use), the two
libraries (``traces``, ``estimators``), the three shells (``global_queue``, ``node_actor``,
``replay``) and the front door (``hier_sched.front``). A module imports its own package and the
floors below it, never a package beside it on its own floor; imports inside functions count too.
"""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

import hier_sched

# Longest prefix wins. The root package counts as the front door: it re-exports the client.
FLOOR = {"hier_sched.core": 0, "hier_sched.common": 1, "hier_sched.device": 1, "traces": 2, "estimators": 2,
         "global_queue": 3, "node_actor": 3, "replay": 3, "hier_sched.front": 4, "hier_sched": 4}
FLOOR_NAMES = ["the core", "the shared floor or the device model", "a library", "a shell", "the front door"]
PACKAGES = sorted({package.split(".")[0] for package in FLOOR})
ROOT_INIT = ROOT / "hier_sched" / "__init__.py"
MODULES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if p != ROOT_INIT)


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


def package_of(module: str) -> str | None:
    """The floor's package ``module`` belongs to (a key of FLOOR), or None when it is not ours."""
    return max((p for p in FLOOR if module == p or module.startswith(p + ".")), key=len, default=None)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def ours(path: Path) -> set[str]:
    return {name for name in imports_of(path) if package_of(name) is not None}


def test_root_holds_only___init__():
    """Every module of hier_sched lives on a floor; only the package's lazy re-exports are at its root."""
    assert sorted(p.name for p in (ROOT / "hier_sched").glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_floors_below(path):
    own = package_of(module_name(path))
    for name in ours(path):
        other = package_of(name)
        allowed = other == own or FLOOR[other] < FLOOR[own] or own == "hier_sched.front"
        assert allowed, f"{own} ({FLOOR_NAMES[FLOOR[own]]}) imports {name} ({FLOOR_NAMES[FLOOR[other]]})"


def test_nothing_imports_the_front_door():
    """Only ``hier_sched/__init__.py`` names the front door, by module-path strings and without an
    import of its own: ``import hier_sched`` stays light and is no way around the rule."""
    front = ROOT / "hier_sched" / "front"
    below = {str(p.relative_to(ROOT)): sorted(n for n in ours(p) if package_of(n) in ("hier_sched.front", "hier_sched"))
             for p in MODULES if not p.is_relative_to(front)}
    assert {p: names for p, names in below.items() if names} == {}
    assert not ours(ROOT_INIT)
    for name, module in hier_sched._EXPORTS.items():
        assert package_of(module) in ("hier_sched.core", "hier_sched.common", "hier_sched.front"), (name, module)


def test_every_public_name_resolves():
    """The re-exports name modules by strings: a move that forgets one shows here, not in a user's code."""
    for name in hier_sched.__all__:
        assert getattr(hier_sched, name) is not None, name


@pytest.mark.parametrize("path", sorted((ROOT / "hier_sched" / "core").rglob("*.py")), ids=lambda p: p.name)
def test_core_is_pure(path):
    """No Ray, no clock, no environment, no files: the simulator and the live actors must be able
    to drive it with their own clocks, and every shell does its own I/O (spec files are read by
    ``hier_sched.common.spec_files``)."""
    found = {top(n) for n in imports_of(path)}
    assert not found & {"ray", "time", "datetime", "os", "random", "subprocess", "pathlib", "io", "json", "tomllib",
                        "yaml"}, found
    opens = [n.lineno for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"]
    assert not opens, f"open() at lines {opens}"


CORE_FILES = sorted((ROOT / "hier_sched" / "core").rglob("*.py"))
MODULE_MAX_LINES, CLASS_MAX_LINES = 500, 300


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_each_part_of_the_core_reads_in_one_sitting(path):
    """No module of the core over 500 lines and no class over 300: each part has one job, small
    enough to read at once (the scheduler is its parts, wired together: ``core/scheduler.py``)."""
    source = path.read_text()
    assert source.count("\n") <= MODULE_MAX_LINES
    big = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(ast.parse(source))
           if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > CLASS_MAX_LINES}
    assert not big


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_no_rule_asks_whether_team_queues_exist(path):
    """Team queues are a part that is always there (``team_queue_part``: one open queue when none
    is configured), so no rule branches on whether quotas exist."""
    source = path.read_text()
    assert "quotas is None" not in source and "quotas is not None" not in source


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_the_cores_decisions_never_import_the_device_model(path):
    """The emulated GPU (``hier_sched.device``) is what the simulator and the emulated node run jobs
    on, not a scheduling rule: the core never imports it."""
    assert not [n for n in ours(path) if package_of(n) == "hier_sched.device"]


def test_the_device_model_rule_is_checked():
    source = "from hier_sched.device.gpu_model import EmulatedGpu\n"
    assert [n for n in imports_of(ROOT / "hier_sched" / "core" / "probe.py", source)
            if package_of(n) == "hier_sched.device"] == ["hier_sched.device.gpu_model"]


@pytest.mark.parametrize("package", ["replay", "traces", "estimators"])
def test_offline_packages_never_import_ray(package):
    for path in (ROOT / package).rglob("*.py"):
        assert "ray" not in {top(n) for n in imports_of(path)}, path


def test_the_node_actors_never_validate_a_spec_again():
    """A spec is validated once, at submission; a launch order carries its ``LaunchSpec``."""
    for path in (ROOT / "node_actor").rglob("*.py"):
        assert "hier_sched.core.spec" not in imports_of(path), path


@pytest.mark.parametrize("path", sorted((ROOT / "global_queue").rglob("*.py")), ids=lambda p: p.name)
def test_the_queue_imports_no_code_by_name(path):
    """The queue never imports a job's code (a model factory is built where the job's code lives:
    ``estimators.job_estimate``, in a Ray task or the submitting process), so it imports nothing by a
    name it is given: no ``importlib`` and no ``__import__``."""
    tree = ast.parse(path.read_text())
    assert "importlib" not in {top(n) for n in imports_of(path)}
    calls = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "__import__"]
    assert not calls, f"__import__ at lines {calls}"


def test_relative_imports_are_resolved():
    """The rules above cannot be dodged with ``from ..global_queue import x``."""
    source = "from ..global_queue import actor\nfrom . import mps\n"
    assert {top(n) for n in imports_of(ROOT / "node_actor" / "probe.py", source)} == {"global_queue", "node_actor"}


# What the core's ``Scheduler`` keeps to itself: a shell reads it through the query API
# (``knows``, ``view``, ``views``, ``state_of``, ``status``, ``counts``, ...) and ``JobView``.
SCHEDULER_INTERNALS = {"jobs", "queue", "job_queue", "nodes", "intake", "lifecycle", "ledger", "teams", "unconfirmed",
                       "unshown_launches", "waiting", "cycles", "ended", "rr_cursor", "peaks", "runtimes"}


def scheduler_internals_read(path: Path, source: str | None = None) -> list[str]:
    """``<...>scheduler.<internal>`` reads and imports of ``ManagedJob`` in ``path``, as "line: what"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Attribute) and (node.attr in SCHEDULER_INTERNALS or node.attr.startswith("_")):
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if name == "scheduler":
                found.append(f"{node.lineno}: scheduler.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and any(a.name == "ManagedJob" for a in node.names):
            found.append(f"{node.lineno}: imports ManagedJob")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


@pytest.mark.parametrize("path", [p for p in MODULES if package_of(module_name(p)) != "hier_sched.core"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shell_reads_the_schedulers_internals(path):
    assert not scheduler_internals_read(path)


def test_reading_the_schedulers_internals_is_found():
    source = ("from hier_sched.core.managed_job import ManagedJob\nn = len(self.scheduler.queue)\n"
              "scheduler._order\nself.scheduler.view('a')\n")
    assert scheduler_internals_read(ROOT / "global_queue" / "probe.py", source) == [
        "1: imports ManagedJob", "2: scheduler.queue", "3: scheduler._order"]
