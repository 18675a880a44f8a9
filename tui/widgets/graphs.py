"""Graphs: the picked process's compiled graphs, sortable and filterable.

A graph whose function compiled more than once is highlighted (``↻``). Rows
are keyed by graph hash and updated in place; a graph whose record did not
change costs one comparison. The table is re-sorted only when a sort value
changed or rows came or went. Enter posts :class:`GraphsPanel.Opened`.
Executions and causes are the CLI's (:func:`tpu_info.views.derived.graph_row`);
the panel's tooltip says why each N/A is N/A.
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.message import Message

from tpu_info.contract.model import GraphRecord
from tpu_info.views.derived import graph_row
from tpu_info.views.values import clean, format_ns
from tui.state import TargetData
from tui.widgets.common import Palette, reasons_tip
from tui.widgets.table import LiveTable

SORTS = ("compiles", "compile time", "executions")
WIDE = 100  # panel width from which the last cause gets a column
HASH_CELLS = 8


def sort_key(sort: str, g: GraphRecord) -> tuple[float, ...]:
    """Descending by the chosen value, then by compile time, then by hash."""
    execs = float(g.executions) if g.executions is not None else -1.0
    main = {"compiles": float(g.compiles), "compile time": g.compile_seconds_total,
            "executions": execs}[sort]
    return (main, g.compile_seconds_total, float(g.compiles))


def matches(g: GraphRecord, text: str) -> bool:
    """Case-insensitive substring match on name and hash."""
    t = text.lower()
    return not t or t in g.name.lower() or g.hash.lower().startswith(t)


class GraphsPanel(LiveTable):
    """The compiled graphs of one process."""

    class Opened(Message):
        """Enter on a graph: show its detail screen."""

        def __init__(self, target: str, graph_hash: str) -> None:
            super().__init__()
            self.target = target
            self.graph_hash = graph_hash

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=True, **kwargs)
        self.border_title = "Graphs"
        self._shape: tuple[object, ...] | None = None
        self._shown: dict[str, tuple[GraphRecord, bool]] = {}
        self._missing: dict[str, tuple[tuple[str, str], ...]] = {}  # hash -> its N/As
        self.target: str | None = None
        self._fresh = True

    def _columns(self, width: int) -> list[tuple[str, str, int | None]]:
        fixed = [("hash", "Graph", HASH_CELLS), ("compiles", "Compiles", 8),
                 ("time", "Compile", 8), ("execs", "Execs", 7), ("hits", "Hits", 4)]
        n = len(fixed) + 1 + (1 if width >= WIDE else 0)
        room = max(10, width - 1 - sum(w for *_, w in fixed) - 2 * (n - 1))  # type: ignore[misc]
        if width >= WIDE:
            name_w = min(48, room // 2)
            return [fixed[0], ("name", "Name", name_w), *fixed[1:],
                    ("cause", "Last recompile cause", room - name_w)]
        return [fixed[0], ("name", "Name", room), *fixed[1:]]

    def show(self, data: TargetData | None, sort: str, text: str, palette: Palette) -> None:
        """Brings the rows up to date with ``data``'s graphs."""
        graphs = data.snapshot.graphs if data is not None and data.snapshot is not None else ()
        target = data.target if data is not None else None
        cols = self._columns(self.scrollable_content_region.width or 80)
        shape = (target, tuple(cols), text, palette, data.connected if data else False)
        if shape != self._shape:
            self._shape = shape
            self.target = target
            self._shown.clear()
            self._missing.clear()
            self.reset(cols)
            self._fresh = True
        per_name = Counter[str]()
        for g in graphs:
            per_name[g.name] += g.compiles
        keep = [g for g in graphs if matches(g, text)]
        wanted = {g.hash for g in keep}
        resort = False
        for h in [h for h in self._shown if h not in wanted]:
            self.drop_row(h)
            del self._shown[h]
            self._missing.pop(h, None)
            resort = True
        wide = "cause" in {c[0] for c in cols}
        drawn = False
        for g in keep:
            flag = per_name[g.name] > 1
            old = self._shown.get(g.hash)
            if old is not None and old[1] == flag and (old[0] is g or old[0] == g):
                continue
            if old is None or sort_key(sort, old[0]) != sort_key(sort, g):
                resort = True
            self._shown[g.hash] = (g, flag)
            drawn = True
            self.put_row(g.hash, self._cells(target or "", g, flag, palette, wide,
                                             bool(shape[-1])))
        if drawn or resort:  # the N/As changed only if a row did
            tip = reasons_tip(p for na in self._missing.values() for p in na
                              if wide or not p[0].endswith("/cause"))
            if tip != self.tooltip:
                self.tooltip = tip
        if resort or sort != getattr(self, "_sort", None):
            self._sort = sort
            self._resort(sort)

    def _resort(self, sort: str) -> None:
        fresh, self._fresh = self._fresh, False
        self.order(lambda key: sort_key(sort, self._shown[key][0]), reverse=True)
        if fresh:
            self.move_cursor(0)

    def _cells(self, target: str, g: GraphRecord, flag: bool, palette: Palette, wide: bool,
               live: bool) -> dict[str, object]:
        row = graph_row(target, g)
        self._missing[g.hash] = row.na
        base = "" if live else palette.muted
        name_style = f"bold {palette.warn}" if flag else base
        cells: dict[str, object] = {
            "hash": g.hash[:HASH_CELLS],
            "name": Text(("↻ " if flag else "") + clean(g.name, 120), style=name_style,
                         no_wrap=True, overflow="ellipsis"),
            "compiles": Text(str(g.compiles), style=name_style if g.compiles > 1 else base,
                             justify="right"),
            "time": Text(format_ns(g.compile_seconds_total * 1e9), style=base, justify="right"),
            "execs": Text(row.executions.text(),
                          style=base if g.executions is not None else palette.muted,
                          justify="right"),
            "hits": Text(str(g.cache_hits), style=base, justify="right"),
        }
        if wide:
            cells["cause"] = Text(row.cause.text(),
                                  style=palette.warn if row.cause.value else palette.muted,
                                  no_wrap=True, overflow="ellipsis")
        return cells

    def on_live_table_selected(self, event: LiveTable.Selected) -> None:
        event.stop()
        if self.target is not None:
            self.post_message(self.Opened(self.target, event.key))
