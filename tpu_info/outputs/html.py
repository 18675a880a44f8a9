"""The report to look at and share: one self-contained HTML page of a snapshot.

:func:`report_html` is a pure function of a
:class:`~tpu_info.contract.model.Snapshot` (a live target's, or a saved
run's) and of the views: the findings and their costs are the tables'
(:func:`~tpu_info.views.derived.findings_of`), the graphs' per-step cost is
:func:`~tpu_info.views.graphs.graph_costs`'s, the slow steps are
:func:`~tpu_info.views.slow_steps.outliers`. The page loads nothing: its
style is inline, it has no script, its plots are inline SVG
(:mod:`tpu_info.outputs.svgplot`), and a Content-Security-Policy forbids
any fetch. Every string from the snapshot is escaped (it came off the
network).

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> page = report_html(Snapshot(taken_at_unix=0.0), target="h:1")
    >>> page.startswith("<!DOCTYPE html>"), "<script" in page
    (True, False)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from tpu_info.contract.catalog import COMPILE_TIME, STEP_TIME, UNCACHED_COMPILE
from tpu_info.contract.model import (
    COMPILE_KINDS,
    DistributionReading,
    Event,
    EventKind,
    RecompileCause,
    Snapshot,
)
from tpu_info.contract.safe import clean
from tpu_info.contract.series import RunSeries
from tpu_info.outputs import svgplot
from tpu_info.views.breakdown import breakdown
from tpu_info.views.cost import duration
from tpu_info.views.derived import findings_of, graph_row
from tpu_info.views.graphs import graph_costs, per_step_cell
from tpu_info.views.slow_steps import outliers, slow_cut
from tpu_info.views.values import (
    TargetView,
    engine_label,
    format_bytes,
    format_uptime,
    no_findings_text,
    presentable,
    steps_label,
    top_graphs,
)

MAX_GRAPHS = 200  # rows of the graphs table (by compile time); the rest counted
MAX_LANES = 40  # functions in the compile timeline; the rest share one lane
MAX_BARS = 2000  # compile events drawn (the hook's ring holds fewer)
TEXT = 300  # longest name or cause a cell shows
LOG_ABOVE = 20.0  # the step plot's scale is logarithmic when a step is this many medians

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;padding:0 16px;
color:#1d232a;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#d0d7de;padding-bottom:4px}p.note{color:#57606a;margin:6px 0}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #e4e8ec;vertical-align:top}th{background:#f4f6f8}td.n{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}code{font-size:12px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:8px 0}dt{color:#57606a}
dd{margin:0}.lvl-warn{color:#9a6700;font-weight:600}.lvl-FAIL{color:#cf222e;font-weight:600}
.lvl-info{color:#0969da}
svg.plot{width:100%;height:auto;display:block}svg text{font:11px system-ui,sans-serif;
fill:#57606a}svg .label{font-size:12px}svg .lane{fill:#1d232a}
.grid{stroke:#eaeef2}.axis{stroke:#8c959f}circle.step{fill:#0969da}circle.slow{fill:#cf222e}
line.range{stroke-width:1.5}line.range.step{stroke:#0969da;opacity:.45}line.range.slow{stroke:#cf222e}
line.mark{stroke-width:1.5;stroke-dasharray:4 3}line.compile{stroke:#8250df}
line.recompile{stroke:#bc4c00}rect.compile{fill:#8250df}rect.recompile{fill:#bc4c00}
rect.loop{fill:#ddf4ff;opacity:.6}rect.limit{fill:#eaeef2}rect.used{fill:#1a7f37}
line.peak{stroke:#cf222e;stroke-width:2}
.key span{display:inline-block;margin-right:14px}.key i{display:inline-block;width:10px;
height:10px;margin-right:4px;border-radius:5px}
@media (prefers-color-scheme:dark){body{background:#0d1117;color:#e6edf3}th{background:#161b22}
th,td{border-color:#30363d}svg .lane{fill:#e6edf3}.grid{stroke:#21262d}rect.limit{fill:#21262d}
rect.loop{fill:#0c2d6b}}
"""

# No fetch of any kind: a hostile string that escaped would still load nothing.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _e(text: object, limit: int = TEXT) -> str:
    """Remote text for HTML: cleaned of control characters, cut, escaped."""
    return escape(clean(text, limit), quote=True)


def _when(unix: float) -> str:
    try:
        return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "-"


def _origin(s: Snapshot) -> float:
    """Time zero of the page's time axes: the program's start when known."""
    if s.process is not None and s.process.start_time_unix > 0:
        return s.process.start_time_unix
    times = [e.time_unix for e in s.events]
    d = s.distribution(STEP_TIME)
    if d is not None:
        times += [t for t, _ in d.recent]
        if d.series is not None and len(d.series):
            times.append(d.series.first_unix[0])
    return min(times, default=s.taken_at_unix)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """A table of already escaped cells; columns in ``numeric`` right-aligned."""
    out = ["<table><thead><tr>", "".join(f"<th>{escape(h)}</th>" for h in head),
           "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _time(s: Snapshot) -> str:
    """Where the run's time went (views.breakdown): its parts, then the steady step."""
    b = breakdown(s)
    if b is None:
        return '<p class="note">The process told no uptime.</p>'
    run = b.run_seconds
    rows = [[escape(p.name), escape(duration(p.seconds)), f"{p.seconds / run:.0%}",
             _e(p.basis, 200)] for p in b.parts]
    lines = b.lines()
    out = _table(["part", "time", "share of the run", "what it stands on"], rows, {1, 2})
    if b.overlap:
        out += f'<p class="note">{_e(lines[0].rpartition("(")[2].rstrip(")"), 200)}</p>'
    if len(lines) > 1:
        out += f"<p>{_e(lines[1], 600)}</p>"
    return out


def _summary(s: Snapshot, target: str) -> str:
    p = s.process
    items: list[tuple[str, str]] = []
    if p is not None:
        items.append(("Process", f"{_e(p.name)} (pid {p.pid})" + (f" on {_e(p.host)}"
                                                                  if p.host else "")))
        if p.argv:
            items.append(("Command", f"<code>{_e(' '.join(p.argv), 400)}</code>"))
        items.append(("Engine", _e(engine_label(p) or "none hooked")))
        if p.start_time_unix > 0:
            items.append(("Started", _when(p.start_time_unix)))
    if target:
        items.append(("Read from", _e(target)))
    items.append(("Snapshot taken", f"{_when(s.taken_at_unix)} (uptime "
                                     f"{format_uptime(s.uptime_seconds)})"))
    steps = steps_label(s)
    per = s.steps.seconds_per_step if s.steps is not None else None
    items.append(("Steps", (_e(steps) if steps else "not known")
                  + (f", {duration(per)} per step" if per else "")))
    d = s.distribution(STEP_TIME)
    if d is not None and d.count:
        p50, p99 = d.percentile(50.0), d.percentile(99.0)
        if p50 is not None and p99 is not None:
            items.append(("Step time", f"P50 {duration(p50 / 1e9)}, P99 {duration(p99 / 1e9)}"))
    compiles = s.counter(UNCACHED_COMPILE) or sum(g.compiles for g in s.graphs)
    ct = s.distribution(COMPILE_TIME)
    items.append(("Compiles", f"{compiles:,}" + (f" ({duration(ct.total / 1e9)} in all)"
                                                 if ct is not None and ct.total > 0 else "")))
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _cause_words(s: Snapshot, e: Event) -> str:
    """A recompile event's cause in words, from the typed cause behind it (its
    graph's cause whose description the detail starts with, the rest of the
    detail kept); an event alone (its graph's causes gone, or an older
    hook's): its words."""
    g = next((g for g in s.graphs if g.hash == e.graph_hash), None)
    c = next((c for c in reversed(g.causes) if c.description
              and e.detail.startswith(c.description)), None) if g is not None else None
    if c is None:
        return presentable(RecompileCause(e.time_unix, e.detail)).description
    return presentable(c).description + e.detail[len(c.description):]


def _compile_title(s: Snapshot, e: Event, origin: float) -> str:
    """Hover text of a compile event: kind, function, when, how long, why."""
    words = f"{e.kind} {e.name} ended at +{e.time_unix - origin:.2f} s"
    if e.value:
        words += f", took {duration(e.value)}"
    detail = e.detail
    if e.kind == EventKind.RECOMPILE and detail:  # the cause in words, not the engine's text
        detail = _cause_words(s, e)
    if detail:
        words += f": {detail}"
    if e.location:
        words += f" at {e.location}"
    return clean(words, TEXT)


def _step_plot(s: Snapshot, origin: float) -> str:
    d = s.distribution(STEP_TIME)
    if d is not None and d.series is not None and len(d.series):
        return _whole_run_plot(s, d, d.series, origin)
    if d is None or not d.recent:
        why = ("the program marks no steps (StepTime is the time between metrics.mark_step() "
               "calls, or between optimizer steps in torch)" if d is None or not d.count
               else "the snapshot carries no recent step samples (the client kept them out)")
        return f'<p class="note" id="no-step-plot">No step-time plot: {escape(why)}.</p>'
    # A hook (or saved run) from before whole-run series: its last samples only.
    median, _, slow = outliers(d) if d.percentile(50.0) else (0.0, 0.0, [])
    slow_at = {t for t, _ in slow}
    points = [svgplot.Point(t - origin, v / 1e6, "slow" if t in slow_at else "step",
                            f"step ended at +{t - origin:.2f} s: {duration(v / 1e9)}"
                            + (" (slow)" if t in slow_at else ""))
              for t, v in d.recent]
    first = min(t - v / 1e9 for t, v in d.recent)  # the first shown step's start
    last = max(t for t, _ in d.recent)
    marks, before = _compile_marks(s, origin, first, last)
    log_y = median > 0 and max(v for _, v in d.recent) / 1e9 > LOG_ABOVE * median
    svg = svgplot.scatter(points, marks, x_label="seconds since the program started "
                          "(each point: a step, at its end)",
                          y_label="step time (ms" + (", log scale)" if log_y else ")"),
                          log_y=log_y)
    note = (f"The last {len(d.recent):,} of {d.count:,} steps (the program's hook keeps no "
            f"whole-run series). Red: slow steps ({len(slow)}, over "
            f"{duration(slow_cut(median))}); dashed lines: compiles that ended in these steps "
            f"({len(marks)}; purple a first compile, orange a recompile).")
    if before:
        note += f" {before:,} compile(s) ended before the first step shown: see the timeline."
    return f'<p class="note">{escape(note)}</p>{svg}'


def _compile_marks(s: Snapshot, origin: float, first: float,
                   last: float) -> tuple[list[svgplot.Mark], int]:
    """The compiles that ended from ``first`` to ``last`` (unix) as marks,
    and how many ended before ``first``."""
    compiles = [e for e in s.events if e.kind in COMPILE_KINDS]
    marks = [svgplot.Mark(e.time_unix - origin, str(e.kind), _compile_title(s, e, origin))
             for e in compiles if first <= e.time_unix <= last]
    return marks, len([e for e in compiles if e.time_unix < first])


def _whole_run_plot(s: Snapshot, d: DistributionReading, r: RunSeries, origin: float) -> str:
    """The whole run from the hook's bounded series: one point per bucket of
    consecutive steps at its mean, its line from the fastest step to the
    slowest (a spike is a line's top); a bucket holding a slow step is red."""
    median = (d.percentile(50.0) or 0.0) / 1e9
    cut = slow_cut(median) if median > 0 else math.inf
    points, ranges = [], []
    slow = 0
    for i, at in enumerate(r.first_index()):
        n, lo, hi = r.counts[i], r.mins[i] / 1e9, r.maxs[i] / 1e9
        t0, t1 = r.first_unix[i] - origin, r.last_unix[i] - origin
        cls = "slow" if hi >= cut else "step"
        slow += cls == "slow"
        if n == 1:
            points.append(svgplot.Point(t1, hi * 1e3, cls, f"step sample {at + 1:,} ended at "
                                        f"+{t1:.2f} s: {duration(hi)}"
                                        + (" (slow)" if cls == "slow" else "")))
            continue
        mean = r.mean(i) / 1e9
        words = (f"step samples {at + 1:,}-{at + n:,} ({n:,}), ended +{t0:.2f} to "
                 f"+{t1:.2f} s: mean {duration(mean)}, fastest {duration(lo)}, slowest "
                 f"{duration(hi)}" + (" (slow)" if cls == "slow" else ""))
        x = (t0 + t1) / 2
        points.append(svgplot.Point(x, mean * 1e3, cls, words))
        if hi > lo:
            ranges.append(svgplot.Range(x, lo * 1e3, hi * 1e3, cls, words))
    # The first sample's step began before it ended (at most its bucket's slowest).
    first = r.first_unix[0] - r.maxs[0] / 1e9
    marks, before = _compile_marks(s, origin, first, r.last_unix[-1])
    log_y = median > 0 and max(r.maxs) / 1e9 > LOG_ABOVE * median
    svg = svgplot.scatter(points, marks, ranges=ranges,
                          x_span=(first - origin, r.last_unix[-1] - origin),
                          x_label="seconds since the program "
                          "started (each point: " + ("a step, at its end)" if r.width == 1 else
                                                     "consecutive steps, at their middle)"),
                          y_label="step time (ms" + (", log scale)" if log_y else ")"),
                          log_y=log_y)
    if r.width == 1:
        what = f"All {r.count:,} step samples, one point each."
    else:
        what = (f"The whole run: {r.count:,} step samples in {len(r):,} points of "
                f"{r.width:,} consecutive steps (the last of {r.counts[-1]:,}), each at their "
                "mean, its line from the fastest to the slowest (a spike is a line's top).")
    note = (f"{what} Red: {'points holding ' if r.width > 1 else ''}slow steps ({slow:,}, "
            f"over {duration(slow_cut(median)) if median > 0 else '-'}); dashed lines: "
            f"compiles that ended during the steps ({len(marks)}; purple a first compile, "
            "orange a recompile).")
    if d.count > r.count:
        note += f" {d.count - r.count:,} step samples came from elsewhere and are not drawn."
    if before:
        note += f" {before:,} compile(s) ended before the first step: see the timeline."
    return f'<p class="note" id="step-plot-note">{escape(note)}</p>{svg}'


def _timeline(s: Snapshot, origin: float) -> str:
    events = [e for e in s.events if e.kind in COMPILE_KINDS][-MAX_BARS:]
    known = sum(g.compiles for g in s.graphs)
    if not events:
        return ('<p class="note" id="no-timeline">No compile events in this snapshot'
                + (f" ({known:,} compiles are counted in the graphs table; their events "
                   "have left the hook's ring of recent events)." if known else ".") + "</p>")
    names: list[str] = []
    for e in events:
        if e.name not in names and len(names) < MAX_LANES:
            names.append(e.name)
    other = len(names) == MAX_LANES and any(e.name not in names for e in events)
    lane_names = [clean(n, TEXT) for n in names] + (["(other functions)"] if other else [])
    bars = [svgplot.Bar(names.index(e.name) if e.name in names else MAX_LANES,
                        e.time_unix - (e.value or 0.0) - origin, e.time_unix - origin,
                        str(e.kind), _compile_title(s, e, origin)) for e in events]
    spans = []
    st = s.steps
    if st is not None and st.first_unix is not None and st.last_unix is not None:
        spans.append(svgplot.Span(st.first_unix - origin, st.last_unix - origin, "loop",
                                  "the step loop"))
    svg = svgplot.lanes(lane_names, bars, x_label="seconds since the program started",
                        spans=spans)
    note = (f"{len(events):,} compile(s), one bar each from its start to its end (purple: a "
            "function's first compile; orange: a recompile)"
            + ("; shaded: the step loop" if spans else "") + ".")
    if known > len(events):
        note += (f" The graphs table counts {known:,} compiles: the older events have left "
                 "the hook's ring of recent events.")
    return f'<p class="note">{escape(note)}</p>{svg}'


def _memory(s: Snapshot) -> str:
    rows, missing = [], []
    for d in s.devices:
        m = d.memory
        name = f"{d.platform}:{d.id} {d.kind}".strip()
        if m.used_bytes is None:
            missing.append(f"{name}: {m.reason or 'not reported'}")
            continue
        title = (f"{name}: {format_bytes(m.used_bytes)} used"
                 + (f", peak {format_bytes(m.peak_bytes)}" if m.peak_bytes is not None else "")
                 + (f", limit {format_bytes(m.limit_bytes)}" if m.limit_bytes else "")
                 + f" (source: {m.source})")
        rows.append((clean(name, 60), float(m.used_bytes), _opt(m.peak_bytes),
                     _opt(m.limit_bytes), clean(title, TEXT)))
    out = ['<p class="note" id="hbm-note">A snapshot holds each device\'s memory at the '
           "moment it was taken (and its peak, where the runtime reports one): the hook "
           "keeps no memory series over time, so this is that moment, not a curve. Red "
           "tick: the peak; grey: the limit.</p>"]
    if rows:
        sources = sorted({d.memory.source for d in s.devices if d.memory.used_bytes is not None})
        if "live_arrays" in sources:
            out.append('<p class="note">Source live_arrays: the bytes of live arrays (the '
                       "runtime reports no allocator statistics here; the limit is host "
                       "RAM).</p>")
        out.append(svgplot.hbars(rows, format_bytes))
    if missing:
        out.append("<ul>" + "".join(f"<li>{_e(m)}</li>" for m in missing) + "</ul>")
    if not s.devices:
        out.append('<p class="note">The process reported no devices.</p>')
    return "".join(out)


def _opt(n: int | None) -> float | None:
    return None if n is None else float(n)


def _findings(s: Snapshot) -> str:
    lines = findings_of(s)
    if not lines:
        words = no_findings_text([TargetView("", s)])
        return f'<p class="note" id="no-findings">{_e(words, 1200)}</p>'
    rows = [[f'<span class="lvl-{escape(f.level)}">{escape(f.level)}</span>',
             f"<code>{_e(f.kind, 80)}</code>", _e(f.text, 1200), _e(f.at, 200), _e(f.cost, 80)]
            for f in lines]
    return _table(("level", "kind", "finding", "line", "cost"), rows, {4})


def _graphs(s: Snapshot) -> str:
    if not s.graphs:
        return '<p class="note">No compiled graphs recorded.</p>'
    shown = top_graphs(s, MAX_GRAPHS)
    costs = graph_costs(s, shown)
    rows = []
    for g, c in zip(shown, costs, strict=True):
        r = graph_row("", g)
        rows.append([f'<code title="{_e(g.hash, 200)}">{_e(g.short_hash, 16)}</code>',
                     _e(g.name), _e(g.engine, 40), f"{g.compiles:,}", f"{g.cache_hits:,}",
                     duration(g.compile_seconds_total) if g.compile_seconds_total > 0 else "-",
                     "-" if g.executions is None else f"{g.executions:,}",
                     _e(per_step_cell(c) or "-", 40), _e(r.cause.value or "")])
    note = (f'<p class="note">{len(s.graphs) - len(shown):,} more graph(s) with less compile '
            "time are not listed.</p>" if len(s.graphs) > len(shown) else "")
    return _table(("graph", "name", "engine", "compiles", "cache hits", "compile time",
                   "executions", "per step", "last recompile cause"), rows,
                  {3, 4, 5, 6, 7}) + note


def _extras(s: Snapshot) -> str:
    out = []
    if s.blind_spots:
        out.append("<h2>What the hook cannot see</h2><ul>"
                   + "".join(f"<li>{_e(b, 600)}</li>" for b in s.blind_spots) + "</ul>")
    if s.left_out:
        out.append("<h2>Values kept out when read</h2><ul>"
                   + "".join(f"<li>{_e(w, 120)}: {_e(r, 300)}</li>" for w, r in s.left_out)
                   + "</ul>")
    return "".join(out)


def report_html(snapshot: Snapshot, target: str = "") -> str:
    """The whole page for ``snapshot`` read from ``target`` (an address, a file)."""
    s = snapshot
    origin = _origin(s)
    who = (f"{s.process.name} (pid {s.process.pid})" if s.process is not None
           else target or "a hooked program")
    sections = [
        ("Summary", "summary", _summary(s, target)),
        ("Where the time went", "time", _time(s)),
        ("Step time", "steps", _step_plot(s, origin)),
        ("Compile timeline", "compiles", _timeline(s, origin)),
        ("Device memory (HBM)", "hbm", _memory(s)),
        ("Findings", "findings", _findings(s)),
        ("Graphs", "graphs", _graphs(s)),
    ]
    body = "".join(f'<section id="{sid}"><h2>{escape(title)}</h2>{html}</section>'
                   for title, sid, html in sections)
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>tpu-info report: {_e(who, 120)}</title><style>{CSS}</style></head>"
            f"<body><h1>tpu-info report: {_e(who, 120)}</h1>"
            f'<p class="note">Taken {_when(s.taken_at_unix)}. Hover a point, line or bar '
            f"for its numbers.</p>{body}{_extras(s)}</body></html>\n")
