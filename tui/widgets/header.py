"""The top line: host(s), refresh interval, clock, and each target's state.

Example:
    >>> from tui.state import TargetData
    >>> line = header_text(HeaderInfo(("h",), 1.0, 0.0, (TargetData("a:1"),)), Palette(), None)
    >>> "every 1s" in line.plain and "a:1 connecting" in line.plain
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo

from rich.text import Text
from textual.widgets import Static

from tpu_info.views.values import clean
from tui.source import Conn
from tui.state import TargetData
from tui.widgets.common import Palette, hms

GLYPH = {Conn.STREAMING: "●", Conn.POLLING: "◐", Conn.CONNECTING: "○",
         Conn.DISCONNECTED: "✖"}


@dataclass(frozen=True, slots=True)
class HeaderInfo:
    """What the header shows; the screen builds one per refresh."""

    hosts: tuple[str, ...]
    interval_s: float
    now_unix: float
    targets: Sequence[TargetData]
    selected: str | None = None
    paused: bool = False
    sort: str = ""
    filter: str = ""


def state_text(d: TargetData, palette: Palette, tz: tzinfo | None) -> Text:
    """``● host:port live`` or ``✖ host:port disconnected since 15:05:10``."""
    style = {Conn.STREAMING: palette.ok, Conn.POLLING: palette.ok,
             Conn.CONNECTING: palette.muted, Conn.DISCONNECTED: palette.bad}[d.state]
    words = d.state.value
    if d.state is Conn.DISCONNECTED and d.since_unix is not None:
        words = f"disconnected since {hms(d.since_unix, tz)}"
    return Text.assemble((GLYPH[d.state], style), " ", clean(d.target, 60), " ", (words, style))


def _interval(s: float) -> str:
    return f"{s:g}s"


def header_text(info: HeaderInfo, palette: Palette, tz: tzinfo | None) -> Text:
    """The header as one (wrapping) line of text."""
    hosts = ", ".join(clean(h, 40) for h in info.hosts[:3]) or "-"
    if len(info.hosts) > 3:
        hosts += f" +{len(info.hosts) - 3}"
    t = Text.assemble(("tpu-info", "bold"), "  ", (hosts, "bold"),
                      f"  every {_interval(info.interval_s)}  ", hms(info.now_unix, tz))
    if info.paused:
        t.append("  PAUSED", style=f"bold reverse {palette.warn}")
    if info.filter:
        t.append(f"  filter: {clean(info.filter, 30)}", style=palette.accent)
    for d in info.targets[:6]:
        t.append("  ")
        t.append_text(state_text(d, palette, tz))
        if d.target == info.selected and len(info.targets) > 1:
            t.append("◂", style="bold")
    if len(info.targets) > 6:
        t.append(f"  +{len(info.targets) - 6} more")
    return t


class HeaderBar(Static):
    """One or two lines at the top of the main screen."""

    DEFAULT_CSS = """
    HeaderBar {
        height: auto;
        max-height: 3;
        padding: 0 1;
        background: $boost;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self._last: Text | None = None

    def show(self, info: HeaderInfo, palette: Palette, tz: tzinfo | None) -> None:
        """Redraws only when the text changed."""
        text = header_text(info, palette, tz)
        last = self._last
        if last is None or text.plain != last.plain or text.spans != last.spans:
            self._last = text
            # Only a change of length can change the wrapping (and so the height).
            self.update(text, layout=last is None or len(text.plain) != len(last.plain))
