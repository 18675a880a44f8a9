"""``tpu-info --metric NAME [-f 'percentile:[p50,p90]']`` and ``--list_metrics``.

Google's short names keep their meaning (PROTOCOL-libtpu.md); our own names
(``CompileTime``, ``MarkStep``, ...) work too, and so does a name outside the
catalog that a target records (``metrics.distribution("DataLoadTime", ...)``,
a ``jax.monitoring`` event such as ``/myapp/checkpoint/save``): its table
shows the value in its unit, with its help below. Tables are pure functions of
the gathered views; a device's N/A says the same why as the tables
(:func:`tpu_info.views.derived.device_row`).

Example:
    >>> resolve("host_to_device_transfer_latency")
    'TransferToDeviceTime'
    >>> parse_filter("percentile:[p50,p999]")
    ('p50', 'p999')
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text

from tpu_info.contract.catalog import CATALOG
from tpu_info.contract.model import CounterReading, DistributionReading, Unit
from tpu_info.views.derived import device_row
from tpu_info.views.google_metrics import (
    GOOGLE_METRICS,
    LIBTPU_SOURCES,
    GoogleMetric,
    LibtpuRead,
    Source,
    has_value,
    libtpu_table,
    na_table,
    percentile_of,
    reason,
    recorded_name,
)
from tpu_info.views.values import NA, TargetView, clean, format_bytes, format_ns

PERCENTILE_COLUMNS = {"p1": 1.0, "p5": 5.0, "p10": 10.0, "p20": 20.0, "p50": 50.0, "p80": 80.0,
                      "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
DEFAULT_PERCENTILES = ("p50", "p90", "p95", "p999")
# Commas between pairs, not inside a [list] (Google's args_helper splits the same way).
_FILTER_SPLIT = re.compile(r",(?![^\[]*\])")
# libtpu's TpuCoreTypeProto, as Google's example spells it (lower case, no "_").
CORE_TYPES = frozenset({"tensorcore", "sparsecore", "sparsecorev0"})


def valid_names() -> list[str]:
    return sorted(GOOGLE_METRICS) + sorted(CATALOG)


def google_metric(name: str) -> GoogleMetric | None:
    """Google's name ``name`` (spaces as ``_``), or None when it is not one."""
    return GOOGLE_METRICS.get(name.strip().replace(" ", "_"))


def resolve(name: str) -> str:
    """Our name for ``name``: Google's short names (spaces as ``_``) that mean
    one of our distributions give its name, the others stay themselves
    (:mod:`tpu_info.views.google_metrics` says where their values come from).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    m = google_metric(name)
    if m is not None:
        return m.key if m.source is Source.OURS else m.name
    key = name.strip().replace(" ", "_")
    for ours in CATALOG:
        if ours.lower() == key.lower():
            return ours
    raise ValueError(f"unknown metric {name!r}; valid metrics: {', '.join(valid_names())}")


# A name outside the catalog: what metrics.counter/distribution and
# jax.monitoring accept, without spaces or control characters.
_CUSTOM_RE = re.compile(r"^[A-Za-z0-9_/:.\-]{1,200}$")


def resolve_or_custom(name: str) -> str:
    """:func:`resolve`'s name, or ``name`` itself when it could be a metric a
    target records outside the catalog (checked once targets are read:
    :func:`unknown_metric`).

    Raises:
        ValueError: not a known name and not a possible metric name.
    """
    try:
        return resolve(name)
    except ValueError:
        if _CUSTOM_RE.match(name.strip()):
            return name.strip()
        raise


def unknown_metric(names: Sequence[str], views: Sequence[TargetView]) -> str | None:
    """The one-line error for the first name that is neither known nor
    recorded by any view (a ``--metric`` name outside the catalog), or None."""
    for name in names:
        try:
            resolve(name)
            continue
        except ValueError:
            pass
        if not any(_custom_reading(v, name) is not None for v in views):
            return (f"unknown metric {name!r}: not a known name and no target read records "
                    f"it; valid metrics: {', '.join(valid_names())}")
    return None


def _custom_reading(v: TargetView, name: str) -> CounterReading | DistributionReading | None:
    s = v.snapshot
    if s is None:
        return None
    d = s.distribution(name)
    if d is not None:
        return d
    return next((c for c in s.counters if c.name == name), None)


def parse_filter(text: str) -> tuple[str, ...]:
    """Google's ``-f`` grammar, ``key:value, key:[v1,v2]``, to the percentile
    columns it asks for: ``percentile:[p50,p90]`` -> ``('p50', 'p90')``.

    ``core_type:tensorcore`` (Google's own ``--help`` example) is accepted:
    every metric a filter applies to here is measured per host, the same for
    each core type, so it selects nothing. Without ``percentile`` the
    default columns stay.

    Raises:
        ValueError: not that grammar, an unknown key, core type or percentile.
    """
    parts = [p for p in _FILTER_SPLIT.split(text) if p.strip()]
    if not parts:
        raise ValueError(f"filter {text!r} is empty: give 'percentile:[p50,p90]'")
    cols: tuple[str, ...] = DEFAULT_PERCENTILES
    for part in parts:
        key, sep, value = (s.strip() for s in part.partition(":"))
        key = key.lower()
        if not sep or not key or not value:
            raise ValueError(f"filter {text!r}: {part.strip()!r} is not KEY:VALUE "
                             "(e.g. 'percentile:[p50,p90], core_type:tensorcore')")
        if key == "core_type":
            if value.lower().replace("_", "") not in CORE_TYPES:
                raise ValueError(f"filter {text!r}: core_type must be one of "
                                 f"{', '.join(sorted(CORE_TYPES))}")
            continue
        if key != "percentile":
            raise ValueError(f"filter {text!r}: unknown key {key!r} (keys: percentile, "
                             "core_type)")
        if not (value.startswith("[") and value.endswith("]")):
            raise ValueError(f"filter {text!r}: percentile takes a list, e.g. "
                             "'percentile:[p50,p90]'")
        cols = tuple(c.strip().lower() for c in value[1:-1].split(",") if c.strip())
        bad = [c for c in cols if c not in PERCENTILE_COLUMNS]
        if bad or not cols:
            raise ValueError(f"filter {text!r}: percentiles must be among "
                             f"{', '.join(PERCENTILE_COLUMNS)}")
    return cols


def metric_list() -> list[dict[str, str]]:
    """Every metric name ``--metric`` takes: ``{name, unit, kind, meaning, source}``
    (``source`` is ``google`` for Google's short names, else ``tpu-info``)."""
    out = [{"name": name, "unit": m.unit, "kind": "", "meaning": _google_meaning(m),
            "source": "google"} for name, m in sorted(GOOGLE_METRICS.items())]
    out += [{"name": name, "unit": unit.value, "kind": kind, "meaning": help_,
             "source": "tpu-info"} for name, (kind, unit, help_) in sorted(CATALOG.items())]
    return out


_FROM = {
    Source.DEVICE_HBM: "from libtpu, else the hooked processes",
    Source.DEVICE_BUSY: "from libtpu, else the hooked processes' estimate",
    Source.LIBTPU_GAUGE: "libtpu only",
    Source.LIBTPU_LATENCY: "libtpu only, multi-slice jobs",
    Source.LIBTPU_STATUS: "libtpu only",
    Source.JAX_MONITORING: "the hooked processes' jax.monitoring records",
    Source.PYGRAIN: "pygrain's Prometheus endpoint: not read here",
}


def _google_meaning(m: GoogleMetric) -> str:
    if m.source is Source.OURS:
        return f"{m.meaning} (our {m.key})"
    return f"{m.meaning} ({_FROM[m.source]})"


def list_metrics_table() -> Table:
    t = Table(title="Metrics", title_justify="left")
    t.add_column("name", no_wrap=True)
    t.add_column("unit")
    t.add_column("meaning", overflow="fold")
    for m in metric_list():
        meaning = (f"{m['meaning']} (Google's tpu-info name)" if m["source"] == "google"
                   else f"{m['kind']}: {m['meaning']}")
        t.add_row(m["name"], m["unit"], meaning)
    return t


def _value(v: float, unit: Unit) -> str:
    if unit is Unit.TIME_NS:
        return format_ns(v)
    if unit is Unit.BYTES:
        return format_bytes(v)
    return f"{v:.6g}"


def _titled(name: str, views: Sequence[TargetView]) -> Table:
    """An empty table titled ``name``, at least as wide as its title (a narrow
    table would wrap it mid-word), saying why when there is nothing to show."""
    title = clean(name)
    t = Table(title=title, title_justify="left", min_width=len(title))
    if not views:
        t.caption, t.caption_justify = "No hooked processes found.", "left"
    return t


def metric_table(name: str, views: Sequence[TargetView],
                 columns: Sequence[str] = DEFAULT_PERCENTILES,
                 libtpu: Mapping[str, Sequence[LibtpuRead]] | None = None) -> Table:
    """One table for one metric across every view; ``libtpu`` holds what
    libtpu answered for Google's names that only it serves
    (:func:`tpu_info.commands.libtpu_reads.reads`)."""
    google = google_metric(name)
    if google is not None and google.source is not Source.OURS:
        return _google_table(google, views, columns, (libtpu or {}).get(google.name, ()))
    ours = resolve_or_custom(name)
    if ours not in CATALOG:
        return _custom_table(ours, views, columns)
    t = _titled(name, views)
    t.add_column("target", no_wrap=True, overflow="ellipsis", max_width=28)
    kind = CATALOG[ours][0]
    if kind == "counter":
        t.add_column("value", justify="right")
        for v in views:
            val = str(v.snapshot.counter(ours)) if v.snapshot else f"{NA}: {clean(v.error)}"
            t.add_row(Text(clean(v.target)), Text(val))
        return t
    t.add_column("count", justify="right")
    for c in columns:
        t.add_column(c.upper(), justify="right", no_wrap=True)
    for v in views:
        d = v.snapshot.distribution(ours) if v.snapshot else None
        if d is None or not d.count:
            why = clean(v.error) if not v.ok else f"no {ours} samples recorded"
            t.add_row(Text(clean(v.target)), "0", *[NA] * len(columns))
            t.caption = f"{NA}: {why}"
            continue
        cells = []
        for c in columns:
            p = percentile_of(d, PERCENTILE_COLUMNS[c])
            cells.append(NA if p is None else _value(p, d.unit))
        t.add_row(Text(clean(v.target)), str(d.count), *cells)
    return t


def _google_table(m: GoogleMetric, views: Sequence[TargetView], columns: Sequence[str],
                  reads: Sequence[LibtpuRead]) -> Table:
    """Google's name ``m``, from its source, or one row saying why not."""
    if m.source in (Source.DEVICE_HBM, Source.DEVICE_BUSY):
        return _device_table(m, views)
    if m.source in LIBTPU_SOURCES:
        shown = [r for r in reads if has_value(m, r)]
        if shown:
            return libtpu_table(m, shown, columns, PERCENTILE_COLUMNS)
        failed = next((r for r in reads if r.error), None)
        reachable = any(v.ok and v.source == "libtpu" for v in views)
        return na_table(m, reason(m, libtpu_reachable=reachable, hooked=False, read=failed))
    recorded = recorded_name(views, m.key)
    if recorded is not None:
        return _custom_table(recorded, [v for v in views if v.source == "hook"], columns,
                             title=m.name)
    hooked = any(v.ok and v.source == "hook" for v in views)
    return na_table(m, reason(m, libtpu_reachable=False, hooked=hooked))


def _device_table(m: GoogleMetric, views: Sequence[TargetView]) -> Table:
    """HBM used / total, or busy %, of each device of each view, with the
    device tables' reasons for an N/A (:func:`tpu_info.views.derived.device_row`)."""
    hbm = m.source is Source.DEVICE_HBM
    t = _titled(m.name, views)
    t.add_column("target", no_wrap=True, overflow="ellipsis", max_width=28)
    t.add_column("device", no_wrap=True)
    t.add_column("HBM used / total" if hbm else "busy %", no_wrap=True)
    for v in views:
        if not v.ok or v.snapshot is None:
            t.add_row(Text(clean(v.target)), NA, Text(f"{NA}: {clean(v.error)}"))
            continue
        if not v.snapshot.devices:
            t.add_row(Text(clean(v.target)), NA, Text(f"{NA}: the process reported no devices"))
        for dev in v.snapshot.devices:
            row = device_row(v, dev)  # the tables' values, and their reasons
            if hbm:
                used, total = row.hbm_used, row.hbm_total
                val = (f"{format_bytes(used.value)} / {format_bytes(total.value)}"
                       if used.value is not None and total.value else
                       f"{NA}: {clean(used.reason or total.reason or 'not reported')}")
            else:
                val = (f"{row.busy.value:.1f}%" if row.busy.value is not None
                       else f"{NA}: {clean(row.busy.reason)}")
            t.add_row(Text(clean(v.target)), Text(f"{dev.id} {clean(dev.kind)}"), Text(val))
    return t


def _custom_table(name: str, views: Sequence[TargetView], columns: Sequence[str],
                  title: str | None = None) -> Table:
    """A metric outside the catalog: a counter's value or a distribution's
    count and percentiles, in its unit, with its help as the caption."""
    t = _titled(title or name, views)
    t.add_column("target", no_wrap=True, overflow="ellipsis", max_width=28)
    found = [(v, _custom_reading(v, name)) for v in views]
    dist = any(isinstance(r, DistributionReading) for _, r in found)
    if dist:
        t.add_column("count", justify="right")
        for c in columns:
            t.add_column(c.upper(), justify="right", no_wrap=True)
    else:
        t.add_column("value", justify="right")
    width = 1 + len(columns) if dist else 1
    about = ""
    for v, r in found:
        if r is None:
            why = clean(v.error) if not v.ok else f"this target records no {clean(name)}"
            t.add_row(Text(clean(v.target)), Text(f"{NA}: {why}"), *[""] * (width - 1))
            continue
        about = about or (f"{clean(r.help)} " if r.help else "") + f"(unit: {r.unit.value})"
        if isinstance(r, DistributionReading):
            cells = [NA if (p := percentile_of(r, PERCENTILE_COLUMNS[c])) is None
                     else _value(p, r.unit) for c in columns]
            t.add_row(Text(clean(v.target)), str(r.count), *cells)
        else:
            value = _value(r.value, r.unit) if r.unit is not Unit.NUMBER else str(r.value)
            t.add_row(Text(clean(v.target)), Text(value), *[""] * (width - 1))
    t.caption = about or t.caption
    return t
