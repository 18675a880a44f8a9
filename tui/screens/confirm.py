"""The confirmation before a signal: which process (pid, program, user,
command), which signal and what it does; ``y`` sends, ``n`` or ``esc``
cancels (the focus starts on Cancel, so Enter alone sends nothing)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tpu_info.views.values import clean
from tui.procs import Proc
from tui.signals import EFFECT, signal_name


def question(proc: Proc, sig: int, user: str) -> tuple[Text, Table]:
    """The dialog's words: the question and the process it names."""
    head = Text.assemble("Send ", (signal_name(sig), "bold"), f" ({int(sig)}) to ",
                         (f"pid {proc.pid}", "bold"), "?")
    rows = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    rows.add_column(style="dim", no_wrap=True)
    rows.add_column()
    rows.add_row("program", clean(proc.name or "?", 80))
    if proc.command:
        rows.add_row("command", clean(proc.command, 200))
    rows.add_row("user", f"{clean(user, 40)} (you)")
    rows.add_row("hooked", "yes" if proc.hooked else "no (it holds a chip)")
    rows.add_row(signal_name(sig), EFFECT.get(sig, ""))  # type: ignore[call-overload]
    return head, rows


class SignalScreen(ModalScreen[bool]):
    """Asks before a signal is sent; dismisses with True to send it."""

    DEFAULT_CSS = """
    SignalScreen { align: center middle; }
    SignalScreen > Vertical { width: 76; max-width: 95%; height: auto; max-height: 95%;
                              border: round $error; padding: 0 1; background: $surface; }
    SignalScreen #signal-buttons { height: auto; margin-top: 1; }
    SignalScreen Button { margin-right: 2; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Send"),
        Binding("n", "answer(False)", "Cancel"),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(self, proc: Proc, sig: int, user: str) -> None:
        super().__init__()
        self.proc = proc
        self.sig = sig
        self.user = user

    def compose(self) -> ComposeResult:
        head, rows = question(self.proc, self.sig, self.user)
        with Vertical():
            yield Static(head, id="signal-question")
            yield Static(rows, id="signal-process")
            with Horizontal(id="signal-buttons"):
                yield Button(f"Send {signal_name(self.sig)} (y)", variant="error", id="send")
                yield Button("Cancel (n, esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "send")

    def action_answer(self, send: bool) -> None:
        self.dismiss(send)
