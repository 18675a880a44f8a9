"""Why N/A (``n``): every value the dashboard cannot show, and why.

The list is :meth:`tpu_info.views.derived.RunReadings.reasons` of the targets as
read so far: the same ``where: why`` lines as ``tpu-info doctor`` and the
``na`` list of ``tpu-info --json``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tpu_info.contract.model import LocalScan
from tpu_info.views.derived import readings
from tpu_info.views.values import Header, clean
from tui.state import TargetData
from tui.widgets.common import view_of


def reasons_table(targets: Sequence[TargetData], local: LocalScan | None = None,
                  host: str = "", all_chips: bool = False) -> Table | Text:
    """``where`` and ``why`` for every N/A of ``targets`` (their latest data) and of
    this host's chips (``local``), as the Devices panel lists them."""
    run = readings([view_of(d) for d in targets], local=local,
                   header=Header(host=host, time_unix=0.0), all_chips=all_chips)
    pairs = [(w, r) for w, r in run.reasons() if not w.startswith("header/")]
    if not pairs:
        return Text("every value was read")
    t = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    t.add_column("N/A", overflow="fold")
    t.add_column("why", overflow="fold")
    for where, why in pairs:
        t.add_row(Text(clean(where, 120)), Text(clean(why, 600)))
    return t


class ReasonsScreen(ModalScreen[None]):
    """A box listing why each N/A is N/A."""

    DEFAULT_CSS = """
    ReasonsScreen { align: center middle; }
    ReasonsScreen > VerticalScroll { width: 90%; max-height: 90%; height: auto;
                                     border: round $accent; padding: 0 1;
                                     background: $surface; }
    """

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("n", "dismiss", "Close",
                                                              show=False)]

    def __init__(self, targets: Sequence[TargetData], local: LocalScan | None = None,
                 host: str = "", all_chips: bool = False) -> None:
        super().__init__()
        self.targets = list(targets)
        self.local, self.host, self.all_chips = local, host, all_chips

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("Why N/A (esc closes)", classes="title")
            yield Static(reasons_table(self.targets, self.local, self.host, self.all_chips),
                         id="reasons-body")
