"""Hand-written inline SVG plots for the HTML report: no script, no network.

Three shapes: :func:`scatter` (points over time, each with an optional
vertical range, with vertical markers),
:func:`lanes` (bars on a time axis, one lane per name: a compile timeline)
and :func:`hbars` (used / peak / limit per device). Each takes raw strings
and escapes every one it writes (the data comes off the network); each
returns one ``<svg>`` element that scales with its container (``viewBox``).
Every point is one ``<circle>``, every marker or range one ``<line>`` and
every bar one ``<rect>``, each with a ``<title>`` a browser shows on hover.

Example:
    >>> svg = scatter([Point(0.0, 1.0, "step", "a")], [], x_label="s", y_label="ms")
    >>> svg.count("<circle")
    1
    >>> nice_ticks(0.0, 9.0)
    [0.0, 2.0, 4.0, 6.0, 8.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 900, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 40
LANE_H = 18  # one lane of a timeline
LABEL_W = 180  # a timeline's lane names


@dataclass(frozen=True, slots=True)
class Point:
    """One sample: ``cls`` its CSS class (``step``, ``slow``), ``title`` its hover text."""

    x: float
    y: float
    cls: str
    title: str


@dataclass(frozen=True, slots=True)
class Range:
    """A vertical line at ``x`` from ``lo`` to ``hi`` (the spread of the
    samples a point stands for: their min and max)."""

    x: float
    lo: float
    hi: float
    cls: str
    title: str


@dataclass(frozen=True, slots=True)
class Mark:
    """A vertical line across the plot at ``x`` (a compile)."""

    x: float
    cls: str
    title: str


@dataclass(frozen=True, slots=True)
class Bar:
    """A bar from ``x0`` to ``x1`` in lane ``lane``."""

    lane: int
    x0: float
    x1: float
    cls: str
    title: str


@dataclass(frozen=True, slots=True)
class Span:
    """A shaded stretch of the time axis (the step loop), named by ``title``."""

    x0: float
    x1: float
    cls: str
    title: str


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]``: steps of 1, 2 or 5 times a power of ten."""
    span = hi - lo
    if not (math.isfinite(span) and span > 0):
        return [lo]
    raw = span / max(1, n)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    count = int(math.floor((hi - first) / step + 1e-9)) + 1
    return [round(first + i * step, 12) for i in range(max(1, count))]


def _num(v: float) -> str:
    return f"{v:.1f}"


def _tick_text(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.3g}"


class _Scale:
    """Maps ``[lo, hi]`` onto ``[a, b]`` pixels (a flat range maps to the middle)."""

    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        if not hi > lo:
            lo, hi = lo - 1.0, hi + 1.0
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _range(values: Sequence[float], floor: float | None = None) -> tuple[float, float]:
    lo = min(values) if floor is None else floor
    hi = max(values)
    if hi <= lo:
        hi = lo + 1.0
    return lo, hi + (hi - lo) * 0.04


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def _x_axis(sx: _Scale, y0: float, top: float, label: str, width: float) -> list[str]:
    out = [f'<line class="axis" x1="{_num(sx.a)}" y1="{_num(y0)}" x2="{_num(sx.b)}" '
           f'y2="{_num(y0)}"/>']
    for t in nice_ticks(sx.lo, sx.hi, 8):
        x = sx(t)
        out.append(f'<line class="grid" x1="{_num(x)}" y1="{_num(top)}" x2="{_num(x)}" '
                   f'y2="{_num(y0)}"/><text class="tick" x="{_num(x)}" y="{_num(y0 + 14)}" '
                   f'text-anchor="middle">{escape(_tick_text(t))}</text>')
    out.append(f'<text class="label" x="{_num((sx.a + sx.b) / 2)}" y="{_num(y0 + 32)}" '
               f'text-anchor="middle">{escape(label)}</text>')
    return out


def _svg(height: float, body: list[str], label: str) -> str:
    return (f'<svg class="plot" viewBox="0 0 {WIDTH} {_num(height)}" role="img" '
            f'aria-label="{escape(label)}" preserveAspectRatio="xMidYMid meet">'
            + "".join(body) + "</svg>")


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten (and 2x, 5x when few) between ``lo`` and ``hi`` (positive)."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1.0,) if last - first > 3 else (1.0, 2.0, 5.0)
    return [m * 10.0 ** k for k in range(first, last + 1) for m in steps
            if lo <= m * 10.0 ** k <= hi]


def scatter(points: Sequence[Point], marks: Sequence[Mark], *, x_label: str, y_label: str,
            spans: Sequence[Span] = (), log_y: bool = False,
            ranges: Sequence[Range] = (), x_span: tuple[float, float] | None = None) -> str:
    """Points on a time axis (y from zero, or on a log scale with ``log_y``:
    positive values only), with vertical ``ranges`` (drawn under the
    points), vertical ``marks`` and shaded ``spans``.

    The x range covers the points, the ranges and ``x_span`` (the time the
    points stand for, when it reaches past them); marks outside it are not
    drawn (the caller says so in words).
    """
    xs = [p.x for p in points] + [r.x for r in ranges] + list(x_span or ()) or [0.0]
    x_lo, x_hi = _range(xs)
    ys = [p.y for p in points] + [r.hi for r in ranges] + [r.lo for r in ranges] or [1.0]
    sx = _Scale(x_lo, x_hi, LEFT, WIDTH - RIGHT)
    y0 = HEIGHT - BOTTOM
    if log_y:
        tiny = min([y for y in ys if y > 0] or [1.0])
        lo, hi = tiny / 1.2, max(ys) * 1.2
        ticks = _log_ticks(lo, hi)
        ly = _Scale(math.log10(lo), math.log10(hi), y0, TOP)

        def sy(v: float) -> float:
            return ly(math.log10(max(v, tiny)))
    else:
        y_lo, y_hi = _range(ys, floor=0.0)
        ticks = nice_ticks(y_lo, y_hi, 5)
        sy = _Scale(y_lo, y_hi, y0, TOP)
    body: list[str] = []
    for s in spans:
        a, b = max(s.x0, x_lo), min(s.x1, x_hi)
        if b > a:
            body.append(f'<rect class="{escape(s.cls)}" x="{_num(sx(a))}" y="{TOP}" '
                        f'width="{_num(sx(b) - sx(a))}" height="{_num(y0 - TOP)}">'
                        f"{_title(s.title)}</rect>")
    for t in ticks:
        y = sy(t)
        body.append(f'<line class="grid" x1="{LEFT}" y1="{_num(y)}" x2="{WIDTH - RIGHT}" '
                    f'y2="{_num(y)}"/><text class="tick" x="{LEFT - 6}" y="{_num(y + 4)}" '
                    f'text-anchor="end">{escape(_tick_text(t))}</text>')
    body.append(f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{_num(y0)}"/>')
    body.append(f'<text class="label" transform="translate(14 {_num((TOP + y0) / 2)}) '
                f'rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
    body += _x_axis(sx, y0, TOP, x_label, WIDTH)
    for m in marks:
        if x_lo <= m.x <= x_hi:
            x = _num(sx(m.x))
            body.append(f'<line class="mark {escape(m.cls)}" x1="{x}" y1="{TOP}" x2="{x}" '
                        f'y2="{_num(y0)}">{_title(m.title)}</line>')
    for r in ranges:
        x = _num(sx(r.x))
        body.append(f'<line class="range {escape(r.cls)}" x1="{x}" y1="{_num(sy(r.lo))}" '
                    f'x2="{x}" y2="{_num(sy(r.hi))}">{_title(r.title)}</line>')
    for p in points:
        body.append(f'<circle class="{escape(p.cls)}" cx="{_num(sx(p.x))}" '
                    f'cy="{_num(sy(p.y))}" r="3">{_title(p.title)}</circle>')
    return _svg(HEIGHT, body, y_label)


def lanes(names: Sequence[str], bars: Sequence[Bar], *, x_label: str,
          spans: Sequence[Span] = (), min_px: float = 2.0) -> str:
    """A timeline: lane ``i`` is named ``names[i]``; each bar at least ``min_px``
    wide, so a 5 ms compile on a minute's axis still shows."""
    xs = [b.x0 for b in bars] + [b.x1 for b in bars] + [s.x0 for s in spans] + \
        [s.x1 for s in spans]
    x_lo, x_hi = _range(xs or [0.0])
    height = TOP + LANE_H * max(1, len(names)) + BOTTOM
    y0 = height - BOTTOM
    sx = _Scale(x_lo, x_hi, LABEL_W, WIDTH - RIGHT)
    body: list[str] = []
    for s in spans:
        body.append(f'<rect class="{escape(s.cls)}" x="{_num(sx(s.x0))}" y="{TOP}" '
                    f'width="{_num(max(0.0, sx(s.x1) - sx(s.x0)))}" '
                    f'height="{_num(y0 - TOP)}">{_title(s.title)}</rect>')
    for i, name in enumerate(names):
        y = TOP + i * LANE_H
        body.append(f'<text class="lane" x="{LABEL_W - 6}" y="{_num(y + LANE_H - 5)}" '
                    f'text-anchor="end">{escape(_cut(name, 28))}{_title(name)}</text>')
    body += _x_axis(sx, y0, TOP, x_label, WIDTH)
    for b in bars:
        x = sx(b.x0)
        w = max(min_px, sx(b.x1) - x)
        body.append(f'<rect class="{escape(b.cls)}" x="{_num(x)}" '
                    f'y="{_num(TOP + b.lane * LANE_H + 3)}" width="{_num(w)}" '
                    f'height="{LANE_H - 6}">{_title(b.title)}</rect>')
    return _svg(height, body, x_label)


def hbars(rows: Sequence[tuple[str, float, float | None, float | None, str]],
          fmt: Callable[[float], str]) -> str:
    """One bar per ``(name, used, peak, limit, title)``: used filled, peak a
    tick, the limit the bar's full width (the largest value when unknown)."""
    full = max([r[3] or 0.0 for r in rows] + [r[2] or 0.0 for r in rows] +
               [r[1] for r in rows] + [1.0])
    height = TOP + 26 * max(1, len(rows)) + 8
    sx = _Scale(0.0, full, LABEL_W, WIDTH - RIGHT - 140)
    body: list[str] = []
    for i, (name, used, peak, limit, title) in enumerate(rows):
        y = TOP + i * 26
        end = sx(limit if limit else full)
        body.append(f'<text class="lane" x="{LABEL_W - 6}" y="{y + 15}" '
                    f'text-anchor="end">{escape(_cut(name, 28))}</text>')
        body.append(f'<rect class="limit" x="{LABEL_W}" y="{y + 2}" '
                    f'width="{_num(end - LABEL_W)}" height="16"/>')
        body.append(f'<rect class="used" x="{LABEL_W}" y="{y + 2}" '
                    f'width="{_num(sx(used) - LABEL_W)}" height="16">{_title(title)}</rect>')
        if peak is not None:
            body.append(f'<line class="peak" x1="{_num(sx(peak))}" y1="{y}" '
                        f'x2="{_num(sx(peak))}" y2="{y + 20}">'
                        f"{_title('peak ' + fmt(peak))}</line>")
        words = fmt(used) + (f" of {fmt(limit)}" if limit else "")
        body.append(f'<text class="tick" x="{_num(sx(full) + 8)}" y="{y + 15}">'
                    f"{escape(words)}</text>")
    return _svg(height, body, "device memory")


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
