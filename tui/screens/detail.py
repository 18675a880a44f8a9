"""One graph: its numbers, its signature history and every recompile cause.

Opened with Enter on a graph; follows the live data while it is open; Escape
goes back.
"""

from __future__ import annotations

from datetime import tzinfo

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from tpu_info.contract.model import GraphRecord
from tpu_info.views.derived import graph_row
from tpu_info.views.values import NA, clean, format_ns, presentable
from tui.state import TargetData
from tui.widgets.common import Palette, hms


def _kv(rows: list[tuple[str, str]]) -> Table:
    t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def _section(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


def detail_body(g: GraphRecord, d: TargetData, palette: Palette,
                tz: tzinfo | None) -> RenderableType:
    """Everything known about graph ``g`` of target ``d``."""
    snap = d.snapshot
    pid = snap.process.pid if snap is not None and snap.process else None
    row = graph_row(d.target, g)  # the CLI's values and reasons
    parts: list[RenderableType] = [
        Text.assemble((clean(g.name), f"bold {palette.warn}" if g.compiles > 1 else "bold"),
                      "  ", (g.hash, palette.muted)),
        _kv([("process", f"{clean(d.target)}" + (f"  pid {pid}" if pid else "")),
             ("engine", clean(g.engine) or NA),
             ("compiles", f"{g.compiles}  ({format_ns(g.compile_seconds_total * 1e9)} total, "
                          f"last {format_ns(g.compile_seconds_last * 1e9)})"),
             ("cache hits", str(g.cache_hits)),
             ("executions", row.executions.text() if g.executions is not None
              else f"{NA} ({clean(row.executions.reason)})"),
             ("first seen", hms(g.first_seen_unix, tz)),
             ("last seen", hms(g.last_seen_unix, tz))]),
        _section(f"Compile causes ({len(g.causes)}), newest first"),
    ]
    if g.causes:
        t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        t.add_column("time", no_wrap=True)
        t.add_column("cause", overflow="fold")
        for c in sorted(map(presentable, g.causes), key=lambda c: c.time_unix, reverse=True):
            what = Text(clean(c.description),
                        style=palette.warn if c.description != "first call" else "")
            what.append("\nat ")
            what.append(clean(c.location) if c.location else "(source line not reported)",
                        style="bold" if c.location else palette.muted)
            change = f"{clean(c.before or '?', 60)} -> {clean(c.after or '?', 60)}"
            if (c.before or c.after) and change not in c.description:
                what.append(f"\n{clean(c.argument or 'argument')}: {change}")
            t.add_row(hms(c.time_unix, tz), what)
        parts.append(t)
    else:
        parts.append(Text(f"({clean(row.cause.reason or 'no cause recorded')})",
                          style=palette.muted))
    parts += [
        _section("Signature"),
        Text(", ".join(clean(a, 80) for a in g.signature) or "(not reported)",
             style="" if g.signature else palette.muted),
        _section(f"Signature history ({len(g.signatures)})"),
    ]
    if g.signatures:
        t = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
        t.add_column("#", justify="right")
        t.add_column("Arguments", overflow="fold")
        for i, sig in enumerate(g.signatures, 1):
            t.add_row(str(i), ", ".join(clean(a, 80) for a in sig) or "()")
        parts.append(t)
    else:
        parts.append(Text("(the engine sent no signature history)", style=palette.muted))
    siblings = [x for x in (snap.graphs if snap else ()) if x.name == g.name and x.hash != g.hash]
    if siblings:
        parts.append(_section(f"Other graphs of {clean(g.name, 60)} ({len(siblings)})"))
        t = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
        for col in ("Graph", "Compiles", "Signature"):
            t.add_column(col, overflow="fold")
        for x in siblings:
            t.add_row(x.short_hash, str(x.compiles), ", ".join(clean(a, 60) for a in x.signature))
        parts.append(t)
    return Group(*parts)


class DetailScreen(Screen[None]):
    """Signature history and recompile causes of one graph."""

    DEFAULT_CSS = """
    DetailScreen #detail-title { height: 1; padding: 0 1; background: $boost; }
    DetailScreen #detail-scroll { border: round $accent; padding: 0 1; }
    """

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, target: str, graph_hash: str, tz: tzinfo | None) -> None:
        super().__init__()
        self.target = target
        self.graph_hash = graph_hash
        self.tz = tz
        self._key: object = None

    def compose(self) -> ComposeResult:
        yield Static(f"Graph {self.graph_hash[:12]}  (esc: back)", id="detail-title")
        with VerticalScroll(id="detail-scroll"):
            yield Static("", id="detail-body")
        yield Footer()

    def show(self, d: TargetData | None) -> None:
        """Redraws when the graph's record changed."""
        g = None
        if d is not None and d.snapshot is not None:
            g = next((x for x in d.snapshot.graphs if x.hash == self.graph_hash), None)
        palette = Palette.of(self.app)
        key = (g, d.state if d else None, palette)
        if key == self._key:
            return
        self._key = key
        body = self.query_one("#detail-body", Static)
        if g is None or d is None:
            body.update(Text(f"graph {self.graph_hash[:12]} is not in the latest snapshot",
                             style=palette.muted))
        else:
            body.update(detail_body(g, d, palette, self.tz))
