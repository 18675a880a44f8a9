"""nvidia-smi-style tables from the run's readings: pure functions, no I/O.

:func:`render` turns :class:`~tpu_info.views.values.TargetView` s (plus the local
:class:`~tpu_info.contract.model.LocalScan` and a :class:`~tpu_info.views.values.Header`)
into one rich renderable: a header, then Devices, Processes, Compilation,
Transfers and Findings. Each table is a list of ``(column, getter)`` pairs
over the rows of :mod:`tpu_info.views.derived`, which decides every value and
every N/A's reason (:func:`reasons` lists them, for ``doctor``); how the
columns fit the terminal is :mod:`tpu_info.outputs.table_layout`'s (each
column's role, applied for the width the console renders at). Output fits 80
columns and grows to use 160; HBM used and busy % are coloured by level
(:func:`~tpu_info.outputs.table_layout.level_style`). :func:`render_text` prints it to a string;
:func:`to_json` (from :mod:`tpu_info.outputs.jsonview`) is the ``--json`` form.

Example:
    >>> from tpu_info.contract.model import Snapshot, ProcessRecord
    >>> v = TargetView("127.0.0.1:8431",
    ...                Snapshot(10.0, ProcessRecord(pid=7, name="[red]x[/red]")))
    >>> h = Header(host="h", time_unix=0.0, tz=__import__("datetime").timezone.utc)
    >>> "[red]x[/red]" in render_text([v], header=h)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from io import StringIO
from typing import TypeVar

from rich.console import Console, Group, RenderableType
from rich.text import Text

from tpu_info.contract.model import LocalScan
from tpu_info.net.targets import label
from tpu_info.outputs.jsonview import JSON_SCHEMA, SCHEMA, to_json
from tpu_info.outputs.table_layout import (
    BAR_CELLS,
    BUSY_LEVELS,
    HBM_LEVELS,
    WIDE,
    Alt,
    Cell,
    Col,
    bar,
    na,
    percent_text,
    table,
)
from tpu_info.views.derived import (
    Derived,
    DeviceRow,
    FindingLine,
    GraphRow,
    ProcessRow,
    RunReadings,
    TransferRow,
    blind_spot_lines,
    hooked_lines,
    readings,
)
from tpu_info.views.values import (
    NA,
    Header,
    Reasons,
    TargetView,
    clean,
    format_bytes,
    format_gib_pair,
    format_ns,
    format_percent,
    format_uptime,
)

__all__ = ["Header", "JSON_SCHEMA", "SCHEMA", "TargetView", "blind_spot_lines", "hooked_lines",
           "reasons", "render", "render_text", "to_json"]

R = TypeVar("R")
Columns = list[tuple[Col, Callable[[R], Cell]]]


def show(d: Derived, fmt: Callable = str) -> Text | str:  # type: ignore[type-arg]
    """A value as a cell: ``fmt(value)``, a dim N/A, or ``-`` where it does not apply."""
    if d.value is not None:
        return fmt(d.value)
    return na() if d.reason else Text("-")


def _rows(columns: Columns[R], items: Sequence[R]) -> tuple[list[Col], list[list[Cell]]]:
    return [c for c, _ in columns], [[get(x) for _, get in columns] for x in items]


# Sections -------------------------------------------------------------------

def header_text(run: RunReadings, views: Sequence[TargetView]) -> Text:
    ok = sum(1 for v in views if v.ok)
    failed = sum(1 for v in views if not v.ok and v.source != "libtpu")  # probes: see libtpu
    targets = f"{ok} target{'s' if ok != 1 else ''} read" + (f", {failed} failed" if failed else "")
    libtpu, accel = run.libtpu_version.value, run.accelerator.value
    h = run.header
    return Text.assemble(
        ("tpu-info ", "bold"), (clean(h.version), "bold"), "   host ",
        (clean(h.host), "bold"), "   ", h.time_text(), "\n",
        "libtpu ", clean(libtpu) if libtpu else (NA, "dim"),
        "   accelerator ", clean(accel) if accel else (NA, "dim"),
        "   ", targets,
    )


def _hbm_percent(wide: bool) -> Callable[[DeviceRow], Cell]:
    return lambda d: show(d.hbm_percent, bar if wide else lambda p: percent_text(p, HBM_LEVELS))


def _hbm_pair(d: DeviceRow) -> Cell:
    """``3.25 GiB / 15.75 GiB``, coloured as its HBM %."""
    text = format_gib_pair(d.hbm_used.value, d.hbm_total.value)
    p = d.hbm_percent.value
    return text if p is None else percent_text(p, HBM_LEVELS, text)


def _busy(d: DeviceRow) -> Cell:
    """Busy %, ``~``-marked when it is the hook's estimate (a note says so),
    coloured by level."""
    return show(d.busy, lambda p: percent_text(
        p, BUSY_LEVELS, ("~" if d.busy_estimated else "") + format_percent(p)))


def device_columns(wide: bool) -> Columns[DeviceRow]:
    return [
        (Col("Device", role="key", min=5, max=16), lambda d: d.label),
        (Col("Kind", role="text", min=4, want=8, max=28), lambda d: d.kind),
        (Col("Path", role="text", min=8, want=12, max=24, optional=1),
         lambda d: show(d.path, label)),
        (Col("HBM used / total"), _hbm_pair),
        (Col("HBM %", min=BAR_CELLS + 5) if wide else Col("HBM", justify="right"),
         _hbm_percent(wide)),
        (Col("Busy", justify="right"), _busy),
        (Col("Owner", role="text", min=4, want=16, max=32),
         lambda d: show(d.owners if d.owners.value is not None or d.owners.reason else d.pids)),
    ]


def devices_table(run: RunReadings, width: int) -> RenderableType:
    rows = [*run.chips, *(d for t in run.targets for d in t.devices)]
    if not rows:
        return Text.assemble(("Devices\n", "bold"), "No accelerators found: ", run.no_devices)
    t = table("Devices", *_rows(device_columns(width >= WIDE), rows), width)
    if not run.device_notes:
        return t
    return Group(t, *(Text(note, style="dim") for note in run.device_notes))


# At 80 columns: User and Chips drop first, then Uptime, before Name, Engine or
# Address is cut (docs/cli.md says so).
PROCESS_COLUMNS: Columns[ProcessRow] = [
    (Col("PID", justify="right"), lambda p: show(p.pid)),
    (Col("Name", role="key", min=8, max=32), lambda p: show(p.name)),
    (Col("User", role="text", min=4, want=8, max=12, optional=2), lambda p: show(p.user)),
    (Col("Engine", role="key", min=6, max=28), lambda p: show(p.engine)),
    (Col("Address", role="key", min=9, max=28), lambda p: label(p.target)),
    (Col("Uptime", justify="right", optional=1), lambda p: show(p.uptime_seconds, format_uptime)),
    (Col("Steps", justify="right"), lambda p: Alt(show(p.steps), show(p.steps_short))),
    (Col("Compiles", justify="right"), lambda p: show(p.compiles)),
    (Col("HBM", justify="right"), lambda p: show(p.hbm_used_bytes, format_bytes)),
    (Col("Chips", role="text", min=5, max=20, optional=2), lambda p: show(p.chips)),
]


def processes_table(run: RunReadings | Sequence[TargetView], r: Reasons | None = None,
                    width: int = 80) -> RenderableType:
    """The Processes table (``tpu-info --process``): the hooked processes, then
    every other process that holds a local chip (given a :class:`RunReadings`
    made with the local scan); ``r`` (when given) collects the reasons of the
    whole run's N/As."""
    if not isinstance(run, RunReadings):
        run = readings(run, header=Header(host="", time_unix=0.0))
    if r is not None:
        for where, why in run.reasons():
            r.na(where, why)
    rows = list(run.processes)
    if not rows:
        return Text.assemble(("Processes\n", "bold"),
                             run.no_processes or "No hooked processes found.")
    held = any(p.chips.value for p in rows)  # the Chips column, where a local chip is held
    return table("Processes", *_rows(PROCESS_COLUMNS if held else PROCESS_COLUMNS[:-1], rows),
                 width)


Graph = tuple[str, GraphRow]  # (pid, graph)


def graph_columns(wide: bool) -> Columns[Graph]:
    cols: Columns[Graph] = [
        (Col("PID", justify="right"), lambda x: x[0]),
        (Col("Graph"), lambda x: Alt(x[1].graph.short_hash, x[1].graph.short_hash[:8])),
        (Col("Name", role="key", min=8, max=40), lambda x: x[1].graph.name),
        (Col("Compiles", justify="right"), lambda x: str(x[1].graph.compiles)),
        (Col("Hits", justify="right"), lambda x: str(x[1].graph.cache_hits)),
        (Col("Time", justify="right"),
         lambda x: format_ns(x[1].graph.compile_seconds_total * 1e9)),
        (Col("Execs", justify="right"), lambda x: show(x[1].executions)),
    ]
    if wide:
        cols.append((Col("Last recompile cause", role="text", min=20, want=40, max=100),
                     lambda x: show(x[1].cause, Text)))
    return cols


def compilation_section(run: RunReadings, width: int, top: int = 5) -> RenderableType | None:
    wide = width >= WIDE
    graphs = [(str(t.view.snapshot.process.pid) if t.view.snapshot.process else "-", g)
              for t in run.targets if t.view.snapshot is not None for g in t.graphs]
    if not graphs:
        return None
    t = table(f"Compilation (top {top} graphs per process by compile time)",
              *_rows(graph_columns(wide), graphs), width)
    below = [Text.assemble(f"  {g.graph.short_hash[:8]}  ", Text(g.cause.value), no_wrap=True,
                           overflow="ellipsis")
             for _, g in graphs if g.cause.value is not None] if not wide else []
    if not below:
        return t
    return Group(t, Text("Last recompile causes:", style="bold"), *below)


Transfer = tuple[str, TransferRow, str]  # (pid, transfers, target)


def _count(x: TransferRow) -> str:
    t = x.stats  # with how many were timed, where the percentiles stand on fewer
    notes = [n for n in (f"{t.implicit} implicit" if t.implicit else "", t.timed_note()) if n]
    return f"{t.count} ({', '.join(notes)})" if notes else str(t.count)


def _bytes(x: TransferRow) -> Cell:
    t = x.stats
    cell = show(x.bytes, format_bytes)
    if t.implicit and t.implicit_bytes and t.bytes is not None:  # the split, where made
        return f"{format_bytes(t.implicit_bytes)} of {cell}"
    return cell


# Narrow: the Address drops first, then P90 and P95 (P50 and P99.9 stay).
TRANSFER_COLUMNS: Columns[Transfer] = [
    (Col("PID", justify="right"), lambda x: x[0]),
    (Col("Direction"), lambda x: "host->dev" if x[1].direction == "h2d" else "dev->host"),
    (Col("Count", justify="right"), lambda x: _count(x[1])),
    (Col("Bytes", justify="right"), lambda x: _bytes(x[1])),
    (Col("P50", justify="right"), lambda x: show(x[1].p50_ns, format_ns)),
    (Col("P90", justify="right", optional=1), lambda x: show(x[1].p90_ns, format_ns)),
    (Col("P95", justify="right", optional=1), lambda x: show(x[1].p95_ns, format_ns)),
    (Col("P99.9", justify="right"), lambda x: show(x[1].p999_ns, format_ns)),
    (Col("Address", role="key", min=9, max=28, optional=2), lambda x: label(x[2])),
]


def transfers_table(run: RunReadings, width: int) -> RenderableType | None:
    rows = [(str(t.view.snapshot.process.pid) if t.view.snapshot.process else "-", x,
             t.view.target)
            for t in run.targets if t.view.snapshot is not None for x in t.transfers if x.count]
    if not rows:
        return None
    return table("Transfers", *_rows(TRANSFER_COLUMNS, rows), width)


LEVEL_STYLE = {"warn": "yellow", "info": "cyan", "FAIL": "red"}


def finding_columns(width: int) -> Columns[FindingLine]:
    return [
        (Col(""), lambda f: Text(f.level, style=LEVEL_STYLE.get(f.level, "cyan"))),
        (Col("Where", role="text", min=5, want=10, max=24),
         lambda f: f"{f.where} {f.at}" if f.at else f.where),
        (Col("Cost", role="text", min=4, want=15, max=18, optional=1), lambda f: f.cost),
        (Col("Finding", role="wrap", min=20, want=40, max=max(20, width)),
         lambda f: Text(f.text)),
    ]


def findings_table(run: RunReadings | Sequence[TargetView], local: LocalScan | None = None,
                   width: int = 80) -> RenderableType | None:
    if not isinstance(run, RunReadings):
        run = readings(run, local=local, header=Header(host="", time_unix=0.0))
    lines = run.findings
    if not lines:
        if not any(t.view.ok for t in run.targets):
            return None
        return Text.assemble(("Findings\n", "bold"), run.no_findings)
    return table("Findings", *_rows(finding_columns(width), lines), width)


# Entry points ---------------------------------------------------------------

def sections(run: RunReadings, views: Sequence[TargetView], width: int,
             top_graphs: int = 5) -> list[RenderableType]:
    """The sections, in order, with a blank line between them."""
    parts: list[RenderableType | None] = [
        header_text(run, views),
        devices_table(run, width),
        processes_table(run, None, width),
        compilation_section(run, width, top_graphs),
        transfers_table(run, width),
        findings_table(run, None, width),
    ]
    out: list[RenderableType] = []
    for p in parts:
        if p is not None:
            if out:
                out.append(Text(""))
            out.append(p)
    return out


def render(views: Sequence[TargetView], *, local: LocalScan | None = None,
           header: Header | None = None, width: int = 80, top_graphs: int = 5,
           all_chips: bool = False, only: Collection[str] | None = None) -> Group:
    """Every section as one renderable, laid out for ``width`` columns.

    Args:
        views: one per target, read or failed.
        local: this machine's accelerators (``devices.scan_local()``).
        header: time and host; None means now, here.
        width: the terminal width the columns are sized for.
        top_graphs: graphs listed per process.
        all_chips: list the chips not usable here too (``--all``).
        only: list only these chips (``-i``; names as the table's).
    """
    run = readings(views, local=local, header=header, top_graphs=top_graphs,
                   all_chips=all_chips, only=only)
    return Group(*sections(run, views, width, top_graphs))


def render_text(views: Sequence[TargetView], width: int = 80, color: bool = False, *,
                local: LocalScan | None = None, header: Header | None = None,
                top_graphs: int = 5, all_chips: bool = False,
                only: Collection[str] | None = None) -> str:
    """:func:`render` printed to a string (ANSI styles only when ``color``)."""
    console = Console(file=StringIO(), width=width, color_system="standard" if color else None,
                      force_terminal=color, no_color=not color, legacy_windows=False,
                      highlight=False, emoji=False, markup=False)
    console.print(render(views, local=local, header=header, width=width,
                         top_graphs=top_graphs, all_chips=all_chips, only=only))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in out.splitlines()) + "\n"


def reasons(views: Sequence[TargetView], *, local: LocalScan | None = None,
            header: Header | None = None, top_graphs: int = 5) -> list[tuple[str, str]]:
    """``(where, reason)`` for every N/A the tables show, in order (see
    :meth:`tpu_info.views.derived.RunReadings.reasons`)."""
    return readings(views, local=local, header=header or Header(host="", time_unix=0.0),
                    top_graphs=top_graphs).reasons()
