"""Events: what happened to the picked process, newest first.

Rows are the events that matter: compiles, recompiles with their cause,
graph breaks, cache hits, hook errors, and what the dashboard noticed itself
(a finding appearing, a disconnect, a reconnect). Steps and transfers come by
the thousand a second, so they are rates (the step line, Transfers), never
rows (:data:`tui.state.RATE_KINDS`).

Each row carries its clock time and its age against the latest sample, the
same time axis as the sparklines (one column per update), so "recompile 15s"
sits next to the dip 15 columns from the right of a sparkline at 1 s. An age
is never negative: an event stamped after the reading (clock skew between
threads or hosts) is 0 s old. Rows are keyed by sequence number; an update
draws only the rows it added and, once a second, the ages.
"""

from __future__ import annotations

from datetime import tzinfo

from rich.text import Text

from tpu_info.contract.model import COMPILE_KINDS, Event, EventKind
from tpu_info.views.findings import short_location
from tpu_info.views.values import clean, format_bytes
from tui.state import DISCONNECT, FINDING, RATE_KINDS, RECONNECT, TargetData
from tui.widgets.common import Palette, hms
from tui.widgets.table import LiveTable

SHOWN = 100  # newest matching events kept as rows
EMPTY = "__empty__"
_TRANSFERS: dict[str, str] = {EventKind.TRANSFER_TO_DEVICE: "h->d",
                              EventKind.TRANSFER_FROM_DEVICE: "d->h"}
_KINDS: dict[str, str] = {**_TRANSFERS, EventKind.CACHE_HIT: "cache hit",
                          EventKind.HOOK_ERROR: "hook error",
                          EventKind.GRAPH_BREAK: "graph break"}
COLUMNS = [("time", "Time", 8), ("age", "Age", 5), ("kind", "Kind", 11),
           ("name", "Name", 16), ("detail", "Detail", None)]
WITH_TIME = 100  # narrower panels drop the clock time (the age says when)


def columns(width: int) -> list[tuple[str, str, int | None]]:
    """The columns that fit ``width``: the detail (a recompile's cause) gets the rest."""
    return COLUMNS if width >= WITH_TIME else COLUMNS[1:]


def age_text(now: float, then: float) -> str:
    """``15s``: how long before ``now`` the event was; never negative.

    >>> age_text(100.0, 85.2), age_text(100.0, 100.4)
    ('15s', '0s')
    """
    return f"{max(0.0, now - then):.0f}s"


def shown_events(data: TargetData, text: str, limit: int = 0) -> list[Event]:
    """The rows of ``data``: its notable events and what the dashboard
    noticed, newest first, matching ``text`` (at most ``limit``; 0: all)."""
    merged = sorted((e for e in (*data.events, *data.noticed)
                     if e.kind not in RATE_KINDS and matches(e, text)),
                    key=lambda e: (e.time_unix, e.seq), reverse=True)
    return merged[:limit] if limit else merged


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
    """Compiles, recompiles and their causes, graph breaks, findings and disconnects
    of the picked process, newest on top (steps and transfers are rates)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "Events"
        self._shape: object = None
        self._ages: dict[str, str] = {}

    def show(self, data: TargetData | None, text: str, palette: Palette,
             tz: tzinfo | None) -> None:
        """Adds new events, drops old ones, and refreshes ages when they tick."""
        cols = columns(self.size.width or 80)
        shape = (data.target if data else None, text, palette, len(cols))
        if shape != self._shape:
            self._shape = shape
            self._ages.clear()
            self.reset(cols)
        wanted = shown_events(data, text, SHOWN) if data is not None else []
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
        now = max(data.snapshot.taken_at_unix if data is not None and data.snapshot else 0.0,
                  data.noticed[-1].time_unix if data is not None and data.noticed else 0.0)
        style: dict[str, str] = {
            EventKind.RECOMPILE: f"bold {palette.warn}", EventKind.COMPILE: palette.warn,
            EventKind.HOOK_ERROR: palette.bad, EventKind.GRAPH_BREAK: palette.warn,
            DISCONNECT: f"bold {palette.bad}", RECONNECT: palette.ok, FINDING: palette.accent,
            EventKind.CACHE_HIT: palette.muted}
        added = False
        order = {str(e.seq): i for i, e in enumerate(wanted)}
        for e in wanted:
            key = str(e.seq)
            age = age_text(now, e.time_unix)
            if self._ages.get(key) == age:
                continue
            added = added or key not in self._ages
            self._ages[key] = age
            self.put_row(key, {
                "time": hms(e.time_unix, tz), "age": Text(age, justify="right"),
                "kind": Text(clean(_KINDS.get(e.kind, e.kind), 12), style=style.get(e.kind, "")),
                "name": clean(e.name, 60), "detail": clean(detail(e), 120)})
        if added:
            self.order(order.__getitem__)
