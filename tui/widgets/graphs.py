"""Graphs: the picked process's compiled graphs, costliest per step first.

Rows are the program's own functions first, then (dimmed, under a line that
says so) the library's set-up graphs: JAX's own ``jit(_normal)`` and friends
compiled while it builds PRNG keys and arrays (the rule:
:mod:`tpu_info.views.graphs`). ``↻`` marks a graph that is a recompile (a
second graph of a function, or one compiled again), never a first compile;
Enter (or ``g`` from any panel) opens the graph's detail with every cause.
The Cost/step column is what a graph cost per step, compiling and running
(``~``: estimated), the same :class:`~tpu_info.views.cost.Cost` as the
findings'. Rows are keyed by graph hash and updated in place; a graph whose
record and cost text did not change costs one comparison; the table is
re-sorted only when a shown sort value changed or rows came or went.
Executions and causes are the CLI's (:func:`tpu_info.views.derived.graph_row`);
the panel's tooltip says why each N/A is N/A.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.message import Message

from tpu_info.contract.model import GraphRecord
from tpu_info.views.derived import graph_row
from tpu_info.views.graphs import (
    NO_STEPS,
    graph_costs,
    is_recompile,
    own_hashes,
    per_step_cell,
)
from tpu_info.views.values import clean, format_ns
from tui.state import TargetData
from tui.widgets.common import Palette, reasons_tip
from tui.widgets.table import LiveTable

SORTS = ("cost/step", "compiles", "compile time", "executions")
WIDE = 100  # panel width from which the last cause gets a column
HASH_CELLS = 8
SETUP_ROW = "~setup"  # the line above the library's set-up graphs (hashes are hex)
# A graph's cost per step moves at every step even when nothing else about it
# changed (its compile time spreads over more steps): those moves are drawn
# (and re-sorted) at most this often, so 500 graphs at 1 and 10 Hz stay cheap.
COST_EVERY_S = 2.0


class Shown:
    """What a row was drawn from: its record, the cost cell, and its group."""

    __slots__ = ("graph", "flag", "cost", "own", "per_step")

    def __init__(self, graph: GraphRecord, flag: bool, cost: str, own: bool,
                 per_step: float) -> None:
        self.graph, self.flag, self.cost, self.own, self.per_step = (graph, flag, cost, own,
                                                                     per_step)

    def same_record(self, other: Shown) -> bool:
        """Everything but the cost cell is as drawn."""
        return ((self.graph is other.graph or self.graph == other.graph)
                and (self.flag, self.own) == (other.flag, other.own))


def sort_key(sort: str, row: Shown) -> tuple[float, ...]:
    """Descending: the program's own graphs first, then by the chosen value
    (cost per step as shown, total cost when steps are unknown), then by
    executions (costs capped at the steady step tie: the graph that runs
    goes first), compile time and compiles."""
    g = row.graph
    execs = float(g.executions) if g.executions is not None else -1.0
    main = {"cost/step": row.per_step, "compiles": float(g.compiles),
            "compile time": g.compile_seconds_total, "executions": execs}[sort]
    return (float(row.own), main, execs, g.compile_seconds_total, float(g.compiles))


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
        self._shown: dict[str, Shown] = {}
        self._missing: dict[str, tuple[tuple[str, str], ...]] = {}  # hash -> its N/As
        self._setup = ""  # the set-up line's text ("": not shown)
        self.target: str | None = None
        self._fresh = True
        self._costs_due = 0.0  # monotonic time from which cost-only moves are drawn

    def _columns(self, width: int) -> list[tuple[str, str, int | None]]:
        fixed = [("hash", "Graph", HASH_CELLS), ("cost", "Cost/step", 9),
                 ("compiles", "Compiles", 8), ("time", "Compile", 8), ("execs", "Execs", 7),
                 ("hits", "Hits", 4)]
        n = len(fixed) + 1 + (1 if width >= WIDE else 0)
        room = max(10, width - 1 - sum(w for *_, w in fixed) - 2 * (n - 1))  # type: ignore[misc]
        if width >= WIDE:
            name_w = min(48, room // 2)
            return [fixed[0], ("name", "Name", name_w), *fixed[1:],
                    ("cause", "Last recompile cause", room - name_w)]
        return [fixed[0], ("name", "Name", room), *fixed[1:]]

    def show(self, data: TargetData | None, sort: str, text: str, palette: Palette) -> None:
        """Brings the rows up to date with ``data``'s graphs."""
        snap = data.snapshot if data is not None else None
        graphs = snap.graphs if snap is not None else ()
        target = data.target if data is not None else None
        cols = self._columns(self.scrollable_content_region.width or 80)
        shape = (target, tuple(cols), text, palette, data.connected if data else False)
        if shape != self._shape:
            self._shape = shape
            self.target = target
            self._shown.clear()
            self._missing.clear()
            self._setup = ""
            self.reset(cols)
            self._fresh = True
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
        own = own_hashes(snap) if snap is not None else frozenset()
        live = bool(shape[-1])
        now = time.monotonic()
        costs_now = now >= self._costs_due
        if costs_now:
            self._costs_due = now + COST_EVERY_S
        todo = []
        for g in keep:
            old = self._shown.get(g.hash)
            mine = g.hash in own
            kept = old is not None and old.graph is g and old.own == mine
            if costs_now or not kept:  # else only its cost can have moved: drawn when due
                todo.append((g, old, mine, kept))
        costs = graph_costs(snap, [g for g, *_ in todo]) if snap is not None else []
        with self.batch():  # after a step every cost cell may change: one refresh
            for (g, old, mine, kept), c in zip(todo, costs, strict=True):
                per_step = c.seconds_per_step
                value = float(f"{per_step if per_step is not None else c.seconds:.2g}")
                if kept and old.per_step == value:  # type: ignore[union-attr]
                    continue  # its cost moved less than the shown digits: drawn when it does
                cell = per_step_cell(c) if per_step is not None else "N/A"
                new = Shown(g, is_recompile(g), cell, mine, value)
                if old is not None and old.cost == cell and old.same_record(new):
                    continue
                if old is None or old.own != new.own or (
                        (costs_now or sort != "cost/step")
                        and sort_key(sort, old) != sort_key(sort, new)):
                    resort = True  # a cost that moved re-sorts at most every COST_EVERY_S
                self._shown[g.hash] = new
                if old is not None and old.same_record(new):  # only the cost moved
                    self.put_cell(g.hash, "cost", self._cost_cell(new, palette, live,
                                                                  per_step is None))
                    continue
                drawn = True
                self.put_row(g.hash, self._cells(target or "", new, palette, wide, live,
                                                 per_step is None))
        resort = self._setup_row(len(keep) - sum(r.own for r in self._shown.values()),
                                 palette) or resort
        if drawn or resort:  # the N/As changed only if a row did
            tip = reasons_tip(p for na in self._missing.values() for p in na
                              if wide or not p[0].endswith("/cause"))
            if tip != self.tooltip:
                self.tooltip = tip
        if resort or sort != getattr(self, "_sort", None):
            self._sort = sort
            self._resort(sort)

    def _setup_row(self, library: int, palette: Palette) -> bool:
        """The line above the library's set-up graphs, when there are both
        kinds; True when it came, went or changed."""
        shown = library and library < len(self._shown)
        said = f"library set-up: {library} graph{'s' * (library != 1)}" if shown else ""
        if said == self._setup:
            return False
        self._setup = said
        if not said:
            self.drop_row(SETUP_ROW)
        else:
            self.put_row(SETUP_ROW, {"hash": Text("─" * HASH_CELLS, style=palette.muted),
                                     "name": Text(said, style=palette.muted, no_wrap=True,
                                                  overflow="ellipsis")})
        return True

    def _resort(self, sort: str) -> None:
        fresh, self._fresh = self._fresh, False

        def key(k: str) -> tuple[float, ...]:
            if k == SETUP_ROW:
                return (0.5,)
            return sort_key(sort, self._shown[k])

        self.order(key, reverse=True)
        if fresh or not self.user_moved:  # the cursor follows the costliest until moved
            self.move_cursor(0)

    def _cells(self, target: str, row: Shown, palette: Palette, wide: bool,
               live: bool, no_steps: bool) -> dict[str, object]:
        g, flag = row.graph, row.flag
        info = graph_row(target, g)
        na = info.na
        if no_steps:
            na = (*na, (f"compilation/{target}/{g.short_hash}/cost_per_step", NO_STEPS))
        self._missing[g.hash] = na
        base = "" if live and row.own else palette.muted
        name_style = f"bold {palette.warn}" if flag else base
        cells: dict[str, object] = {
            "hash": Text(g.hash[:HASH_CELLS], style=base),
            "name": Text(("↻ " if flag else "") + clean(g.name, 120), style=name_style,
                         no_wrap=True, overflow="ellipsis"),
            "cost": self._cost_cell(row, palette, live, no_steps),
            "compiles": Text(str(g.compiles), style=name_style if g.compiles > 1 else base,
                             justify="right"),
            "time": Text(format_ns(g.compile_seconds_total * 1e9), style=base, justify="right"),
            "execs": Text(info.executions.text(),
                          style=base if g.executions is not None else palette.muted,
                          justify="right"),
            "hits": Text(str(g.cache_hits), style=base, justify="right"),
        }
        if wide:
            cells["cause"] = Text(info.cause.text(),
                                  style=palette.warn if info.cause.value else palette.muted,
                                  no_wrap=True, overflow="ellipsis")
        return cells

    @staticmethod
    def _cost_cell(row: Shown, palette: Palette, live: bool, no_steps: bool) -> Text:
        base = "" if live and row.own else palette.muted
        return Text(row.cost, style=palette.muted if no_steps else base, justify="right")

    def open_cursor(self) -> None:
        """Opens the detail of the graph under the cursor (the top one at first)."""
        self.action_select()

    def on_live_table_selected(self, event: LiveTable.Selected) -> None:
        event.stop()
        if self.target is not None and event.key != SETUP_ROW:
            self.post_message(self.Opened(self.target, event.key))
