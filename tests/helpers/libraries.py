"""The optional libraries some tests need (timm, transformers, lightning, ...)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def field_library(name: str) -> ModuleType:
    """The library, or a skip where it is not installed; under ``./run.sh test-cuda``
    (``HIER_SCHED_FIELD_LIBS=required``), whose venv installs them all, a missing library is a
    failure, not a skip."""
    if os.environ.get("HIER_SCHED_FIELD_LIBS") == "required":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed (./run.sh test-cuda installs it)")
