"""nvidia-smi-style tables from model records: pure functions, no I/O.

:func:`render` turns :class:`~tpu_info.views.TargetView` s (plus the local
:class:`~tpu_info.model.LocalScan` and a :class:`~tpu_info.views.Header`)
into one rich renderable: a header, then Devices, Processes, Compilation,
Transfers and Findings. :func:`render_text` prints it to a string;
:func:`reasons` lists why each "N/A" is N/A (for ``doctor``);
:func:`to_json` (from :mod:`tpu_info.jsonview`) is the ``--json`` form.

Layout: every column is sized here, not by rich, from its content and the
terminal width. Numbers keep their width; names, engines, addresses and
causes shrink first and end in an ellipsis; optional columns (User, Path,
the HBM bar, the cause column) appear only when there is room. Output fits
80 columns and grows to use 160. Every string from a remote process goes
through :func:`~tpu_info.views.clean` into a ``Text`` object, so it is never
read as rich markup and never carries terminal escapes.

Example:
    >>> from tpu_info.model import Snapshot, ProcessRecord
    >>> v = TargetView("127.0.0.1:8431",
    ...                Snapshot(10.0, ProcessRecord(pid=7, name="[red]x[/red]")))
    >>> h = Header(host="h", time_unix=0.0, tz=__import__("datetime").timezone.utc)
    >>> "[red]x[/red]" in render_text([v], header=h)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import StringIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_info.catalog import UNCACHED_COMPILE
from tpu_info.devices import accelerator_type
from tpu_info.finding_cost import cost_cell
from tpu_info.findings import diverging_graphs, find, no_engine_reason, short_location
from tpu_info.jsonview import JSON_SCHEMA, SCHEMA, to_json
from tpu_info.model import GraphRecord, LocalScan, Severity
from tpu_info.views import (
    NA,
    NO_STEPS,
    Header,
    Reasons,
    TargetView,
    chip_usage,
    clean,
    engine_label,
    format_bytes,
    format_gib_pair,
    format_ns,
    format_percent,
    format_uptime,
    last_cause,
    memory_reason,
    memory_totals,
    no_findings_text,
    steps_label,
    top_graphs,
    transfer_stats,
)

__all__ = ["Header", "JSON_SCHEMA", "SCHEMA", "TargetView", "reasons", "render",
           "render_text", "to_json"]

WIDE = 120  # from here on: optional columns, HBM bars, causes inline
BAR_CELLS = 10


@dataclass(frozen=True, slots=True)
class Col:
    """A column's layout rules.

    ``flex`` columns shrink when the table is too wide: first down to
    ``want`` (a comfortable width), those with the highest ``give`` first;
    then ``optional`` columns are dropped (highest number first); then flex
    columns shrink down to ``min``. ``wrap`` columns fold instead of ending
    in an ellipsis.
    """

    header: str
    justify: str = "left"
    min: int = 3
    want: int = 0
    max: int = 80
    flex: bool = False
    give: int = 1
    optional: int = 0
    wrap: bool = False


Cell = Text | str
GAP = 2  # columns are separated by two cells


def _cell(value: Cell, style: str = "") -> Text:
    return value if isinstance(value, Text) else Text(clean(value), style=style)


def _na() -> Text:
    return Text(NA, style="dim")


def _shrink(cols: list[Col], keep: list[int], widths: dict[int, int], excess: int,
            floor_of: Callable[[Col], int]) -> int:
    flex = sorted((i for i in keep if cols[i].flex), key=lambda i: (-cols[i].give, -widths[i]))
    for i in flex:
        if excess <= 0:
            break
        cut = min(excess, max(0, widths[i] - floor_of(cols[i])))
        widths[i] -= cut
        excess -= cut
    return excess


def _fit(cols: list[Col], rows: list[list[Text]], width: int) -> tuple[list[int], list[int]]:
    """Which columns to keep and how wide each is, so the table fits ``width``."""
    keep = list(range(len(cols)))
    natural = [min(c.max, max([cell_len(c.header)] + [r[i].cell_len for r in rows]))
               for i, c in enumerate(cols)]

    def hard_floor(c: Col) -> int:
        return max(c.min, 1 if c.wrap else cell_len(c.header))

    while True:
        widths = {i: natural[i] for i in keep}
        excess = sum(widths.values()) + GAP * (len(keep) - 1) - width
        excess = _shrink(cols, keep, widths, excess, lambda c: max(c.want, hard_floor(c)))
        optional = [i for i in keep if cols[i].optional]
        if excess > 0 and optional:
            keep.remove(max(optional, key=lambda i: (cols[i].optional, i)))
            continue
        excess = _shrink(cols, keep, widths, excess, hard_floor)
        flex = [i for i in keep if cols[i].flex]
        while excess > 0 and flex and max(widths[i] for i in flex) > 1:  # last resort
            widths[max(flex, key=lambda i: widths[i])] -= 1
            excess -= 1
        return keep, [widths[i] for i in keep]


def _table(title: str, cols: list[Col], rows: list[list[Cell]], width: int) -> Table:
    cells = [[_cell(v) for v in row] for row in rows]
    keep, widths = _fit(cols, cells, width)
    t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False, padding=(0, 0, 0, 1), header_style="bold",
              expand=False)
    for i, w in zip(keep, widths, strict=True):
        c = cols[i]
        t.add_column(c.header, justify=c.justify, width=w, no_wrap=not c.wrap,  # type: ignore[arg-type]
                     overflow="fold" if c.wrap else "ellipsis")
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    return t


def _bar(p: float) -> Text:
    full = max(0, min(BAR_CELLS, round(p / 100 * BAR_CELLS)))
    style = "red" if p >= 90 else "yellow" if p >= 70 else "green"
    return Text.assemble(("█" * full, style), ("░" * (BAR_CELLS - full), "dim"),
                         f" {format_percent(p):>4}")


def _pct(used: int | None, total: int | None, where: str, why: str, r: Reasons,
         wide: bool) -> Text:
    if used is None or not total:
        r.na(where, why)
        return _na()
    p = 100.0 * used / total
    return _bar(p) if wide else Text(format_percent(p))


# Sections -------------------------------------------------------------------

def header_text(header: Header, views: Sequence[TargetView], local: LocalScan | None,
                r: Reasons) -> Text:
    libtpu = header.libtpu_version or next(
        (v.snapshot.process.versions["libtpu"] for v in views
         if v.snapshot and v.snapshot.process and "libtpu" in v.snapshot.process.versions), None)
    accel = header.accelerator_type or (accelerator_type(local) if local else None)
    if libtpu is None:
        r.na("header/libtpu", "no libtpu package here and no process reported a libtpu version")
    if accel is None:
        r.na("header/accelerator", (local.reasons.get("tpu") if local else None)
             or "the local machine was not scanned")
    ok = sum(1 for v in views if v.ok)
    failed = sum(1 for v in views if not v.ok and v.source != "libtpu")  # probes: see libtpu
    targets = f"{ok} target{'s' if ok != 1 else ''} read" + (f", {failed} failed" if failed else "")
    return Text.assemble(
        ("tpu-info ", "bold"), (clean(header.version), "bold"), "   host ",
        (clean(header.host), "bold"), "   ", header.time_text(), "\n",
        "libtpu ", clean(libtpu) if libtpu else (NA, "dim"),
        "   accelerator ", clean(accel) if accel else (NA, "dim"),
        "   ", targets,
    )


def devices_table(views: Sequence[TargetView], local: LocalScan | None, r: Reasons,
                  width: int) -> RenderableType:
    wide = width >= WIDE
    cols = [Col("Device", min=4, max=16), Col("Kind", min=4, want=8, max=28, flex=True),
            Col("Path", min=8, want=12, max=24, flex=True, give=2, optional=1),
            Col("HBM used / total", min=16, max=24), Col("HBM", justify="right"),
            Col("Busy", justify="right"), Col("PIDs", min=4, want=8, max=30, flex=True)]
    rows: list[list[Cell]] = []
    usage, folded = chip_usage(local, list(views))
    for u in usage:
        c, where = u.chip, f"devices/{u.chip.name}"
        why_used = u.reasons.get("hbm_used_bytes", "not reported")
        pair = format_gib_pair(u.hbm_used_bytes, u.hbm_total_bytes)
        if u.hbm_used_bytes is None:
            r.na(f"{where}/hbm_used", why_used)
        if u.hbm_total_bytes is None:
            r.na(f"{where}/hbm_total", u.reasons.get("hbm_total_bytes", "not reported"))
        pids: Cell = ", ".join(map(str, c.owner_pids)) or "-"
        if not c.owner_pids and "owner_pids" in u.reasons:
            pids = _na()
            r.na(f"{where}/pids", u.reasons["owner_pids"])
        if c.device_path is None:
            r.na(f"{where}/path", u.reasons.get("device_path", "not reported"))
        busy: Cell = format_percent(u.busy_percent) if u.busy_percent is not None else _na()
        if u.busy_percent is None:
            r.na(f"{where}/busy", u.reasons.get("busy_percent", "not reported"))
        kind = f"TPU {c.kind}" if c.vendor == "tpu" else c.kind
        rows.append([c.name, kind, c.device_path or _na(), pair,
                     _pct(u.hbm_used_bytes, u.hbm_total_bytes, f"{where}/hbm_percent",
                          why_used, r, wide), busy, pids])
    for v in views:
        s = v.snapshot
        if s is None or id(v) in folded:
            continue
        pid = str(s.process.pid) if s.process else "-"
        for d in s.devices:
            where = f"devices/{v.target}/{d.platform}:{d.id}"
            m = d.memory
            why = m.reason or f"the engine does not report device memory ({m.source})"
            if m.used_bytes is None:
                r.na(f"{where}/hbm_used", why)
            if m.limit_bytes is None:
                r.na(f"{where}/hbm_total", m.reason or "the engine reports no memory limit")
            busy = format_percent(d.busy_percent) if d.busy_percent is not None else _na()
            if d.busy_percent is None:
                r.na(f"{where}/busy", d.busy_reason or "the engine does not report busy %")
            rows.append([f"{d.platform}:{d.id}", d.kind, v.target,
                         format_gib_pair(m.used_bytes, m.limit_bytes),
                         _pct(m.used_bytes, m.limit_bytes, f"{where}/hbm_percent", why, r, wide),
                         busy, pid])
    if not rows:
        why = "; ".join(clean(x) for x in (local.reasons.values() if local else ())) \
            or "no local scan and no process reported devices"
        r.na("devices", why)
        return Text.assemble(("Devices\n", "bold"), "No accelerators found: ", why)
    if wide:
        cols[4] = Col("HBM %", min=BAR_CELLS + 5)
    return _table("Devices", cols, rows, width)


def processes_table(views: Sequence[TargetView], r: Reasons, width: int) -> RenderableType:
    cols = [Col("PID", justify="right", min=3, max=8),
            Col("Name", min=6, want=8, max=32, flex=True, give=2),
            Col("User", min=4, want=8, max=12, flex=True, optional=1),
            Col("Engine", min=6, want=10, max=28, flex=True),
            Col("Address", min=9, want=15, max=28, flex=True),
            Col("Uptime", justify="right"), Col("Steps", justify="right"),
            Col("Compiles", justify="right"), Col("HBM", justify="right")]
    rows: list[list[Cell]] = []
    for v in views:
        where = f"processes/{v.target}"
        s = v.snapshot
        if s is None and v.source == "libtpu":
            continue  # a probe, not a process: its failure explains the chips' N/As
        if s is None:
            r.na(where, v.error or "not read")
            rows.append([_na(), _na(), _na(), _na(), v.target, _na(), _na(), _na(), _na()])
            continue
        p = s.process
        if p is None:
            why = ("libtpu's service reports devices, not processes" if v.source == "libtpu"
                   else "the target sent no process record")
            r.na(f"{where}/process", why)
            name: Cell = "libtpu" if v.source == "libtpu" else _na()
            pid: Cell = _na()
            user: Cell = _na()
            engine: Cell = "libtpu" if v.source == "libtpu" else _na()
        else:
            pid, name = str(p.pid), p.name or _na()
            user = p.user or _na()
            if not p.user:
                r.na(f"{where}/user", "the process did not report its user")
            label = engine_label(p)
            engine = label if label else _na()
            if label is None:
                r.na(f"{where}/engine", no_engine_reason(p))
        used, _ = memory_totals(s)
        hbm: Cell = format_bytes(used) if used is not None else _na()
        if used is None:
            r.na(f"{where}/hbm", memory_reason(s))
        if v.source == "libtpu":
            why = "libtpu's service does not count steps, compiles or uptime"
            r.na(f"{where}/counters", why)
            rows.append([pid, name, user, engine, v.target, _na(), _na(), _na(), hbm])
            continue
        label = steps_label(s)
        steps: Cell = label if label is not None else _na()
        if label is None:
            r.na(f"{where}/steps", NO_STEPS)
        uptime: Cell = format_uptime(s.uptime_seconds) if s.uptime_seconds > 0 else _na()
        if s.uptime_seconds <= 0:
            r.na(f"{where}/uptime", "the target did not report its uptime")
        rows.append([pid, name, user, engine, v.target, uptime, steps,
                     str(s.counter(UNCACHED_COMPILE)), hbm])
    if not rows:
        return Text.assemble(("Processes\n", "bold"), "No hooked processes found.")
    return _table("Processes", cols, rows, width)


def _cause_text(g: GraphRecord) -> Text | None:
    c = last_cause(g)
    if c is None:
        return None
    where = f" at {short_location(c.location)}" if c.location else ""
    return Text(clean(c.description + where))


def compilation_section(views: Sequence[TargetView], r: Reasons, width: int,
                        top: int = 5) -> RenderableType | None:
    wide = width >= WIDE
    cols = [Col("PID", justify="right", min=3, max=8),
            Col("Graph", min=8, want=12, max=12, flex=True),
            Col("Name", min=8, want=20, max=60, flex=True, give=2),
            Col("Compiles", justify="right"),
            Col("Hits", justify="right"), Col("Time", justify="right"),
            Col("Execs", justify="right")]
    if wide:
        cols.append(Col("Last recompile cause", min=20, want=40, max=100, flex=True))
    rows: list[list[Cell]] = []
    below: list[Text] = []
    for v in views:
        s = v.snapshot
        if s is None or not s.graphs:
            continue
        pid = str(s.process.pid) if s.process else "-"
        for g in top_graphs(s, top):
            execs: Cell = str(g.executions) if g.executions is not None else _na()
            if g.executions is None:
                r.na(f"compilation/{v.target}/{g.short_hash}/executions",
                     f"{g.engine or 'the engine'} does not count executions per graph")
            cause = _cause_text(g)
            if cause is None and g.compiles > 1:
                r.na(f"compilation/{v.target}/{g.short_hash}/cause",
                     "the engine gave no cause for the recompile")
            row: list[Cell] = [pid, g.short_hash, g.name, str(g.compiles), str(g.cache_hits),
                               format_ns(g.compile_seconds_total * 1e9), execs]
            if wide:
                row.append(cause if cause is not None
                           else (_na() if g.compiles > 1 else Text("-")))
            elif cause is not None:
                below.append(Text.assemble(f"  {g.short_hash[:8]}  ", cause, no_wrap=True,
                                           overflow="ellipsis"))
            rows.append(row)
    if not rows:
        return None
    table = _table(f"Compilation (top {top} graphs per process by compile time)", cols, rows,
                   width)
    if not below:
        return table
    return Group(table, Text("Last recompile causes:", style="bold"), *below)


def transfers_table(views: Sequence[TargetView], r: Reasons, width: int) -> RenderableType | None:
    cols = [Col("PID", justify="right", min=3, max=8), Col("Direction", min=9),
            Col("Count", justify="right"), Col("Bytes", justify="right"),
            Col("P50", justify="right"), Col("P90", justify="right"),
            Col("P95", justify="right"), Col("P99.9", justify="right"),
            Col("Address", min=9, want=15, max=28, flex=True, optional=1)]
    rows: list[list[Cell]] = []
    for v in views:
        s = v.snapshot
        if s is None:
            continue
        pid = str(s.process.pid) if s.process else "-"
        for t in transfer_stats(s):
            if t.count == 0:
                continue
            where = f"transfers/{v.target}/{t.direction}"
            cells: list[Cell] = []
            for key in ("p50_ns", "p90_ns", "p95_ns", "p999_ns"):
                val = getattr(t, key)
                cells.append(format_ns(val) if val is not None else _na())
                if val is None:
                    r.na(f"{where}/{key[:-3]}", t.reasons.get(key, "not reported"))
            nbytes: Cell = format_bytes(t.bytes) if t.bytes is not None else _na()
            if t.bytes is None:
                r.na(f"{where}/bytes", t.reasons.get("bytes", "not reported"))
            direction = "host->dev" if t.direction == "h2d" else "dev->host"
            count = str(t.count)
            if t.implicit:  # the split, where the engine makes it
                count += f" ({t.implicit} implicit)"
                if t.implicit_bytes and t.bytes is not None:
                    nbytes = f"{format_bytes(t.implicit_bytes)} of {nbytes}"
            rows.append([pid, direction, count, nbytes, *cells, v.target])
    if not rows:
        return None
    return _table("Transfers", cols, rows, width)


_LEVEL = {s: (s.label, style) for s, style in
          ((Severity.WARNING, "yellow"), (Severity.INFO, "cyan"), (Severity.ERROR, "red"))}


FINDING_TEXT = 600  # a finding's line, cost and advice: longer than other remote strings


def _finding_text(message: str) -> Text:
    return Text(clean(message, FINDING_TEXT))


def findings_table(views: Sequence[TargetView], local: LocalScan | None,
                   width: int) -> RenderableType | None:
    cols = [Col("", min=4, max=4), Col("Where", min=5, want=10, max=24, flex=True),
            Col("Cost", min=4, want=15, max=18, flex=True, optional=1),
            Col("Finding", min=20, want=40, max=max(20, width), flex=True, give=3, wrap=True)]
    rows: list[list[Cell]] = []
    has_tpus = local is not None and bool(local.tpus)
    for v in views:
        if v.snapshot is not None:
            continue
        if v.source == "libtpu":
            if has_tpus:  # without chips, libtpu being absent is normal
                level, style = _LEVEL[Severity.INFO]
                rows.append([Text(level, style=style), v.target, "-",
                             f"libtpu's metric service did not answer ({v.error or 'not read'}); "
                             "chip HBM use and busy % are unknown until a TPU workload runs"])
            continue
        level, style = _LEVEL[Severity.ERROR]
        rows.append([Text(level, style=style), v.target, "-", v.error or "not read"])
    for f in diverging_graphs([v.snapshot for v in views if v.snapshot is not None]):
        level, style = _LEVEL[f.severity]
        rows.append([Text(level, style=style), "job", cost_cell(f), _finding_text(f.message)])
    for v in views:
        s = v.snapshot
        if s is None:
            continue
        who = f"pid {s.process.pid}" if s.process else v.target
        for f in find(s):
            level, style = _LEVEL[f.severity]
            where = who
            if f.location and short_location(f.location) not in f.message:
                where = f"{who} {short_location(f.location)}"
            rows.append([Text(level, style=style), where, cost_cell(f), _finding_text(f.message)])
    if not rows:
        if not any(v.ok for v in views):
            return None
        return Text.assemble(("Findings\n", "bold"), no_findings_text(views))
    return _table("Findings", cols, rows, width)


def hooked_lines(views: Sequence[TargetView]) -> list[str]:
    """For ``doctor``: per hooked process, which engines are hooked and which
    the hook still waits for (those with nothing hooked are N/A reasons)."""
    out = []
    for v in views:
        p = v.snapshot.process if v.snapshot is not None else None
        if p is None or not p.engine:
            continue
        waiting = [e for e in p.waiting.split(",") if e]
        tail = (f"; waiting for {', '.join(waiting)} (hooked when imported)" if waiting
                else "")
        out.append(f"{v.target}: hooked {engine_label(p)}{tail}")
    return out


def blind_spot_lines(views: Sequence[TargetView]) -> list[str]:
    """For ``doctor``: per process, what its hook cannot see (not counted)."""
    return [f"{v.target}: not counted: {spot}" for v in views if v.snapshot is not None
            for spot in v.snapshot.blind_spots]


# Entry points ---------------------------------------------------------------

def _sections(views: Sequence[TargetView], local: LocalScan | None, header: Header | None,
              width: int, top_graphs: int, r: Reasons) -> list[RenderableType]:
    header = header or Header.now()
    parts: list[RenderableType | None] = [
        header_text(header, views, local, r),
        devices_table(views, local, r, width),
        processes_table(views, r, width),
        compilation_section(views, r, width, top_graphs),
        transfers_table(views, r, width),
        findings_table(views, local, width),
    ]
    out: list[RenderableType] = []
    for p in parts:
        if p is not None:
            if out:
                out.append(Text(""))
            out.append(p)
    return out


def render(views: Sequence[TargetView], *, local: LocalScan | None = None,
           header: Header | None = None, width: int = 80, top_graphs: int = 5) -> Group:
    """Every section as one renderable, laid out for ``width`` columns.

    Args:
        views: one per target, read or failed.
        local: this machine's accelerators (``devices.scan_local()``).
        header: time and host; None means now, here.
        width: the terminal width the columns are sized for.
        top_graphs: graphs listed per process.
    """
    return Group(*_sections(views, local, header, width, top_graphs, Reasons()))


def render_text(views: Sequence[TargetView], width: int = 80, color: bool = False, *,
                local: LocalScan | None = None, header: Header | None = None,
                top_graphs: int = 5) -> str:
    """:func:`render` printed to a string (ANSI styles only when ``color``)."""
    console = Console(file=StringIO(), width=width, color_system="standard" if color else None,
                      force_terminal=color, no_color=not color, legacy_windows=False,
                      highlight=False, emoji=False, markup=False)
    console.print(render(views, local=local, header=header, width=width,
                         top_graphs=top_graphs))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in out.splitlines()) + "\n"


def reasons(views: Sequence[TargetView], *, local: LocalScan | None = None,
            header: Header | None = None, top_graphs: int = 5) -> list[tuple[str, str]]:
    """``(where, reason)`` for every N/A the wide table would show, in order.

    ``where`` is a path such as ``devices/tpu0/hbm_used`` or
    ``processes/127.0.0.1:8431/steps``; values a client kept out of a reply
    (not finite, beyond a bound) follow as ``targets/<target>/<where>``.
    """
    r = Reasons()
    _sections(views, local, header or Header(host="", time_unix=0.0), 10_000, top_graphs, r)
    for v in views:  # what the client kept out of each reply when it decoded it
        for where, why in v.snapshot.left_out if v.snapshot is not None else ():
            r.na(f"targets/{v.target}/{where}", f"kept out: {why}")
    return [(clean(where), clean(why)) for where, why in r.pairs]
