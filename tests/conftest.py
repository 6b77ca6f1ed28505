"""What every test may use: ``ROOT``, the repository; and the marks of the tests that start Ray.

The session's scheduler state directory (``HIER_SCHED_STATE_DIR``) is a fresh temporary one, unless
the caller set one: what a user's own clusters left in ``~/.hier_sched`` (baselines their nodes
measured, learned peaks, traced jobs) must not change what the tests see.

Everything under ``tests/ray_clusters/`` starts a local Ray cluster, so it is marked ``ray`` and ``slow``
here (a file dropped there cannot forget it) and may take ``RAY_CLUSTER_TIMEOUT_S`` unless it says
otherwise: a module's cluster comes up in its fixture, which pytest-timeout counts against the
module's first test. The Ray-free tests of the shells are under ``tests/shells/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_CLUSTERS = ROOT / "tests" / "ray_clusters"
RAY_CLUSTER_TIMEOUT_S = 900


_STATE_DIR_ENV = "HIER_SCHED_STATE_DIR"
_own_state_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _own_state_dir
    if _STATE_DIR_ENV not in os.environ:
        _own_state_dir = os.environ[_STATE_DIR_ENV] = tempfile.mkdtemp(prefix="hs-test-state-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _own_state_dir is not None:
        os.environ.pop(_STATE_DIR_ENV, None)
        shutil.rmtree(_own_state_dir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(RAY_CLUSTERS):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(RAY_CLUSTER_TIMEOUT_S))
