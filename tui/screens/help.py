"""The key reference (``?``): every key and every panel, read from the app.

Nothing here is a hand-kept list. The keys are the ``BINDINGS`` of the app,
of the main screen and of each panel's class (:func:`key_rows`), so a key
added anywhere shows up here; their words are the binding's tooltip, else
:data:`MORE` for an action that needs more than its short description, else
the description. The panels are the main screen's (:func:`panel_rows`): each
one's title and the first line of its class's docstring.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Static

# Longer words for actions whose short description (the footer's) is terse.
MORE = {
    "quit": "quit",
    "pause": "pause / resume drawing (data keeps arriving)",
    "cycle_sort": "cycle the graph sort",
    "filter": "filter graphs and events by name (esc closes, empty clears)",
    "reconnect": "reconnect disconnected targets now",
    "help": "this help (esc closes)",
    "next_panel": "next panel (in narrow terminals: show it)",
    "prev_panel": "previous panel",
    "close_filter": "close the filter box; clear the process filter (its box, or on Processes)",
    "filter_processes": "filter the processes by user or pid (alice 4242, user:bob pid:7)",
    "why_na": "why each N/A is N/A (hovering a panel says it too)",
    "select": "on a graph or a finding: its detail; on a process: pick it",
    "cursor(-1)": "move up", "cursor(1)": "move down",
    "page(-1)": "page up", "page(1)": "page down",
    "cursor(-1000000000)": "first row", "cursor(1000000000)": "last row",
}


def _bindings(cls: type) -> list[Binding]:
    """The bindings ``cls`` and its bases in this package define (Textual's own
    scrolling and focus keys are left out; tuples become Bindings)."""
    out: list[Binding] = []
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("tui."):
            continue
        for b in klass.__dict__.get("BINDINGS", ()):
            out.append(b if isinstance(b, Binding) else Binding(*b))
    return out


def key_rows(app: App[object], screen: Screen[object] | None) -> list[tuple[str, str, str]]:
    """``(where, key, words)`` for every binding of ``app``, of ``screen`` and
    of each of its panels (``.panel``), once each, in that order (the first
    place that defines a key names it)."""
    groups: list[tuple[str, Iterable[Binding]]] = [("anywhere", _bindings(type(app)))]
    if screen is not None:
        groups.append(("main screen", _bindings(type(screen))))
        for w in _panels(screen):
            groups.append(("in a panel", _bindings(type(w))))
    seen: set[tuple[str, str]] = set()
    rows = []
    for where, bindings in groups:
        for b in bindings:
            if b.system or (b.key, b.action) in seen:
                continue
            seen.add((b.key, b.action))
            words = b.tooltip or MORE.get(b.action) or b.description or b.action
            rows.append((where, app.get_key_display(b), words))
    return rows


def _panels(screen: Screen[object]) -> list[Widget]:
    try:
        return list(screen.query(".panel"))
    except Exception:  # noqa: BLE001 - a screen not mounted yet has no panels to list
        return []


def _title(w: Widget) -> str:
    return str(w.border_title or w.id or type(w).__name__)


def panel_rows(screen: Screen[object] | None) -> list[tuple[str, str]]:
    """``(title, what it shows)`` for each panel of ``screen``."""
    if screen is None:
        return []
    out = []
    for w in _panels(screen):
        doc = (type(w).__doc__ or "").strip().splitlines()
        out.append((_title(w), doc[0] if doc else ""))
    return out


class HelpScreen(ModalScreen[None]):
    """A box listing every key and every panel."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 95%; height: auto; max-height: 95%;
                                  border: round $accent; padding: 0 1; background: $surface; }
    HelpScreen Static { width: 100%; }
    HelpScreen .title { text-style: bold; }
    """

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("question_mark", "dismiss",
                                                              "Close", show=False)]

    def __init__(self, screen: Screen[object] | None = None) -> None:
        super().__init__()
        self.main = screen

    def compose(self) -> ComposeResult:
        main = self.main if self.main is not None else getattr(self.app, "main", None)
        keys = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        keys.add_column(style="dim", no_wrap=True)
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        last = ""
        for where, key, words in key_rows(self.app, main):
            keys.add_row(where if where != last else "", key, words)
            last = where
        panels = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        panels.add_column(style="bold", no_wrap=True)
        panels.add_column()
        for title, what in panel_rows(main):
            panels.add_row(title, what)
        with VerticalScroll():
            yield Static("tpu-info --watch: keys", classes="title")
            yield Static(keys)
            yield Static("")
            yield Static("panels", classes="title")
            yield Static(panels)
