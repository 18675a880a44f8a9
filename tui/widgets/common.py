"""Small pure helpers the panels share: sparklines, bars, clock text, colours.

Colours come from the running theme (``$text-warning`` and friends are tuned
by Textual to be readable on that theme's background), so every panel reads
on dark and light themes alike.

Example:
    >>> sparkline([0, 1, 2, 3, None], 5, hi=3)
    '▁▃▆█ '
    >>> sparkline([1.0, float("nan"), float("inf")], 3)
    '█  '
    >>> hms(0.0, __import__("datetime").timezone.utc)
    '00:00:00'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

from rich.text import Text

from tpu_info.views.values import TargetView, clean, format_percent

if TYPE_CHECKING:
    from tui.state import TargetData

BLOCKS = " ▁▂▃▄▅▆▇█"
BAR_CELLS = 10


@dataclass(frozen=True, slots=True)
class Palette:
    """Rich colour names for cell text, taken from the app's theme."""

    ok: str = "green"
    warn: str = "yellow"
    bad: str = "red"
    accent: str = "cyan"
    muted: str = "dim"

    @classmethod
    def of(cls, app: object) -> Palette:
        """The palette of ``app``'s current theme (defaults when it has none)."""
        get = getattr(app, "get_css_variables", None)
        if get is None:
            return cls()
        v = get()
        return cls(ok=v.get("text-success", cls.ok), warn=v.get("text-warning", cls.warn),
                   bad=v.get("text-error", cls.bad), accent=v.get("text-primary", cls.accent))


def hms(t: float, tz: tzinfo | None = None) -> str:
    """``15:06:40`` in ``tz`` (None: local time)."""
    try:
        return datetime.fromtimestamp(t, tz=tz).strftime("%H:%M:%S")
    except (ValueError, OverflowError, OSError):  # not a time a clock can show
        return "--:--:--"


def sparkline(values: Sequence[float | None], width: int, lo: float = 0.0,
              hi: float | None = None) -> str:
    """The last ``width`` values as block characters, right-aligned.

    ``None`` (not reported) is a blank, a reported value at least ``▁``; the
    scale runs from ``lo`` to ``hi``
    (default: the largest value shown).
    """
    if width <= 0:
        return ""
    # A value that is not a finite number is drawn as not reported: the
    # client keeps them out at decode time, but a rate derived from two huge
    # readings can still overflow. (Drawn for every device at every refresh:
    # one pass, locals only.)
    tail = values[-width:]
    isfinite = math.isfinite
    top = hi
    if top is None:
        top = max((v for v in tail if v is not None and isfinite(v)), default=0.0)
    span = top - lo
    steps, last, low = len(BLOCKS) - 2, len(BLOCKS) - 1, BLOCKS[1]
    cells = []
    for v in tail:
        if v is None or not isfinite(v):
            cells.append(" ")
        elif span <= 0:
            cells.append(low)
        else:
            k = round((min(max(v, lo), top) - lo) / span * steps) + 1
            cells.append(BLOCKS[1 if k < 1 else last if k > last else k])
    return " " * (width - len(tail)) + "".join(cells)


def bar(percent: float, palette: Palette, cells: int = BAR_CELLS) -> Text:
    """``██████░░░░  62%`` coloured by how full it is (empty, ``N/A``, for a
    number that is not finite)."""
    if not math.isfinite(percent):
        return Text.assemble(("░" * cells, palette.muted), f" {'N/A':>4}")
    full = max(0, min(cells, round(percent / 100 * cells)))
    style = palette.bad if percent >= 90 else palette.warn if percent >= 70 else palette.ok
    return Text.assemble(("█" * full, style), ("░" * (cells - full), palette.muted),
                         f" {format_percent(percent):>4}")


def timeline(marks: Sequence[int], width: int, glyph: str = "▲") -> str:
    """A strip aligned with :func:`sparkline`: ``glyph`` where ``marks[i] > 0``."""
    shown = list(marks[-width:]) if width > 0 else []
    return " " * (width - len(shown)) + "".join(glyph if m else "·" for m in shown)


def cell_signature(value: object) -> object:
    """What decides whether a table cell must be redrawn (``Text.__eq__``
    ignores the base style, which carries our colours)."""
    if isinstance(value, Text):
        return (value.plain, str(value.style), tuple(value.spans))
    return value


def view_of(d: TargetData) -> TargetView:
    """``d`` as the CLI's :class:`~tpu_info.views.values.TargetView`, so the panels read
    the same derived values (:mod:`tpu_info.views.derived`) as the tables."""
    return TargetView(d.target, d.snapshot, d.error or d.state.value, d.source)


def reasons_tip(pairs: Iterable[tuple[str, str]], limit: int = 12) -> str | None:
    """A panel's tooltip: why each N/A in it is N/A, one line per reason
    (``tpu:0/busy, tpu:1/busy: the engine does not report busy %``); None
    when nothing is missing."""
    by_reason: dict[str, list[str]] = {}
    for where, why in pairs:
        what = by_reason.setdefault(clean(why, 200), [])
        short = clean(where.split("/", 2)[-1], 40)
        if short not in what:
            what.append(short)
    if not by_reason:
        return None
    lines = [f"{', '.join(w[:4])}{' ...' if len(w) > 4 else ''}: {why}"
             for why, w in list(by_reason.items())[:limit]]
    more = len(by_reason) - limit
    return "N/A because\n" + "\n".join(lines) + (f"\n(+{more} more: press n)" if more > 0 else "")
