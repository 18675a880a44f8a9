"""One finding: what it says, its source line, how it grew, and the advice.

Opened with Enter on a finding (or ``f``); follows the live data while it is
open; Escape goes back. The words are the CLI's; the history is one point per
refresh of the findings (:attr:`tui.state.TargetData.finding_history`), shown
as a sparkline of its cost and the refreshes at which its count or cost moved.
"""

from __future__ import annotations

import functools
import os
import re
from datetime import tzinfo

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from tpu_info.contract.model import Finding
from tpu_info.views.cost import duration, share_words
from tpu_info.views.derived import finding_line
from tpu_info.views.values import clean
from tui.state import FindingPoint, TargetData
from tui.widgets.common import Palette, hms, sparkline

SOURCE_BYTES = 8 * 2**20  # a source file larger than this is not read
HISTORY_ROWS = 12
FULL_TEXT = 4000  # a finding's words in its detail (the tables cut them at 600)
_LOCATION_RE = re.compile(r"^(?P<path>.+):(?P<line>\d+)$")
# Where a finding's words turn to advice: a sentence that starts with a capital
# (or a call, ``device_put the ...``) after the first.
_SENTENCE_RE = re.compile(r"(?<=[.!])\s+(?=[A-Z]|device_put |jax\.|torch\.)")


def split_advice(message: str) -> tuple[str, str]:
    """``(what happened, what to do)``: the first sentence, and the rest."""
    parts = _SENTENCE_RE.split(message, maxsplit=1)
    return (parts[0], parts[1]) if len(parts) == 2 else (message, "")


@functools.lru_cache(maxsize=64)  # read once, not at every refresh of an open detail
def source_lines(location: str | None, around: int = 1) -> tuple[tuple[int, str], ...] | None:
    """The lines of ``path:line`` (and ``around`` on each side) when the file
    is a readable regular file on this host; None otherwise."""
    m = _LOCATION_RE.match(location or "")
    if m is None:
        return None
    path, line = m.group("path"), int(m.group("line"))
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > SOURCE_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not 1 <= line <= len(lines):
        return None
    lo, hi = max(1, line - around), min(len(lines), line + around)
    return tuple((n, lines[n - 1]) for n in range(lo, hi + 1))


def _cost(p: FindingPoint) -> str:
    if p.seconds_per_step is not None and p.seconds_lost > 0:
        share = f" ({share_words(p.share_of_step)})" if p.share_of_step is not None else ""
        return f"{duration(p.seconds_per_step)}/step{share}"
    return duration(p.seconds_lost) if p.seconds_lost > 0 else "-"


def _history(points: list[FindingPoint], palette: Palette, tz: tzinfo | None,
             width: int) -> list[RenderableType]:
    if not points:
        return [Text("(no refresh recorded yet)", style=palette.muted)]
    out: list[RenderableType] = [Text.assemble(
        (f"{len(points)} refresh{'es' * (len(points) != 1)} since {hms(points[0].time_unix, tz)}"
         ", cost so far ", ""),
        (sparkline([p.seconds_lost for p in points], min(width, len(points))), palette.warn))]
    moved = [p for i, p in enumerate(points)
             if i == 0 or (p.count, p.seconds_lost) != (points[i - 1].count,
                                                        points[i - 1].seconds_lost)]
    t = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for col, right in (("Time", False), ("Count", True), ("Cost in all", True),
                       ("Per step", True)):
        t.add_column(col, justify="right" if right else "left", no_wrap=True)
    for p in reversed(moved[-HISTORY_ROWS:]):
        t.add_row(hms(p.time_unix, tz), "-" if p.count is None else f"{p.count:,}",
                  duration(p.seconds_lost) if p.seconds_lost > 0 else "-", _cost(p))
    more = len(moved) - HISTORY_ROWS
    out.append(t)
    if more > 0:
        out.append(Text(f"(and {more} earlier changes)", style=palette.muted))
    return out


def finding_body(f: Finding, d: TargetData, points: list[FindingPoint], palette: Palette,
                 tz: tzinfo | None, gone: bool = False) -> RenderableType:
    """Everything known about finding ``f`` of target ``d``."""
    line = finding_line(f, d.target)
    what, advice = split_advice(clean(f.message, FULL_TEXT))  # the whole of it, uncut
    level = {"warn": palette.warn, "FAIL": palette.bad}.get(line.level, palette.accent)
    parts: list[RenderableType] = [
        Text.assemble((line.level, f"bold {level}"), "  ", (line.kind, "bold"), "  ",
                      (f"cost {line.cost}", palette.muted)),
    ]
    if gone:
        parts.append(Text("no longer found in the latest refresh: showing the last words",
                          style=palette.warn))
    parts += [Text("\nWhat", style="bold underline"), Text(what)]
    parts.append(Text("\nSource line", style="bold underline"))
    if f.location:
        parts.append(Text(clean(f.location), style="bold"))
        lines = source_lines(f.location)
        if lines is None:
            parts.append(Text("(the file is not readable here: the program runs on another "
                              "host, or the file moved)", style=palette.muted))
        else:
            at = int(f.location.rpartition(":")[2])
            for n, src in lines:
                parts.append(Text.assemble((f"{'>' if n == at else ' '} {n:>5} | ",
                                            palette.muted),
                                           (clean(src, 200), "bold" if n == at else "")))
    else:
        parts.append(Text("(this finding has no single source line)", style=palette.muted))
    parts.append(Text("\nHistory", style="bold underline"))
    parts += _history(points, palette, tz, 60)
    parts += [Text("\nAdvice", style="bold underline"),
              Text(advice or "(the finding's words above say what to do)",
                   style="" if advice else palette.muted)]
    return Group(*parts)


class FindingScreen(Screen[None]):
    """One finding of one target, in full."""

    DEFAULT_CSS = """
    FindingScreen #finding-title { height: 1; padding: 0 1; background: $boost; }
    FindingScreen #finding-scroll { border: round $accent; padding: 0 1; }
    """

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, target: str, finding_id: str, tz: tzinfo | None) -> None:
        super().__init__()
        self.target = target
        self.finding_id = finding_id
        self.tz = tz
        self._key: object = None
        self._last: Finding | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"Finding {clean(self.finding_id.split('|')[0], 60)}  (esc: back)",
                     id="finding-title")
        with VerticalScroll(id="finding-scroll"):
            yield Static("", id="finding-body")
        yield Footer()

    def show(self, d: TargetData | None) -> None:
        """Redraws when the finding or its history changed."""
        f = None
        if d is not None:
            f = next((x for i, x in zip(d.finding_ids, d.findings, strict=False)
                      if i == self.finding_id), None)
        points = list(d.finding_history.get(self.finding_id, ())) if d is not None else []
        palette = Palette.of(self.app)
        key = (f, len(points), points[-1] if points else None, palette)
        if key == self._key:
            return
        self._key = key
        body = self.query_one("#finding-body", Static)
        shown = f or self._last
        if shown is None or d is None:
            body.update(Text("this finding is not in the latest refresh", style=palette.muted))
            return
        self._last = shown
        body.update(finding_body(shown, d, points, palette, self.tz, gone=f is None))
