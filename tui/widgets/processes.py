"""Processes: one row per target, then each chip owner without the hook.

nvidia-smi's bottom half: every hooked process (a target) and every other
process that holds one of this host's chips (from the host scan, as the
CLI's Processes table lists them: :func:`tpu_info.views.derived.owner_rows`).
The highlighted target row is the process picked: moving the cursor (or
Enter) posts :class:`ProcessesPanel.Picked` and the app shows that process's
graphs, transfers, events and findings; a chip owner has none of those.

``/`` (or ``u`` anywhere) filters the rows by user and pid
(:class:`~tui.procs.ProcessFilter`; the title says the filter, ``esc``
clears it); ``i``, ``t`` and ``k`` ask to send SIGINT, SIGTERM or SIGKILL to
the row's process (:class:`ProcessesPanel.SignalAsked`; the app refuses
another user's process and asks before it sends, :mod:`tui.signals`).
Values are the CLI's (:func:`tpu_info.views.derived.process_row`); the
panel's tooltip says why each N/A is N/A.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from tpu_info.contract.model import LocalScan
from tpu_info.views.derived import ProcessRow, process_row
from tpu_info.views.values import clean, format_bytes, format_uptime
from tui.procs import OWNER_PREFIX, Proc, ProcessFilter, owner_proc, target_proc
from tui.signals import SIGNALS
from tui.source import Conn
from tui.state import TargetData
from tui.widgets.common import Palette, hms, reasons_tip, view_of
from tui.widgets.header import GLYPH
from tui.widgets.table import Column, LiveTable

COLUMNS: list[Column] = [
    ("state", "", 1), ("pid", "PID", 7), ("user", "User", 8), ("name", "Name", 20),
    ("engine", "Engine", 16), ("uptime", "Up", 6), ("steps", "Steps", 10),
    ("compiles", "Compiles", 8), ("hbm", "HBM", 9), ("target", "Target", None)]
NARROW = ("uptime", "steps", "compiles")  # dropped below WIDE columns
NARROW_WIDTHS = {"name": 16, "engine": 10}
WIDE = 120
TITLE = "Processes"


def status_words(d: TargetData, tz: tzinfo | None) -> str:
    """``live``, ``polling``, ``disconnected since 15:05:10 (retry in 4s)``."""
    if d.state is Conn.DISCONNECTED:
        since = f" since {hms(d.since_unix, tz)}" if d.since_unix is not None else ""
        return f"disconnected{since}"
    return d.state.value


def columns(wide: bool) -> list[Column]:
    """The columns at this width (narrow: no Up, Steps, Compiles; shorter names)."""
    if wide:
        return list(COLUMNS)
    return [(k, label, NARROW_WIDTHS.get(k, w)) for k, label, w in COLUMNS if k not in NARROW]


class ProcessesPanel(LiveTable):
    """Every target and every chip owner: pick one, filter by user or pid, signal yours."""

    DEFAULT_CSS = """
    ProcessesPanel { height: auto; max-height: 10; }
    """

    BINDINGS = [
        Binding("slash", "filter_processes", "Filter",
                tooltip="on Processes: filter them by user or pid (as u)"),
        Binding("i", "signal('i')", "SIGINT",
                tooltip="on Processes: SIGINT (Ctrl-C) to the row's process (yours; asks first)"),
        Binding("t", "signal('t')", "SIGTERM",
                tooltip="on Processes: SIGTERM to the row's process (yours; asks first)"),
        Binding("k", "signal('k')", "SIGKILL",
                tooltip="on Processes: SIGKILL to the row's process (yours; asks first)"),
    ]

    class Picked(Message):
        """The user moved to (or chose) the process of ``target``."""

        def __init__(self, target: str, chosen: bool) -> None:
            super().__init__()
            self.target = target
            self.chosen = chosen

    class SignalAsked(Message):
        """``i``/``t``/``k`` on a row: send ``sig`` to ``proc`` (after the app's checks)."""

        def __init__(self, proc: Proc, sig: int) -> None:
            super().__init__()
            self.proc = proc
            self.sig = sig

    class FilterAsked(Message):
        """``/`` on the panel: open the process filter."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=True, **kwargs)
        self.border_title = TITLE
        self._wide: bool | None = None
        self.procs: dict[str, Proc] = {}  # every row's process, shown or filtered out

    def show(self, targets: Sequence[TargetData], selected: str | None, palette: Palette,
             tz: tzinfo | None, owners: Sequence[ProcessRow] = (), *,
             local: LocalScan | None = None, host: str = "",
             flt: ProcessFilter | None = None) -> None:
        """Brings every row up to date and puts the cursor on ``selected``
        (unless the user moved it onto a chip owner, which stays).

        Args:
            targets: the hooked targets, in order.
            selected: the picked target.
            palette: colours.
            tz: time zone of the clock times.
            owners: chip owners without the hook (:func:`~tpu_info.views.derived.owner_rows`).
            local: the host scan that named them.
            host: this host's name (the owners run here).
            flt: show only the rows it matches.
        """
        flt = flt or ProcessFilter()
        rows: list[tuple[str, Proc, TargetData | ProcessRow]] = []
        for d in targets:
            rows.append((d.target, target_proc(d), d))
        for o in owners:
            pid = o.pid.value
            if pid is not None:
                p = owner_proc(pid, local.owner(pid) if local else None, host)
                rows.append((p.key, p, o))
        self.procs = {key: p for key, p, _ in rows}
        shown = [r for r in rows if flt.matches(r[1])] if flt else rows
        keys = [key for key, _, _ in shown]
        wide = (self.size.width or 80) >= WIDE
        keep = self.cursor_key if self.user_moved and _is_owner(self.cursor_key) else None
        if self.row_keys != keys or wide != self._wide:
            self._wide = wide
            self.reset(columns(wide))
        missing: list[tuple[str, str]] = []
        for key, _, what in shown:
            cells = (self._cells(what, palette, tz, missing) if isinstance(what, TargetData)
                     else self._owner_cells(what, palette, missing))
            self.put_row(key, cells)
        tip = reasons_tip(missing)
        if tip != self.tooltip:
            self.tooltip = tip
        title = f"{TITLE} · {flt.words()}" if flt else TITLE
        if title != self.border_title:
            self.border_title = title
        sub = (f"{len(shown)} of {len(rows)} shown · esc clears" if flt and shown
               else f"none of {len(rows)} match · esc clears" if flt else "")
        if sub != (self.border_subtitle or ""):
            self.border_subtitle = sub
        # Placed, not moved by the user: no Picked (a stale one, handled after
        # the selection changed again, would pick the process it named back).
        if keep in keys:
            self.move_cursor(keys.index(keep), announce=False)  # type: ignore[arg-type]
            self.user_moved = True
        elif selected in keys:
            self.move_cursor(keys.index(selected), announce=False)  # type: ignore[arg-type]

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
            "user": Text(clean(row.user.text(), 32), style=dim),
            "name": Text(clean(row.name.text(), 20), style=dim),
            "engine": Text(clean(row.engine.text(), 16), style=dim),
            "uptime": Text(row.uptime_seconds.text(format_uptime), style=dim),
            "steps": Text(row.steps_short.text(), style=dim),
            "compiles": Text(row.compiles.text(), style=dim),
            "hbm": Text(row.hbm_used_bytes.text(format_bytes), style=dim),
        })
        return cells

    @staticmethod
    def _owner_cells(row: ProcessRow, palette: Palette,
                     missing: list[tuple[str, str]]) -> dict[str, object]:
        """A chip owner without the hook: pid, user, command, its chips."""
        missing += row.na
        muted = palette.muted
        return {
            "state": Text("·", style=muted),
            "pid": Text(row.pid.text()),
            "user": Text(clean(row.user.text(), 32)),
            "name": Text(clean(row.name.text(), 60)),
            "engine": Text(row.engine.text(), style=muted),
            "hbm": Text(row.hbm_used_bytes.text(format_bytes)),
            "target": Text(f"holds {row.chips.text()}", style=muted),
        }

    # Keys and messages ---------------------------------------------------------

    def cursor_proc(self) -> Proc | None:
        """The process of the row under the cursor."""
        key = self.cursor_key
        return self.procs.get(key) if key is not None else None

    def action_signal(self, key: str) -> None:
        p = self.cursor_proc()
        if p is not None:
            self.post_message(self.SignalAsked(p, SIGNALS[key]))

    def action_filter_processes(self) -> None:
        self.post_message(self.FilterAsked())

    def on_live_table_highlighted(self, event: LiveTable.Highlighted) -> None:
        event.stop()
        if not _is_owner(event.key):
            self.post_message(self.Picked(event.key, chosen=False))

    def on_live_table_selected(self, event: LiveTable.Selected) -> None:
        event.stop()
        if not _is_owner(event.key):
            self.post_message(self.Picked(event.key, chosen=True))
            return
        p = self.procs.get(event.key)
        if p is not None:
            self.notify(f"{p.label()} holds a chip without the hook: no graphs to show "
                        "(tpu-info run -- ... hooks a program); i/t/k signal it", timeout=4)


def _is_owner(key: str | None) -> bool:
    return key is not None and key.startswith(OWNER_PREFIX)
