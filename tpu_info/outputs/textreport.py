"""torch_xla-style text reports from a :class:`~tpu_info.contract.model.Snapshot`.

``metrics_report()`` inside a program and ``tpu-info report`` outside it both
print :func:`metrics_report` of a snapshot. The format is torch_xla's
(``Metric:`` and ``Counter:`` blocks), without its rounding bug: torch_xla
rounds the leading time unit and truncates the rest, so 2.80 ms prints as
``003ms802.000us``; here every part is exact (``002ms802.000us``).

Given a ``width`` (``tpu-info report`` on a terminal), no line is wider: a
long line folds at its spaces, its next lines indented under its value
(``Percentiles:``, a finding, a cause), and when a graph's row would not
fit, the Graphs table gives each name a line of its own. Without one (a
pipe, a file, ``metrics_report()`` in the program) every line is torch_xla's,
whole.

Example:
    >>> format_time_ns(2_802_000)
    '002ms802.000us'
    >>> format_bytes(1536)
    '1.50KB'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tpu_info.contract.catalog import (
    CACHED_COMPILE,
    COMPILE_TIME,
    EXECUTE_TIME,
    MARK_STEP,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
)
from tpu_info.contract.model import (
    STEPS_INFERRED,
    CounterReading,
    DistributionReading,
    GraphRecord,
    Snapshot,
    Unit,
)
from tpu_info.outputs.console import fold
from tpu_info.views.breakdown import breakdown
from tpu_info.views.derived import FindingLine, findings_of
from tpu_info.views.findings import short_location
from tpu_info.views.values import TargetView, clean, no_findings_text, presentable, steps_label

# (suffix, nanoseconds, digits) from the largest part down to milliseconds;
# microseconds with three decimals close every time value.
_TIME_PARTS = (("d", 86_400 * 10**9, 2), ("h", 3_600 * 10**9, 2), ("m", 60 * 10**9, 2),
               ("s", 10**9, 2), ("ms", 10**6, 3))
_BYTE_SUFFIXES = ("B", "KB", "MB", "GB", "TB", "PB")

DEFAULT_SHORT_COUNTERS = (CACHED_COMPILE, MARK_STEP)
DEFAULT_SHORT_METRICS = (COMPILE_TIME, EXECUTE_TIME, TRANSFER_TO_DEVICE_TIME,
                         TRANSFER_FROM_DEVICE_TIME)


def format_time_ns(value: float) -> str:
    """torch_xla's time format with exact parts: ``01s352ms039.967us``."""
    if not math.isfinite(value) or abs(value) >= 1e18:  # absurd data from the wire
        return f"{value / 1e9:.3g}s"
    n = int(round(value))
    sign = "-" if n < 0 else ""
    n = abs(n)
    out = []
    started = False
    for suffix, scale, width in _TIME_PARTS:
        whole, n = divmod(n, scale)
        if whole or started:
            out.append(f"{whole:0{width}d}{suffix}")
            started = True
    us, ns = divmod(n, 1000)
    out.append(f"{us:03d}.{ns:03d}us")
    return sign + "".join(out)


def format_bytes(value: float) -> str:
    """torch_xla's byte format: two decimals, 1024-based suffixes."""
    i = 0
    while i + 1 < len(_BYTE_SUFFIXES) and abs(value) >= 1024.0:
        value /= 1024.0
        i += 1
    return f"{value:.2f}{_BYTE_SUFFIXES[i]}"


def format_value(value: float, unit: Unit) -> str:
    if unit is Unit.TIME_NS:
        return format_time_ns(value)
    if unit is Unit.BYTES:
        return format_bytes(value)
    return f"{value:.2f}"


def format_rate(value: float) -> str:
    return f"{value:.6g}"


def metric_block(d: DistributionReading) -> list[str]:
    lines = [f"Metric: {d.name}", f"  TotalSamples: {d.count}",
             f"  Accumulator: {format_value(d.total, d.unit)}"]
    if d.value_rate_per_second is not None:
        lines.append(f"  ValueRate: {format_value(d.value_rate_per_second, d.unit)} / second")
    if d.rate_per_second is not None:
        lines.append(f"  Rate: {format_rate(d.rate_per_second)} / second")
    if d.percentiles:
        pct = "; ".join(f"{p:g}%={format_value(v, d.unit)}" for p, v in d.percentiles)
        lines.append(f"  Percentiles: {pct}")
    return lines


def counter_block(c: CounterReading) -> list[str]:
    return [f"Counter: {c.name}", f"  Value: {c.value}"]


def _graph_lines(graphs: Sequence[GraphRecord], top: int, width: int | None = None
                 ) -> list[str]:
    if not graphs:
        return []
    ranked = sorted(graphs, key=lambda g: g.compile_seconds_total, reverse=True)[:top]
    rows = [f"  {g.short_hash:<12}  {g.compiles:>8}  {g.cache_hits:>5}  "
            f"{format_time_ns(g.compile_seconds_total * 1e9):>14}  "
            f"{'-' if g.executions is None else g.executions:>7}" for g in ranked]
    inline = width is None or all(len(r) + 2 + len(g.name) <= width
                                  for r, g in zip(rows, ranked))
    lines = [f"Graphs: {len(graphs)} known, top {len(ranked)} by compile time",
             f"  {'hash':<12}  {'compiles':>8}  {'hits':>5}  {'compile time':>14}  "
             f"{'execs':>7}" + ("  name" if inline else "")]
    for row, g in zip(rows, ranked):
        lines.append(f"{row}  {g.name}" if inline else row)
        if not inline:  # a name of its own, as the cause below it
            lines.append(f"  {'':<12}  name: {g.name}")
        cause = presentable(g.causes[-1]) if g.causes else None
        if cause is not None:
            where = f" at {short_location(cause.location)}" if cause.location else ""
            lines.append(f"  {'':<12}  last cause: {cause.description}{where}")
    return lines


def _steps_lines(snapshot: Snapshot) -> list[str]:
    """``Steps: 1,200 (inferred: jit(train_step)), 2.1ms per step`` and, for
    inferred steps, what the step was taken to be."""
    st = snapshot.steps
    if st is None or st.source != STEPS_INFERRED:
        return []  # marked steps are the MarkStep counter above
    per = st.seconds_per_step
    lines = [f"Steps: {steps_label(snapshot)}"
             + (f", {format_time_ns(per * 1e9)} per step" if per is not None else "")]
    lines.append(f"  basis: {clean(st.basis, 200)}")
    return lines


def finding_lines(f: FindingLine) -> list[str]:
    """``  - [kind] words [line]`` and, when it cost something measurable, its
    cost as the tables show it (``    cost: 4.1 ms/step 3.0%``)."""
    out = [f"  - [{f.kind}] {f.text}" + (f" [{f.at}]" if f.at else "")]
    if f.cost != "-":
        out.append(f"    cost: {f.cost}")
    return out


def metrics_report(snapshot: Snapshot, top_graphs: int = 10, width: int | None = None) -> str:
    """The full report: every metric, every counter, graphs, findings (in the
    words of the tables: :mod:`tpu_info.views.derived`); ``width``: the
    widest a line may be (None: torch_xla's lines, whole)."""
    lines: list[str] = []
    for d in snapshot.distributions:
        lines += metric_block(d)
    for c in snapshot.counters:
        lines += counter_block(c)
    lines += _steps_lines(snapshot)
    lines += _graph_lines(snapshot.graphs, top_graphs, width)
    if (time := breakdown(snapshot)) is not None:  # where the time went
        lines += ["Time:", *(f"  {line}" for line in time.lines())]
    findings = findings_of(snapshot)
    if findings:
        lines.append("Findings:")  # costliest first
        for f in findings:
            lines += finding_lines(f)
        if snapshot.blind_spots:  # what no finding could judge (np.asarray(x) on the CPU)
            lines.append(f"  Not counted here: {'; '.join(snapshot.blind_spots)}.")
    elif lines:
        lines += ["Findings:", f"  {no_findings_text([TargetView('', snapshot)])}"]
    return "\n".join(fold(lines, width)) + "\n" if lines else ""


def short_selection(
    snapshot: Snapshot,
    counter_names: Iterable[str] | None = None,
    metric_names: Iterable[str] | None = None,
) -> list[CounterReading | DistributionReading]:
    """What the short report shows, in its order: the named counters and metrics
    (by default compiles, executions, transfers, steps, and every ``aten::``
    fallback, in torch_xla's order)."""
    default = counter_names is None and metric_names is None
    wanted_counters = list(counter_names or (DEFAULT_SHORT_COUNTERS if default else ()))
    wanted_metrics = list(metric_names or (DEFAULT_SHORT_METRICS if default else ()))
    counters = {c.name: c for c in snapshot.counters}
    dists = {d.name: d for d in snapshot.distributions}
    out: list[CounterReading | DistributionReading] = []
    if default:
        # torch_xla's order: CachedCompile, the timing metrics, MarkStep, aten::*.
        if CACHED_COMPILE in counters:
            out.append(counters[CACHED_COMPILE])
        out += [dists[name] for name in wanted_metrics if name in dists]
        if MARK_STEP in counters:
            out.append(counters[MARK_STEP])
        out += [c for c in snapshot.counters if c.name.startswith("aten::")]
    else:
        out += [counters[name] for name in wanted_counters if name in counters]
        out += [dists[name] for name in wanted_metrics if name in dists]
    return out


def short_metrics_report(
    snapshot: Snapshot,
    counter_names: Iterable[str] | None = None,
    metric_names: Iterable[str] | None = None,
    width: int | None = None,
) -> str:
    """torch_xla's short report of :func:`short_selection` (``width``: as
    :func:`metrics_report`'s)."""
    lines: list[str] = []
    for x in short_selection(snapshot, counter_names, metric_names):
        lines += counter_block(x) if isinstance(x, CounterReading) else metric_block(x)
    return "\n".join(fold(lines, width)) + "\n" if lines else ""
