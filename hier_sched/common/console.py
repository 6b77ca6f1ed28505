"""The one way our commands make a rich console, and show progress on long work.

When the output is a file, a pipe or a CI log, rich would assume 80 columns and fold every
name in a table; there the console is 120 columns wide instead. Progress bars go to stderr and
only to a terminal: a log gets no escape codes and no bar frames.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["console", "progress", "Update"]

# update(done, total=None): how far the work is; total None keeps the last known total.
Update = Callable[..., None]


def console(*, stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


def _ignore(done: float, total: float | None = None) -> None:
    pass


@contextmanager
def progress(label: str, total: float | None = None, *, unit: str = "", enabled: bool = True) -> Iterator[Update]:
    """A transient progress bar on stderr for the block: yields ``update(done, total=None)``.

    ``total`` None shows a pulsing bar and the elapsed time until a total is known. Nothing is
    drawn when ``enabled`` is false or stderr is not a terminal (the yielded update does nothing)."""
    if not enabled or not sys.stderr.isatty():
        yield _ignore
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    # a long label (a synthetic trace's query string) is cut, not the counts beside it
    label_column = TextColumn("[progress.description]{task.description}",
                              table_column=Column(max_width=48, no_wrap=True, overflow="ellipsis"))
    bar = Progress(SpinnerColumn(), label_column, BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                   TimeElapsedColumn(), console=console(stderr=True), transient=True)
    task = bar.add_task(label, total=total)

    def update(done: float, total: float | None = None) -> None:
        bar.update(task, completed=done, **({"total": total} if total is not None else {}))

    with bar:
        yield update
