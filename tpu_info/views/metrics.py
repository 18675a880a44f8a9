"""``tpu-info --metric NAME [-f 'percentile:[p50,p90]']`` and ``--list_metrics``.

Google's short names keep their meaning (PROTOCOL-libtpu.md); our own names
(``CompileTime``, ``MarkStep``, ...) work too, and so does a name outside the
catalog that a target records (``metrics.distribution("DataLoadTime", ...)``,
a ``jax.monitoring`` event such as ``/myapp/checkpoint/save``): its table
shows the value in its unit, with its help below. Tables are pure functions of
the gathered views (:mod:`tpu_info.outputs.metric_tables`); a device's N/A
says the same why as the tables (:func:`tpu_info.views.derived.device_row`).

Example:
    >>> resolve("host_to_device_transfer_latency")
    'TransferToDeviceTime'
    >>> parse_filter("percentile:[p50,p999]")
    ('p50', 'p999')
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tpu_info.contract.catalog import CATALOG
from tpu_info.contract.model import CounterReading, DistributionReading
from tpu_info.views.google_metrics import GOOGLE_METRICS, GoogleMetric, Source
from tpu_info.views.values import TargetView

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
        if not any(custom_reading(v, name) is not None for v in views):
            return (f"unknown metric {name!r}: not a known name and no target read records "
                    f"it; valid metrics: {', '.join(valid_names())}")
    return None


def custom_reading(v: TargetView, name: str) -> CounterReading | DistributionReading | None:
    """``v``'s counter or distribution named ``name`` (any name), or None."""
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
