"""The tables of ``tpu-info --metric NAME`` and ``--list_metrics``.

Each is a pure function of the gathered views (and, for Google's names only
libtpu serves, of what libtpu answered: :class:`~tpu_info.views.google_metrics.LibtpuRead`);
the words, the sources and every N/A's reason are
:mod:`tpu_info.views.metrics`' and :mod:`tpu_info.views.google_metrics`'.
The tables are :mod:`tpu_info.outputs.table_layout`'s, so they fit the
console's width: the target and the device are key columns (whole while
anything else can give), a reason or an error folds onto more lines, and a
table too wide for its numbers becomes one block of lines per row. HBM used
and busy % are coloured by level, as in the Devices table.

Example:
    >>> from rich.console import Console
    >>> c = Console(width=80, color_system=None)
    >>> with c.capture() as cap:
    ...     c.print(metric_table("hlo_queue_size", []))
    >>> print(cap.get().splitlines()[0])
    hlo_queue_size
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text

from tpu_info.contract.catalog import CATALOG
from tpu_info.contract.model import DistributionReading, Unit
from tpu_info.outputs.table_layout import (
    BUSY_LEVELS,
    HBM_LEVELS,
    Alt,
    Cell,
    Col,
    FitTable,
    level_style,
    table,
)
from tpu_info.views.derived import device_row
from tpu_info.views.google_metrics import (
    LIBTPU_SOURCES,
    GoogleMetric,
    LibtpuRead,
    Source,
    has_value,
    percentile_of,
    reason,
    recorded_name,
)
from tpu_info.views.metrics import (
    DEFAULT_PERCENTILES,
    PERCENTILE_COLUMNS,
    custom_reading,
    google_metric,
    metric_list,
    resolve_or_custom,
)
from tpu_info.views.values import NA, TargetView, clean, format_bytes, format_ns

NO_PROCESSES = "No hooked processes found."
TARGET = Col("target", role="key", min=9, max=28)
# libtpu's columns by header: what may give way, and what folds
_TEXT = frozenset({"attributes", "type", "sequencer"})
_WRAP = frozenset({"error", "HLO location", "HLO detail"})
_NUMBERS = frozenset({"device", "chip", "core", "PC", "tracemark", "program", "run", "launch",
                      "count"})
# libtpu's enum names start with their type's: the short form drops it
_ENUM_PREFIXES = ("TPU_SEQUENCER_TYPE_", "TPU_CORE_TYPE_")


def _col(header: str) -> Col:
    if header in _WRAP:
        return Col(header, role="wrap", min=8, max=60)
    if header in _TEXT:
        return Col(header, role="text", min=8, max=40)
    return Col(header, justify="right" if header.isupper() or header in _NUMBERS else "left")


def _enum(name: str) -> Alt:
    """``TPU_SEQUENCER_TYPE_TENSOR_CORE_SEQUENCER``, short ``TENSOR_CORE_SEQUENCER``."""
    short = next((name[len(p):] for p in _ENUM_PREFIXES if name.startswith(p)), name)
    return Alt(name, short or name)


def _target(v: TargetView | LibtpuRead) -> Text:
    return Text(clean(v.target))


def _value(v: float, unit: Unit) -> str:
    if unit is Unit.TIME_NS:
        return format_ns(v)
    if unit is Unit.BYTES:
        return format_bytes(v)
    return f"{v:.6g}"


def _why(text: str) -> Cell:
    return Text(f"{NA}: {clean(text)}")


def list_metrics_table() -> FitTable:
    """``--list_metrics``: every name ``--metric`` takes, its unit and meaning."""
    rows: list[list[Cell]] = []
    for m in metric_list():
        meaning = (f"{m['meaning']} (Google's tpu-info name)" if m["source"] == "google"
                   else f"{m['kind']}: {m['meaning']}")
        rows.append([m["name"], m["unit"], Text(meaning)])
    return table("Metrics", [Col("name", role="key", min=12, max=48), Col("unit"),
                             Col("meaning", role="wrap", min=20, max=200)], rows)


def metric_table(name: str, views: Sequence[TargetView],
                 columns: Sequence[str] = DEFAULT_PERCENTILES,
                 libtpu: Mapping[str, Sequence[LibtpuRead]] | None = None) -> FitTable:
    """One table for one metric across every view; ``libtpu`` holds what
    libtpu answered for Google's names that only it serves
    (:func:`tpu_info.commands.libtpu_reads.reads`)."""
    google = google_metric(name)
    if google is not None and google.source is not Source.OURS:
        return _google_table(google, views, columns, (libtpu or {}).get(google.name, ()))
    ours = resolve_or_custom(name)
    if ours not in CATALOG:
        return _custom_table(ours, views, columns)
    title = clean(name)
    empty = None if views else NO_PROCESSES
    if CATALOG[ours][0] == "counter":
        rows: list[list[Cell]] = [
            [_target(v), str(v.snapshot.counter(ours)) if v.snapshot else _why(v.error)]
            for v in views]
        return table(title, [TARGET, Col("value", "right", role="wrap", min=12, max=60)], rows,
                     caption=empty)
    caption = empty
    rows = []
    for v in views:
        d = v.snapshot.distribution(ours) if v.snapshot else None
        if d is None or not d.count:
            caption = f"{NA}: {clean(v.error) if not v.ok else f'no {ours} samples recorded'}"
            rows.append([_target(v), "0", *[NA] * len(columns)])
            continue
        rows.append([_target(v), str(d.count), *_percentiles(d, columns)])
    return table(title, [TARGET, _col("count"), *(_col(c.upper()) for c in columns)], rows,
                 caption=caption)


def _percentiles(d: DistributionReading, columns: Sequence[str]) -> list[Cell]:
    return [NA if (p := percentile_of(d, PERCENTILE_COLUMNS[c])) is None
            else _value(p, d.unit) for c in columns]


def _google_table(m: GoogleMetric, views: Sequence[TargetView], columns: Sequence[str],
                  reads: Sequence[LibtpuRead]) -> FitTable:
    """Google's name ``m``, from its source, or one row saying why not."""
    if m.source in (Source.DEVICE_HBM, Source.DEVICE_BUSY):
        return _device_table(m, views)
    if m.source in LIBTPU_SOURCES:
        shown = [r for r in reads if has_value(m, r)]
        if shown:
            return libtpu_table(m, shown, columns)
        failed = next((r for r in reads if r.error), None)
        reachable = any(v.ok and v.source == "libtpu" for v in views)
        return na_table(m, reason(m, libtpu_reachable=reachable, hooked=False, read=failed))
    recorded = recorded_name(views, m.key)
    if recorded is not None:
        return _custom_table(recorded, [v for v in views if v.source == "hook"], columns,
                             title=m.name)
    hooked = any(v.ok and v.source == "hook" for v in views)
    return na_table(m, reason(m, libtpu_reachable=False, hooked=hooked))


def _device_table(m: GoogleMetric, views: Sequence[TargetView]) -> FitTable:
    """HBM used / total, or busy %, of each device of each view, coloured by
    level, with the device tables' reasons for an N/A
    (:func:`tpu_info.views.derived.device_row`)."""
    hbm = m.source is Source.DEVICE_HBM
    rows: list[list[Cell]] = []
    for v in views:
        if not v.ok or v.snapshot is None:
            rows.append([_target(v), NA, _why(v.error)])
            continue
        if not v.snapshot.devices:
            rows.append([_target(v), NA, _why("the process reported no devices")])
        for dev in v.snapshot.devices:
            row = device_row(v, dev)  # the tables' values, and their reasons
            if hbm:
                used, total = row.hbm_used, row.hbm_total
                val: Cell = (
                    Text(f"{format_bytes(used.value)} / {format_bytes(total.value)}",
                         style=level_style(100 * used.value / total.value, HBM_LEVELS))
                    if used.value is not None and total.value else
                    _why(used.reason or total.reason or "not reported"))
            else:
                busy = row.busy.value
                val = (Text(f"{busy:.1f}%", style=level_style(busy, BUSY_LEVELS))
                       if busy is not None else _why(row.busy.reason))
            rows.append([_target(v), Text(f"{dev.id} {clean(dev.kind)}"), val])
    return table(clean(m.name), [TARGET, Col("device", role="key", min=5, max=24),
                                 Col("HBM used / total" if hbm else "busy %", role="wrap",
                                     min=12, max=80)],
                 rows, caption=None if views else NO_PROCESSES)


def _custom_table(name: str, views: Sequence[TargetView], columns: Sequence[str],
                  title: str | None = None) -> FitTable:
    """A metric outside the catalog: a counter's value or a distribution's
    count and percentiles, in its unit, with its help as the caption."""
    found = [(v, custom_reading(v, name)) for v in views]
    dist = any(isinstance(r, DistributionReading) for _, r in found)
    first = Col("count" if dist else "value", "right", role="wrap", min=12, max=60)
    cols = [TARGET, first, *((_col(c.upper()) for c in columns) if dist else ())]
    rows: list[list[Cell]] = []
    about = ""
    for v, r in found:
        if r is None:
            why = clean(v.error) if not v.ok else f"this target records no {clean(name)}"
            rows.append([_target(v), _why(why), *[""] * (len(cols) - 2)])
            continue
        about = about or (f"{clean(r.help)} " if r.help else "") + f"(unit: {r.unit.value})"
        if isinstance(r, DistributionReading):
            rows.append([_target(v), str(r.count), *_percentiles(r, columns)])
        else:
            value = _value(r.value, r.unit) if r.unit is not Unit.NUMBER else str(r.value)
            rows.append([_target(v), value, *[""] * (len(cols) - 2)])
    return table(clean(title or name), cols, rows,
                 caption=about or (None if views else NO_PROCESSES))


# What libtpu answered -----------------------------------------------------------------

def na_table(m: GoogleMetric, why: str) -> FitTable:
    """``m``'s table with one row: N/A and why."""
    return table(m.name, [Col("value", role="wrap", min=20, max=200)], [[_why(why)]])


def _gauge_text(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.6g}"


def libtpu_table(m: GoogleMetric, reads: Sequence[LibtpuRead],
                 columns: Sequence[str]) -> FitTable:
    """``m``'s table from what each libtpu target answered (none empty here)."""
    if m.source is Source.LIBTPU_GAUGE:
        rows: list[list[Cell]] = [[_target(r), str(g.device), _gauge_text(g.value, m.unit)]
                                  for r in reads for g in r.gauges]
        return table(m.name, [TARGET, _col("device"), Col(m.unit or "value", "right")], rows)
    if m.source is Source.LIBTPU_LATENCY:
        rows = []
        caption = None
        for r in reads:
            for d in r.latencies:
                cells = [NA if (v := d.percentile(PERCENTILE_COLUMNS[c])) is None
                         else f"{v:.4g} {m.unit}" for c in columns]
                rows.append([_target(r), Text(d.labels), str(d.count), *cells])
            if any(not d.count for d in r.latencies):
                caption = f"{NA}: no samples in that attribute set"
        return table(m.name, [TARGET, *map(_col, ("attributes", "count",
                                                  *(c.upper() for c in columns)))],
                     rows, caption=caption)
    return _status_table(m, reads)


def _status_table(m: GoogleMetric, reads: Sequence[LibtpuRead]) -> FitTable:
    rows: list[list[Cell]] = []
    if m.key == "cores":
        for r in reads:
            for c in r.cores:
                rows.append([_target(r), str(c.chip_id), str(c.global_core_id), _enum(c.core_type),
                             "yes" if c.xdb_server else "no", Text(c.error or "-")])
        heads: tuple[str, ...] = ("chip", "core", "type", "xdb server", "error")
        return table(m.name, [TARGET, *map(_col, heads)], rows)
    if m.key == "queued":
        for r in reads:
            for c in r.cores:
                for q in c.queued:
                    rows.append([_target(r), str(c.chip_id), str(c.global_core_id),
                                 str(q.run_id), str(q.launch_id), q.fingerprint[:16]])
        heads = ("chip", "core", "run", "launch", "fingerprint")
        return table(m.name, [TARGET, *map(_col, heads)], rows,
                     caption=None if rows else "no programs queued")
    detailed = m.key == "sequencers_detailed"
    more = ("error", "HLO location", "HLO detail") if detailed else ()
    for r in reads:
        for c in r.cores:
            for s in c.sequencers:
                extra = ((Text(c.error or "-"), Text(s.hlo_location or "-"),
                          Text(s.hlo_detail or "-")) if detailed else ())
                rows.append([_target(r), str(c.chip_id), str(c.global_core_id), str(s.pc),
                             str(s.tracemark), str(s.program_id), str(s.run_id), _enum(s.kind),
                             *extra])
    heads = ("chip", "core", "PC", "tracemark", "program", "run", "sequencer", *more)
    return table(m.name, [TARGET, *map(_col, heads)], rows)
