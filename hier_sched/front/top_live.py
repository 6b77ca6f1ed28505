"""The terminal side of ``hier-sched top``: refresh, redraw on resize, quit on q or Ctrl-C.

Everything it draws comes from ``fetch()`` (a ``TopView`` per call) through the pure renderer
``hier_sched.front.top``. When standard output is not a terminal it prints one plain table and exits.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from hier_sched.front.top import plain_text, render
from hier_sched.front.top_view import TopView

__all__ = ["run_top"]

_KEY_POLL_S = 0.1  # how quickly q and a resized window are noticed between refreshes


def run_top(fetch: Callable[[], TopView], *, interval: float = 2.0, once: bool = False,
            stream: TextIO | None = None) -> int:
    """Show the view until q or Ctrl-C (``once``: one frame). Exit status 1 when the last view
    could not be read from the scheduler."""
    from rich.console import Console

    stream = stream or sys.stdout
    if not stream.isatty():
        view = fetch()
        if view.error:
            print(f"error: {view.error}", file=sys.stderr)
            return 1
        stream.write(plain_text(view))
        return 0
    console = Console(file=stream)
    if once:
        view = fetch()
        console.print(render(view, console.width, console.height - 1, footer=""))  # the prompt gets a line
        return 1 if view.error else 0
    return _live(fetch, interval, console)


def _live(fetch: Callable[[], TopView], interval: float, console) -> int:
    from rich.live import Live

    footer = f"q quits · every {interval:g} s"
    view = None
    try:
        with _keys() as key, Live(console=console, screen=True, auto_refresh=False) as live:
            due = 0.0
            drawn_at = None
            while True:
                if time.monotonic() >= due:
                    view = fetch()
                    due = time.monotonic() + interval
                    drawn_at = None
                size = console.size
                if drawn_at != size:
                    live.update(render(view, size.width, size.height, footer=footer), refresh=True)
                    drawn_at = size
                if key(_KEY_POLL_S) in ("q", "Q"):
                    break
    except KeyboardInterrupt:
        pass
    return 1 if view is not None and view.error else 0


@contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """``key(timeout)``: the key pressed within ``timeout`` s, or None. Keys are read one at a
    time without echo (cbreak); Ctrl-C still interrupts. Without a terminal on stdin: no keys."""
    if not sys.stdin.isatty():
        yield lambda timeout: time.sleep(timeout)
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def key(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
