"""The step line: steps/s, step time P50/P99 (with the timed steps they stand
on, where fewer than counted), busy %, where the run's time went
(:mod:`tpu_info.views.breakdown`), and their history.

Four lines under one border. The first says the numbers
(:func:`tpu_info.views.steps.step_line`: the same count and N/A words as the
CLI's Steps and Busy cells); the second is the step time per update as a
sparkline; the third marks, on the same time axis, the updates in which a
graph compiled (``▲``) or recompiled (``↻``); the fourth names the latest
recompile and its cause in the CLI's words (its "Last recompile causes").
Short layouts keep the first and the last. Where a value is N/A the line
says why in the words of ``tpu-info doctor``.

Example:
    >>> from tpu_info.views.derived import Derived, graph_row
    >>> seconds(Derived(0.00081)), seconds(Derived(None, "why"))
    ('810 us', 'N/A')
"""

from __future__ import annotations

import itertools

from rich.text import Text
from textual.events import Resize
from textual.widgets import Static

from tpu_info.contract.model import GraphRecord
from tpu_info.views.breakdown import breakdown
from tpu_info.views.cost import duration
from tpu_info.views.derived import Derived, graph_row
from tpu_info.views.steps import step_line, transfers_per_second
from tpu_info.views.values import clean, format_percent, last_cause
from tui.state import TargetData, series
from tui.widgets.common import Palette, reasons_tip, sparkline, view_of

LABEL = 10  # cells before the sparkline ("step time ")
FULL = 4  # content rows for the whole panel; fewer keep the numbers and the cause


def seconds(d: Derived[float]) -> str:
    """A step time as the cost words say it, ``N/A`` when missing."""
    return d.text(duration)


def markers(d: TargetData, width: int) -> str:
    """``·▲··↻`` aligned with :func:`~tui.widgets.common.sparkline`: a glyph
    in each update that brought a recompile (``↻``) or a first compile (``▲``)."""
    shown = list(itertools.islice(reversed(d.samples), max(0, width)))[::-1]
    cells = "".join("↻" if s.recompiles else "▲" if s.compiles else "·" for s in shown)
    return " " * (width - len(shown)) + cells


def newest_recompile(data: TargetData) -> tuple[float, GraphRecord] | None:
    """The graph whose real recompile is newest, and when (None: none)."""
    s = data.snapshot
    found = [(c.time_unix, g) for g in (s.graphs if s is not None else ())
             if g.causes and (c := last_cause(g)) is not None]
    return max(found, key=lambda x: x[0]) if found else None


def last_recompile(data: TargetData,
                   newest: tuple[float, GraphRecord] | None | bool = True) -> Text | None:
    """``last recompile 20s ago: jit(train_step): argument 'x' changed ... at
    loop.py:14`` in the CLI's words (:func:`~tpu_info.views.derived.graph_row`);
    ``newest`` is :func:`newest_recompile`'s answer when known."""
    if newest is True:
        newest = newest_recompile(data)
    if not newest or data.snapshot is None:
        return None
    when, g = newest  # type: ignore[misc]
    age = max(0.0, data.snapshot.taken_at_unix - when)
    return Text.assemble(("last recompile ", "bold"), f"{age:.0f}s ago: ",
                         (clean(g.name, 60), "bold"), ": ",
                         graph_row(data.target, g).cause.text())


def rate_text(v: float) -> str:
    """``1,234``, ``12.5``, ``0.40``, ``0`` (events a second)."""
    if v == 0:
        return "0"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 1 else f"{v:.2f}"


class StepsPanel(Static):
    """Steps/s, step time P50/P99, busy % and the last recompile of the picked process."""

    DEFAULT_CSS = """
    StepsPanel { height: 6; padding: 0 0; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.border_title = "Steps"
        self._last: tuple[object, ...] | None = None
        self._args: tuple[TargetData | None, Palette] | None = None
        self._cause: tuple[object, tuple[float, GraphRecord] | None] = (None, None)

    def on_resize(self, _event: Resize) -> None:
        if self._args is not None:
            self.show(*self._args)

    def show(self, data: TargetData | None, palette: Palette) -> None:
        """Redraws when the picked process's reading (or the size) changed."""
        self._args = (data, palette)
        width = max(20, self.size.width or 78)  # the size inside the border
        rows = max(1, self.size.height or FULL)
        key = (data.target if data else None, data.version if data else None, width, rows,
               palette)
        if key == self._last:
            return
        self._last = key
        cause = None
        if data is not None and data.snapshot is not None:
            # A new recompile adds a graph or a compile: scan the graphs only then.
            g = data.snapshot.graphs
            p = data.snapshot.process
            ckey = (data.target, p.pid if p else None, p.start_time_unix if p else None,
                    len(g), sum(x.compiles for x in g))
            if ckey != self._cause[0]:
                self._cause = (ckey, newest_recompile(data))
            cause = last_recompile(data, self._cause[1])
        text, tip = self.render_text(data, palette, width, rows, cause)
        self.update(text, layout=False)  # a fixed height: no relayout
        if tip != self.tooltip:
            self.tooltip = tip

    @staticmethod
    def render_text(data: TargetData | None, palette: Palette, width: int,
                    rows: int = FULL, cause: Text | None | bool = True) -> tuple[Text, str | None]:
        """The lines that fit ``rows`` and the tooltip (why each N/A is N/A);
        ``cause`` is the last-recompile line (True: find it)."""
        if data is None or data.snapshot is None:
            words = "no process picked" if data is None else "not read yet"
            return Text(words, style=palette.muted), None
        line = step_line(view_of(data), data.previous)
        muted = palette.muted
        t = Text(no_wrap=True, overflow="ellipsis")
        if not data.connected:
            t.append("last read: ", style=f"bold {palette.bad}")
        if line.steps.value is None:
            t.append("steps N/A", style=f"bold {palette.warn}")
            t.append(f"  {clean(line.steps.reason, 160)}", style=muted)
        else:
            t.append(line.per_second.text(rate_text), style="bold")
            t.append(" steps/s")
            t.append(f"  ({line.steps.value} in all)", style=muted)
            t.append("  mean step ")  # since the start, compiles included
            t.append(seconds(line.step_seconds), style="bold")
            t.append("  P50 ")
            t.append(seconds(line.p50_seconds), style="bold")
            t.append("  P99 ")
            t.append(seconds(line.p99_seconds), style="bold")
            if line.timed_note:  # the percentiles stand on fewer steps than counted
                t.append(f" ({line.timed_note})", style=muted)
        t.append("  busy ")
        if line.busy.value is not None:
            t.append(format_percent(line.busy.value), style="bold")
        else:
            t.append("N/A", style=f"bold {palette.warn}")
            t.append(f" ({clean(line.busy.reason, 120)})", style=muted)
        moves = transfers_per_second(data.previous, data.snapshot)
        if moves is not None:
            t.append(f"  transfers h->d {rate_text(moves[0])}/s d->h {rate_text(moves[1])}/s",
                     style=muted)
        if (time := breakdown(data.snapshot)) is not None and time.parts:
            t.append(f"  time: {time.short_line()}", style=muted)  # where the run's time went
        if line.steps.value is not None and line.p50_seconds.value is None:
            t.append(f"  P50/P99 N/A: {clean(line.p50_seconds.reason, 120)}", style=muted)
        if rows >= FULL:
            spark_w = max(4, width - LABEL)
            values = series(data.samples, "step_s", last=spark_w)
            t.append("\n")
            t.append(f"{'step time':<{LABEL}}", style=muted)
            t.append(sparkline(values, spark_w), style=palette.accent)
            t.append("\n")
            t.append(f"{'compiles':<{LABEL}}", style=muted)
            t.append(markers(data, spark_w), style=palette.warn)
        if rows >= 2:
            if cause is True:
                cause = last_recompile(data)
            t.append("\n")
            t.append_text(cause if isinstance(cause, Text)
                          else Text("no recompile seen", style=muted))
        return t, reasons_tip(line.na)
