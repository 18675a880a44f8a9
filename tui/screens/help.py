"""The key reference (``?``)."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("q", "quit"),
    ("p", "pause / resume drawing (data keeps arriving)"),
    ("s", "cycle the graph sort: compiles, compile time, executions"),
    ("/", "filter graphs and events by name (esc closes, empty clears)"),
    ("tab", "next panel (shift+tab: previous)"),
    ("enter", "on a graph: its detail; on a process: pick it"),
    ("r", "reconnect disconnected targets now"),
    ("n", "why each N/A is N/A (hovering a panel says it too)"),
    ("?", "this help (esc closes)"),
)


class HelpScreen(ModalScreen[None]):
    """A box listing every key."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: auto; max-width: 90%; height: auto;
                            border: round $accent; padding: 0 1; background: $surface; }
    """

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("question_mark", "dismiss",
                                                              "Close", show=False)]

    def compose(self) -> ComposeResult:
        t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        for key, what in KEYS:
            t.add_row(key, what)
        with Vertical():
            yield Static("tpu-info --watch: keys", classes="title")
            yield Static(t)
