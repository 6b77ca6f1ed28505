"""The one way our commands make a rich console.

When the output is a file, a pipe or a CI log, rich would assume 80 columns and fold every
name in a table; there the console is 120 columns wide instead.
"""

from __future__ import annotations

import sys

__all__ = ["console"]


def console(*, stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)
