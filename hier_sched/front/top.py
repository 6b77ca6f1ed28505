"""``hier-sched top``'s screen: a pure function of a ``TopView`` and the terminal's size.

``render(view, width, height)`` gives a rich renderable that fits the box: sections (GPUs, the
queue, running jobs, recent events) share the rows by need, a section's title saying how many
rows did not fit when the screen is too small; columns are dropped, least useful first, when it
is narrow; a wait reason wraps onto a few lines of its column, and other long text ends in an
ellipsis. Durations are wall-clock, with the emulated time beside them on an emulated cluster
(``hier_sched.front.durations``). ``plain_text(view)`` is the same content for a pipe or a log:
every row, no colour, no escape codes. The data contract is in ``hier_sched.front.top_view``.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.console import Console, Group, RenderableType
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from hier_sched.core.scheduler_queries import USABLE_NOTE
from hier_sched.front.durations import clocks_note, span
from hier_sched.front.top_view import Event, JobRow, TeamQueue, TopView

__all__ = ["render", "plain_text", "GpuLine", "gpu_lines"]

_KIND_STYLE = {"oom": "bold red", "failed": "red", "recovery": "green", "checkpoint": "cyan",
               "preemption": "yellow", "requeue": "yellow", "cancelled": "magenta"}
_USED, _RESERVED, _FREE = "█", "▒", "·"
_MOST_LINES = 5  # the most lines a cell's text wraps onto (``_Column.lines``)


# ------------------------------------------------------------------------------ data -> lines
@dataclass(frozen=True, slots=True)
class GpuLine:
    """One GPU as the screen shows it (``None``: the scheduler did not say)."""

    node: str
    index: int
    total_mib: float | None
    used_mib: float | None
    reserved_mib: float | None
    smact: float | None
    power_w: float | None
    jobs: tuple[str, ...] = field(default=())


def gpu_lines(view: TopView) -> list[GpuLine]:
    """Per GPU, from ``gpu_detail`` when the node sends it, else from its free MiB and SMACT risk."""
    from hier_sched.core.gpu_types import gpu_type

    on_gpu: dict[tuple[str, int], list[str]] = {}
    for j in view.jobs:
        if j.state in ("running", "checkpointing") and j.node and isinstance(j.gpus, list):
            for i in j.gpus:
                on_gpu.setdefault((j.node, i), []).append(j.job_id)
    lines = []
    for n in view.cluster.nodes:
        if n.gpu_detail is not None:
            lines += [GpuLine(n.node, g.index, g.total_mib, g.used_mib, g.reserved_mib, g.smact, g.power_w,
                              tuple(g.residents) or tuple(on_gpu.get((n.node, g.index), ())))
                      for g in n.gpu_detail]
            continue
        try:
            total = float(gpu_type(n.gpu_type).memory_mib)
        except ValueError:  # a type this version does not know: no bar, numbers only
            total = None
        for i in range(max(n.gpus, len(n.free_mib))):
            free = n.free_mib[i] if i < len(n.free_mib) else None
            used = total - free if total is not None and free is not None else None
            smact = n.smact_risk[i] if i < len(n.smact_risk) else None
            lines.append(GpuLine(n.node, i, total, used, None, smact, None, tuple(on_gpu.get((n.node, i), ()))))
    return lines


def _queued(view: TopView) -> list[JobRow]:
    """In the order the scheduler takes them: the recovery queue first, then by arrival; the jobs
    whose estimate is still being made (``estimating``) after them."""
    waiting = [j for j in view.jobs if j.state in ("queued", "estimating")]
    return sorted(waiting, key=lambda j: (j.state == "estimating", not j.in_recovery, j.submit_time))


def _running(view: TopView) -> list[JobRow]:
    return sorted((j for j in view.jobs if j.state in ("running", "checkpointing")),
                  key=lambda j: (j.node or "", j.gpus if isinstance(j.gpus, list) else [], j.job_id))


# ------------------------------------------------------------------------------ formatting
def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def memory_bar(g: GpuLine, width: int) -> Text:
    """█ in use, ▒ reserved by the scheduler beyond what is in use, · free."""
    if g.total_mib is None or g.used_mib is None or width <= 0:
        return Text("?".center(max(width, 1)), style="dim")
    used = min(width, round(width * g.used_mib / g.total_mib))
    held = min(width, round(width * max(g.reserved_mib or 0.0, g.used_mib) / g.total_mib))
    bar = Text()
    bar.append(_USED * used, style="blue" if g.used_mib < 0.9 * g.total_mib else "bold red")
    bar.append(_RESERVED * (held - used), style="yellow")
    bar.append(_FREE * (width - held), style="dim")
    return bar


def _progress_bar(fraction: float, width: int) -> Text:
    fraction = min(max(fraction, 0.0), 1.0)
    done = round(width * fraction)
    bar = Text(_USED * done, style="green")
    bar.append(_FREE * (width - done), style="dim")
    return bar


# ------------------------------------------------------------------------------ columns
@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    width: int  # the fewest cells it is shown in (longer text ends in an ellipsis)
    keep: int  # lower goes first when the screen is narrow
    flex: int = 0  # share of the room left over; 0: as wide as its content, up to ``most``
    most: int | None = None  # the most cells it takes (default: ``width``)
    right: bool = False
    lines: int = 1  # the most lines a cell's text may wrap onto (the rest ends in an ellipsis)


Rows = list[list[RenderableType]]


def _cells(value: RenderableType) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


def _widths(columns: Sequence[_Column], rows: Rows) -> list[int]:
    """Each column as wide as its header and content, between its ``width`` and ``most``."""
    out = []
    for i, c in enumerate(columns):
        natural = max([cell_len(c.header)] + [_cells(r[i]) for r in rows])
        out.append(max(c.width, min(natural, c.most or c.width)))
    return out


def _fit(columns: Sequence[_Column], widths: Sequence[int], width: int) -> list[int]:
    """Indexes of the columns that fit in ``width`` (one space between columns)."""
    kept = list(range(len(columns)))
    while len(kept) > 1 and sum(widths[i] for i in kept) + len(kept) - 1 > width:
        kept.remove(min(kept, key=lambda i: (columns[i].keep, -i)))
    return kept


def _layout(columns: Sequence[_Column], rows: Rows, width: int) -> dict[int, int]:
    """The columns shown in ``width`` cells, in order, with their widths: each as wide as its
    header and content (``_widths``), the flexible ones sharing the room left by their ``flex``."""
    widths = _widths(columns, rows)
    kept = _fit(columns, widths, width)
    shown = {i: widths[i] for i in kept}
    flexible = [i for i in kept if columns[i].flex]
    room = width - (len(kept) - 1) - sum(widths[i] for i in kept if not columns[i].flex)
    shares = sum(columns[i].flex for i in flexible)
    for i in flexible:
        c = columns[i]
        share = room * c.flex // shares if shares > c.flex else room  # the last one takes what is left
        shown[i] = max(c.width, min(share, c.most or share))
        room, shares = room - shown[i], shares - c.flex
    return shown


def _wrap(text: str, width: int, lines: int) -> list[str]:
    """``text`` on at most ``lines`` lines of ``width`` cells, the last cut with an ellipsis."""
    wrapped = textwrap.wrap(text, width) or [""]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines - 1] + [textwrap.shorten(" ".join(wrapped[lines - 1:]), width, placeholder="…")]
    return wrapped


def _wrapped_rows(columns: Sequence[_Column], rows: Rows, shown: dict[int, int], lines: int) -> Rows:
    """The rows with the text of each column that may take several lines wrapped to its width,
    onto ``lines`` lines at most."""
    multi = [i for i in shown if columns[i].lines > 1 and lines > 1]
    if not multi:
        return list(rows)
    out = []
    for row in rows:
        row = list(row)
        for i in multi:
            if isinstance(row[i], str):
                row[i] = "\n".join(_wrap(row[i], shown[i], min(lines, columns[i].lines)))
        out.append(row)
    return out


def _heights(columns: Sequence[_Column], rows: Rows, width: int, lines: int) -> list[int]:
    """How many lines each row takes on a ``width``-cell screen (``lines`` at most)."""
    return [1 + max((v.count("\n") for v in row if isinstance(v, str)), default=0)
            for row in _wrapped_rows(columns, rows, _layout(columns, rows, width), lines)]


def _table(columns: Sequence[_Column], rows: Rows, width: int | None, lines: int = 1) -> Table:
    """The rows under the ``columns`` that fit ``width``, a cell on ``lines`` lines at most
    (``width`` None: plain text, every column, wrapped)."""
    table = Table(box=None if width is not None else box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                  show_edge=False, expand=False, header_style="bold", collapse_padding=True)
    if width is None:
        for c in columns:
            table.add_column(c.header, overflow="fold", justify="right" if c.right else "left")
        for row in rows:
            table.add_row(*map(_as_text, row))
        return table
    shown = _layout(columns, rows, width)
    for i, cells in shown.items():
        c = columns[i]
        table.add_column(c.header, no_wrap=True, overflow="ellipsis", width=cells,
                         justify="right" if c.right else "left")
    for row in _wrapped_rows(columns, rows, shown, lines):
        table.add_row(*(_as_text(row[i]) for i in shown))
    return table


def _as_text(value: RenderableType) -> RenderableType:
    """A cell as written: a string is text, never markup (a reason's "pip: [transformers]")."""
    return Text(value) if isinstance(value, str) else value


# ------------------------------------------------------------------------------ sections
@dataclass
class _Section:
    title: Text
    items: list
    cells: Callable[[list, int | None], tuple[list[_Column], Rows]]  # (items, width; None: plain text) -> columns, rows
    legend: str = ""  # after the title, on a terminal only

    def build(self, items: list, width: int | None, lines: int = 1) -> Table:
        return _table(*self.cells(items, width), width, lines)

    def heights(self, width: int, lines: int) -> list[int]:
        """The lines each item takes on a ``width``-cell screen, a cell on ``lines`` at most."""
        return _heights(*self.cells(self.items, width), width, lines) if self.items else []


def _times_legend(view: TopView, rows: list) -> str:
    """What the times of a section's rows mean, where there are rows and time is emulated."""
    note = clocks_note(view.cluster.time_scale)
    return f"   {note}" if note and rows else ""


def _gpu_section(view: TopView) -> _Section:
    lines = gpu_lines(view)
    idle = sum(1 for g in lines if not g.jobs)
    title = Text.assemble(("GPUs ", "bold"), f"{len(lines)} on {len(view.cluster.nodes)} node(s), {idle} idle")

    def cells(items: list[GpuLine], width: int | None) -> tuple[list[_Column], Rows]:
        bar_w = 0 if width is None else max(8, min(30, (width - 40) // 2))
        columns = [_Column("node", 4, 9, most=12), _Column("gpu", 3, 10, right=True),
                   _Column("memory", bar_w, 8), _Column("used/res/total GiB", 18, 7),
                   _Column("SMACT", 5, 6, right=True), _Column("power", 5, 4, right=True),
                   _Column("jobs", 8, 5, flex=1)]
        if width is None:  # plain text: numbers, no bar
            columns[2:3] = []
        rows, last_node = [], None
        for g in items:
            node = g.node if g.node != last_node else ""
            last_node = g.node
            mem = f"{_gib(g.used_mib)}/{_gib(g.reserved_mib)}/{_gib(g.total_mib)}"
            smact = "-" if g.smact is None else f"{g.smact:.0%}"
            smact_text = Text(smact, style="bold red" if g.smact is not None and g.smact > 0.9 else "")
            power = "-" if g.power_w is None else f"{g.power_w:.0f}W"
            row = [node, str(g.index)] + ([memory_bar(g, bar_w)] if width is not None else [])
            rows.append(row + [mem, smact_text, power, ", ".join(g.jobs) or Text("idle", style="dim")])
        return columns, rows

    return _Section(title, lines, cells, legend=f"   {_USED} in use  {_RESERVED} reserved  {_FREE} free")


def short_reason(reason: str) -> str:
    """A wait reason without "waiting: " and the reserve's explanation (``hier-sched status``
    gives the whole sentence)."""
    reason = reason.removeprefix("waiting: ") or "queued"
    return re.sub(rf"; {re.escape(USABLE_NOTE)} [^)]*\)", ")", reason)


def _queue_section(view: TopView) -> _Section:
    queued = _queued(view)
    recovery = sum(1 for j in queued if j.in_recovery)
    estimating = sum(1 for j in queued if j.state == "estimating")
    title = Text.assemble(("Queue ", "bold"), f"{len(queued)} waiting: main {len(queued) - recovery - estimating}, ",
                          (f"recovery {recovery}", "yellow" if recovery else ""),
                          f", estimating {estimating}" if estimating else "")
    scale = view.cluster.time_scale

    def cells(items: list[JobRow], width: int | None) -> tuple[list[_Column], Rows]:
        # ids are "<name>-<8 hex>": a name column would repeat them, and the reason needs the room
        named = not all(j.job_id.startswith(f"{j.name}-") for j in items)
        # the reason takes the room left and wraps onto a few lines (_MOST_LINES): the
        # scheduler's own words, whole at 100 columns (``status`` adds the reserve's explanation)
        columns = [_Column("job", 6, 10, most=28), _Column("queue", 5, 8), _Column("waited", 6, 7, most=12, right=True),
                   _Column("gpus", 4, 5, right=True), _Column("est GiB", 7, 4, right=True),
                   *[_Column("name", 10, 6, flex=1, most=24)] * named,
                   _Column("why it waits", 16, 9, flex=3, lines=_MOST_LINES)]
        rows = []
        for j in items:
            team = j.queue if j.queue and j.queue != "default" else "main"
            queue = (Text("estim", style="cyan") if j.state == "estimating" else
                     Text("recov", style="yellow") if j.in_recovery else Text(team))
            rows.append([j.job_id, queue, span(view.now - j.submit_time, scale), str(j.gpu_count),
                         _gib(j.estimate_mib), *[j.name] * named, short_reason(j.reason)])
        return columns, rows

    return _Section(title, queued, cells, legend=_times_legend(view, queued))


def _team_queue_section(view: TopView) -> _Section:
    """Each team queue: what it holds against its fair share and nominal quota, and its waiting
    jobs (no rows without a queue configuration)."""
    teams = view.cluster.queues
    title = Text.assemble(("Team queues ", "bold"), f"{len(teams)}")

    def amount(gpus: float | None, mib: float | None) -> str:
        parts = ([] if gpus is None else [f"{gpus:g}"]) + ([] if mib is None else [f"{_gib(mib)} GiB"])
        return " + ".join(parts) or "-"

    def cells(items: list[TeamQueue], width: int | None) -> tuple[list[_Column], Rows]:
        columns = [_Column("queue", 5, 10, most=20), _Column("used GPUs", 9, 6, right=True),
                   _Column("fair share", 10, 7, right=True), _Column("nominal", 7, 8, right=True),
                   _Column("borrowed", 8, 9, right=True), _Column("waiting", 7, 5, right=True)]
        rows = []
        for q in items:
            over = q.fair_share_gpus is not None and q.used_gpus > q.fair_share_gpus + 1e-6
            rows.append([q.name, Text(f"{q.used_gpus:g}", style="yellow" if over else ""),
                         amount(q.fair_share_gpus, q.fair_share_mib), amount(q.nominal_gpus, q.nominal_mib),
                         "-" if q.borrowed_gpus is None else f"{q.borrowed_gpus:g}", str(q.waiting)])
        return columns, rows

    return _Section(title, teams, cells, legend="   GPUs; yellow: holds more than its fair share" if teams else "")


def _running_section(view: TopView) -> _Section:
    running = _running(view)
    title = Text.assemble(("Running ", "bold"), f"{len(running)} job(s)")
    scale = view.cluster.time_scale

    def cells(items: list[JobRow], width: int | None) -> tuple[list[_Column], Rows]:
        columns = [_Column("job", 6, 10, most=22), _Column("where", 7, 8, most=16), _Column("progress", 14, 9),
                   _Column("slot left", 9, 6, most=12, right=True), _Column("est/peak GiB", 12, 5, right=True),
                   _Column("OOM", 3, 3, right=True), _Column("name", 10, 7, flex=1)]
        rows = []
        for j in items:
            where = f"{j.node or '?'}:{','.join(map(str, j.gpus))}" if isinstance(j.gpus, list) else (j.node or "?")
            since = j.run_start_time or j.start_time
            if j.state == "checkpointing":
                progress = Text("checkpointing", style="cyan")
            elif j.progress is not None:
                progress = (_progress_bar(j.progress, 8) + Text(f" {j.progress:4.0%}")) if width is not None \
                    else Text(f"{j.progress:.0%}")
            else:
                progress = Text(f"up {span(view.now - since, scale) if since else '-'}")
            slot = Text(span(j.slot_left_s, scale),
                        style="yellow" if j.slot_left_s is not None and j.slot_left_s < 600 else "")
            oom = Text(str(j.oom_crashes), style="red" if j.oom_crashes else "dim")
            rows.append([j.job_id, where, progress, slot, f"{_gib(j.estimate_mib)}/{_gib(j.observed_peak_mib)}", oom,
                         j.name])
        return columns, rows

    return _Section(title, running, cells, legend=_times_legend(view, running))


def _events_section(view: TopView) -> _Section:
    recent = list(reversed(view.events))  # newest first
    scale = view.cluster.time_scale

    def cells(items: list[Event], width: int | None) -> tuple[list[_Column], Rows]:
        columns = [_Column("ago", 5, 9, most=12, right=True), _Column("job", 6, 8, most=22), _Column("event", 10, 10),
                   _Column("what happened", 16, 7, flex=1)]
        rows = [[span(view.now - e.t, scale), e.job_id, Text(e.kind, style=_KIND_STYLE.get(e.kind, "")), e.text]
                for e in items]
        return columns, rows

    return _Section(Text.assemble(("Recent events ", "bold"), f"{len(recent)}"), recent, cells,
                    legend=_times_legend(view, recent))


def _header(view: TopView) -> Text:
    c = view.cluster
    gpus = sum(max(n.gpus, len(n.free_mib)) for n in c.nodes)
    running = sum(1 for j in view.jobs if j.state in ("running", "checkpointing"))
    queued = sum(1 for j in view.jobs if j.state == "queued")
    estimating = sum(1 for j in view.jobs if j.state == "estimating")
    text = Text.assemble(("hier_sched top", "bold reverse"), " ")
    if view.error:  # first, so that a narrow screen cannot cut it off; the rest is the last good view
        text.append(f"scheduler unreachable: {view.error} · last view: ", style="bold red")
    text.append(f"{running} running · {queued} queued · " + (f"{estimating} estimating · " if estimating else "")
                + f"{len(c.nodes)} node(s), {gpus} GPU(s) · "
                f"policy {c.policy} · estimator {c.estimator} · time x{c.time_scale:g}")
    if c.drains:  # these nodes take no new job
        text.append(" · " + ", ".join(f"{d.node} {d.state}" for d in c.drains), style="yellow")
    return text


def _sections(view: TopView) -> list[_Section]:
    sections = [_gpu_section(view), _running_section(view), _queue_section(view), _events_section(view)]
    if view.cluster.queues:
        sections.insert(3, _team_queue_section(view))
    return sections


def _share_rows(heights: list[list[int]], budget: int) -> list[int]:
    """How many items of each section fit in ``budget`` lines, given the lines each item takes
    (``heights``, sections in order of importance): the first section (the GPUs, a line each) up
    to half the screen, then one item of each at a time while lines last. A section's first item
    brings its column header, a line more."""
    given = [0] * len(heights)
    if heights and heights[0] and budget >= 2:
        given[0] = min(len(heights[0]), budget // 2 - 1)
        budget -= given[0] + 1 if given[0] else 0
    progressed = True
    while budget > 0 and progressed:
        progressed = False
        for i, lines in enumerate(heights):
            if given[i] < len(lines):
                cost = lines[given[i]] + (given[i] == 0)
                if cost <= budget:
                    given[i] += 1
                    budget -= cost
                    progressed = True
    return given


# ------------------------------------------------------------------------------ entry points
def render(view: TopView, width: int, height: int, footer: str = "q quits") -> RenderableType:
    """The screen for a ``width`` x ``height`` terminal; ``footer`` is its last line (key hints), if any."""
    sections = _sections(view)
    fixed = 1 + len(sections) + bool(footer)  # the header, a title line per section, the footer
    # Long text (a wait reason) wraps onto up to _MOST_LINES lines, fewer where that would leave a
    # section with no room for a single row.
    for lines in range(_MOST_LINES, 0, -1):
        rows = _share_rows([s.heights(width, lines) for s in sections], max(0, height - fixed))
        if all(n or not s.items for s, n in zip(sections, rows)):
            break
    parts: list[RenderableType] = [_header(view)]
    for s, n in zip(sections, rows):
        title = s.title.copy()
        if n < len(s.items):  # the title, always on screen, says what did not fit
            title.append(f"  ({n} shown, {len(s.items) - n} more)" if n else "  (no room to list them)", style="dim")
        title.append(s.legend, style="dim")
        parts.append(title)
        if n:
            parts.append(s.build(s.items[:n], width, lines))
    if footer:
        parts.append(Text(footer, style="dim"))
    for p in parts:
        if isinstance(p, Text):
            p.no_wrap, p.overflow = True, "ellipsis"
    return Group(*parts)


def plain_text(view: TopView, width: int = 160) -> str:
    """Every row, no colour and no escape codes: for a pipe, a file or a CI log."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False, highlight=False,
                      emoji=False, legacy_windows=False)
    console.print(_header(view))
    for s in _sections(view):
        console.print()
        console.print(s.title)
        if s.items:
            console.print(s.build(s.items, None))
    return out.getvalue()
