"""What every test may use: ``ROOT``, the repository; and the marks of the tests that start Ray.

Everything under ``tests/live/`` starts a local Ray cluster, so it is marked ``ray`` and ``slow``
here (a file dropped there cannot forget it) and may take ``LIVE_TIMEOUT_S`` unless it says otherwise: a module's cluster
comes up in its fixture, which pytest-timeout counts against the module's first test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "tests" / "live"
LIVE_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(LIVE):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(LIVE_TIMEOUT_S))
