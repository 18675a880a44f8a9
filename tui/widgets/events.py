"""Events: the picked process's recent events, newest first.

Each row carries its clock time and its age against the latest sample, the
same time axis as the device and transfer sparklines (one column per
update), so "recompile -15s" sits next to the dip 15 columns from the right
of a sparkline at 1 s. Rows are keyed by sequence number; an update draws
only the rows it added and, once a second, the ages.
"""

from __future__ import annotations

from datetime import tzinfo

from rich.text import Text

from tpu_info.contract.model import COMPILE_KINDS, Event, EventKind
from tpu_info.views.findings import short_location
from tpu_info.views.values import clean, format_bytes
from tui.state import TargetData
from tui.widgets.common import Palette, hms
from tui.widgets.table import LiveTable

SHOWN = 100  # newest matching events kept as rows
EMPTY = "__empty__"
_TRANSFERS: dict[str, str] = {EventKind.TRANSFER_TO_DEVICE: "h->d",
                              EventKind.TRANSFER_FROM_DEVICE: "d->h"}
_KINDS: dict[str, str] = {**_TRANSFERS, EventKind.CACHE_HIT: "cache hit",
                          EventKind.HOOK_ERROR: "hook error"}
COLUMNS = [("time", "Time", 8), ("age", "Age", 5), ("kind", "Kind", 9), ("name", "Name", None),
           ("detail", "Detail", None)]


def detail(e: Event) -> str:
    """Bytes for a transfer; cause, duration and source line for a compile."""
    if e.kind in _TRANSFERS and e.value is not None:
        return format_bytes(e.value)
    parts = [e.detail]
    if e.kind in COMPILE_KINDS and e.value is not None:
        parts.append(f"{e.value * 1e3:.0f} ms" if e.value < 1 else f"{e.value:.1f} s")
    if e.location:
        parts.append(f"at {short_location(e.location)}")
    return " ".join(p for p in parts if p)


def matches(e: Event, text: str) -> bool:
    """Case-insensitive match on name, kind and detail."""
    t = text.lower()
    return not t or t in e.name.lower() or t in e.kind or t in e.detail.lower()


class EventsPanel(LiveTable):
    """Recent events of the picked process, newest on top."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "Events"
        self._shape: object = None
        self._ages: dict[str, str] = {}

    def show(self, data: TargetData | None, text: str, palette: Palette,
             tz: tzinfo | None) -> None:
        """Adds new events, drops old ones, and refreshes ages when they tick."""
        shape = (data.target if data else None, text, palette)
        if shape != self._shape:
            self._shape = shape
            self._ages.clear()
            self.reset(COLUMNS)
        wanted: list[Event] = []
        if data is not None:
            for e in reversed(data.events):
                if len(wanted) >= SHOWN:
                    break
                if matches(e, text):
                    wanted.append(e)
        if not wanted:
            for key in list(self.row_keys):
                if key != EMPTY:
                    self.drop_row(key)
            self._ages.clear()
            why = "no events yet" if not text else f"no events match {text!r}"
            self.put_row(EMPTY, {"name": Text(why, style=palette.muted)})
            return
        self.drop_row(EMPTY)
        keep = {str(e.seq) for e in wanted}
        for key in [k for k in self.row_keys if k not in keep]:
            self.drop_row(key)
            self._ages.pop(key, None)
        now = data.snapshot.taken_at_unix if data is not None and data.snapshot else 0.0
        style: dict[str, str] = {
            EventKind.RECOMPILE: f"bold {palette.warn}", EventKind.COMPILE: palette.warn,
            EventKind.HOOK_ERROR: palette.bad, EventKind.STEP: palette.muted}
        added = False
        for e in wanted:
            key = str(e.seq)
            age = f"-{max(0.0, now - e.time_unix):.0f}s"
            if self._ages.get(key) == age:
                continue
            added = added or key not in self._ages
            self._ages[key] = age
            self.put_row(key, {
                "time": hms(e.time_unix, tz), "age": Text(age, justify="right"),
                "kind": Text(clean(_KINDS.get(e.kind, e.kind), 12), style=style.get(e.kind, "")),
                "name": clean(e.name, 60), "detail": clean(detail(e), 120)})
        if added:
            self.order(int, reverse=True)
