"""Processes: one row per target; the highlighted row is the process picked.

Moving the cursor (or pressing Enter) posts :class:`ProcessesPanel.Picked`;
the app then shows that process's graphs, transfers, events and findings.
Values are the CLI's (:func:`tpu_info.views.derived.process_row`); the panel's
tooltip says why each N/A is N/A.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from rich.text import Text
from textual.message import Message

from tpu_info.views.derived import process_row
from tpu_info.views.values import clean, format_bytes, format_uptime
from tui.source import Conn
from tui.state import TargetData
from tui.widgets.common import Palette, hms, reasons_tip, view_of
from tui.widgets.header import GLYPH
from tui.widgets.table import LiveTable

COLUMNS = [("state", "", 1), ("pid", "PID", 7), ("name", "Name", 20),
           ("engine", "Engine", 16), ("uptime", "Up", 6), ("steps", "Steps", 10),
           ("compiles", "Compiles", 8), ("hbm", "HBM", 9), ("target", "Target", None)]
NARROW = ("uptime", "steps", "compiles")  # dropped below WIDE columns
WIDE = 120


def status_words(d: TargetData, tz: tzinfo | None) -> str:
    """``live``, ``polling``, ``disconnected since 15:05:10 (retry in 4s)``."""
    if d.state is Conn.DISCONNECTED:
        since = f" since {hms(d.since_unix, tz)}" if d.since_unix is not None else ""
        return f"disconnected{since}"
    return d.state.value


class ProcessesPanel(LiveTable):
    """Every target, its process and its connection state (the process picker)."""

    DEFAULT_CSS = """
    ProcessesPanel { height: auto; max-height: 10; }
    """

    class Picked(Message):
        """The user moved to (or chose) the process of ``target``."""

        def __init__(self, target: str, chosen: bool) -> None:
            super().__init__()
            self.target = target
            self.chosen = chosen

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=True, **kwargs)
        self.border_title = "Processes"
        self._wide: bool | None = None

    def show(self, targets: Sequence[TargetData], selected: str | None, palette: Palette,
             tz: tzinfo | None) -> None:
        """Brings every row up to date and puts the cursor on ``selected``."""
        keys = [d.target for d in targets]
        wide = (self.size.width or 80) >= WIDE
        if self.row_keys != keys or wide != self._wide:
            self._wide = wide
            self.reset([c for c in COLUMNS if wide or c[0] not in NARROW])
        missing: list[tuple[str, str]] = []
        for d in targets:
            self.put_row(d.target, self._cells(d, palette, tz, missing))
        tip = reasons_tip(missing)
        if tip != self.tooltip:
            self.tooltip = tip
        if selected in keys:
            row = keys.index(selected)  # type: ignore[arg-type]
            if self.cursor_row != row:
                self.move_cursor(row)

    def _cells(self, d: TargetData, palette: Palette, tz: tzinfo | None,
               missing: list[tuple[str, str]]) -> dict[str, object]:
        style = {Conn.STREAMING: palette.ok, Conn.POLLING: palette.ok,
                 Conn.CONNECTING: palette.muted, Conn.DISCONNECTED: palette.bad}[d.state]
        dim = "" if d.connected else palette.muted
        cells: dict[str, object] = {"state": Text(GLYPH[d.state], style=style),
                                    "target": Text(f"{clean(d.target, 40)} "
                                                   f"{status_words(d, tz)}", style=dim)}
        row = process_row(view_of(d)) if d.snapshot is not None else None
        if row is None:
            return cells
        missing += row.na
        cells.update({
            "pid": Text(row.pid.text(), style=dim),
            "name": Text(clean(row.name.text(), 20), style=dim),
            "engine": Text(clean(row.engine.text(), 16), style=dim),
            "uptime": Text(row.uptime_seconds.text(format_uptime), style=dim),
            "steps": Text(row.steps_short.text(), style=dim),
            "compiles": Text(row.compiles.text(), style=dim),
            "hbm": Text(row.hbm_used_bytes.text(format_bytes), style=dim),
        })
        return cells

    def on_live_table_highlighted(self, event: LiveTable.Highlighted) -> None:
        event.stop()
        self.post_message(self.Picked(event.key, chosen=False))

    def on_live_table_selected(self, event: LiveTable.Selected) -> None:
        event.stop()
        self.post_message(self.Picked(event.key, chosen=True))
