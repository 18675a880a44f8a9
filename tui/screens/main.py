"""The main screen: header, devices, and the panels of the picked process.

Wide terminals (140 columns and 30 rows, or more) show every panel at once:
devices, processes and findings (costliest first, one line each) across the
top, graphs on the left, transfers and events on the right. Narrow ones
(80x24) keep nvidia-smi's two halves on the first screen, devices and then
processes (a few rows, scrolling), and show one of the other panels below,
named in a tab line; short ones (under 30 rows) draw the step line without
its frame to leave that panel room. ``tab`` moves between panels in both
layouts. ``g`` and ``f`` open the detail of the graph and of the finding
under each cursor (the costliest at first) from any panel. ``n`` lists why
each N/A is N/A; each panel's tooltip says it too. ``u`` (or ``/`` on the
Processes panel) filters the processes by user and pid.

The step line is redrawn at every update (at 10 Hz, ten times a second); the
other panels at most every :data:`SLOW_S` seconds and always after the last
update, so a fast refresh costs little more than the step line.
"""

from __future__ import annotations

import time
from datetime import tzinfo
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer, Input, Static

from tpu_info.views.derived import owner_rows
from tpu_info.views.values import clean
from tui.procs import ProcessFilter
from tui.screens.reasons import ReasonsScreen
from tui.source import Conn
from tui.state import WatchState
from tui.widgets.common import Palette, hms
from tui.widgets.devices import DevicesPanel, join
from tui.widgets.events import EventsPanel
from tui.widgets.findings import FindingsPanel
from tui.widgets.graphs import GraphsPanel
from tui.widgets.header import HeaderBar, HeaderInfo
from tui.widgets.processes import ProcessesPanel
from tui.widgets.steps import StepsPanel
from tui.widgets.transfers import TransfersPanel

if TYPE_CHECKING:
    from collections.abc import Callable

SLOW_S = 0.5  # the slowest redraw of every panel but the step line
PANELS = ("devices", "graphs", "processes", "transfers", "events", "findings")
TABBED = ("graphs", "transfers", "events", "findings")  # narrow: one at a time, below
WIDE_COLUMNS = 140
TALL_ROWS = 30


class PanelTabs(Static):
    """Narrow layouts: which lower panel is showing."""

    DEFAULT_CSS = """
    PanelTabs { height: 1; padding: 0 1; background: $boost; }
    """

    def show(self, active: str) -> None:
        t = Text()
        for name in TABBED:
            label = f" {name.capitalize()} "
            t.append(label, style="reverse bold" if name == active else "")
            t.append(" ")
        t.append(" tab: next", style="dim")
        self.update(t)


class MainScreen(Screen[None]):
    """Everything at once (wide) or devices plus one panel (narrow)."""

    DEFAULT_CSS = """
    MainScreen { layout: vertical; }
    MainScreen .panel { border: round $primary 40%; border-title-color: $text; }
    MainScreen .panel:focus, MainScreen .panel:focus-within { border: round $accent; }
    #banner { height: auto; padding: 0 1; background: $error 30%; color: $text; display: none; }
    #bottom { height: 1fr; }
    #graphs { width: 3fr; height: 1fr; }
    #side { width: 2fr; height: 1fr; }
    #events { height: 1fr; }
    #filter, #process-filter { dock: bottom; display: none; margin-bottom: 1; }
    MainScreen.-narrow #graphs { width: 1fr; }
    MainScreen.-narrow #side { width: 1fr; }
    MainScreen.-narrow #side > .panel { height: 1fr; max-height: 100%; }
    MainScreen.-narrow #findings { height: 1fr; max-height: 100%; }
    MainScreen.-narrow #devices { max-height: 45%; }
    MainScreen.-narrow #steps { height: 4; }
    MainScreen.-narrow.-short #devices { max-height: 40%; }
    MainScreen.-narrow.-short #processes { max-height: 6; }
    MainScreen.-narrow.-short #steps { height: 2; border: none; padding: 0 1;
                                        background: $boost; }
    """

    BINDINGS = [
        Binding("tab", "next_panel", "Panel", priority=True),
        Binding("shift+tab", "prev_panel", "Prev panel", show=False, priority=True),
        Binding("escape", "close_filter", "Close filter", show=False),
        Binding("u", "filter_processes", "Filter processes", show=False),
        Binding("n", "why_na", "Why N/A", show=False),
        Binding("g", "open_graph", "Graph detail"),
        Binding("f", "open_finding", "Finding detail"),
    ]

    class ProcessFilterChanged(Message):
        """The process filter changed (the app may pick another process)."""

    def __init__(self, state: WatchState, clock: Callable[[], float], tz: tzinfo | None) -> None:
        super().__init__()
        self.state = state
        self.clock = clock
        self.tz = tz
        self.active = "graphs"
        self.narrow = True
        self.short = True
        self.palette = Palette()
        self._slow_due = 0.0
        self._slow_timer: Timer | None = None
        self.monotonic: Callable[[], float] = time.monotonic  # when the slow panels are due

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Static(id="banner")
        yield DevicesPanel(id="devices", classes="panel")
        yield ProcessesPanel(id="processes", classes="panel")
        yield StepsPanel(id="steps", classes="panel")
        yield PanelTabs(id="tabs")
        yield FindingsPanel(id="findings", classes="panel")
        with Horizontal(id="bottom"):
            yield GraphsPanel(id="graphs", classes="panel")
            with Vertical(id="side"):
                yield TransfersPanel(id="transfers", classes="panel")
                yield EventsPanel(id="events", classes="panel")
        yield Input(id="filter", placeholder="filter graphs and events (enter: keep, esc: close)")
        yield Input(id="process-filter", placeholder="filter processes: user or pid, e.g. alice "
                    "4242, user:bob pid:7 (enter: keep, esc: clear)")
        yield Footer()

    def on_mount(self) -> None:
        self.palette = Palette.of(self.app)
        self._layout()
        self.query_one(GraphsPanel).focus()
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)
        self.show_all()

    def _theme_changed(self, _theme: object) -> None:
        self.palette = Palette.of(self.app)
        self.show_all()

    # Layout -----------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        self._layout()
        self.call_after_refresh(self.show_all)

    def _layout(self) -> None:
        size = self.app.size
        self.narrow = size.width < WIDE_COLUMNS or size.height < TALL_ROWS
        self.short = size.height < TALL_ROWS
        self.set_class(self.narrow, "-narrow")
        self.set_class(self.short, "-short")
        self.query_one(PanelTabs).display = self.narrow
        for name in TABBED:
            self.query_one(f"#{name}").display = not self.narrow or name == self.active
        self.query_one("#bottom").display = not self.narrow or self.active != "findings"
        self.query_one("#side").display = (not self.narrow
                                           or self.active in ("transfers", "events"))
        if self.narrow:
            self.query_one(PanelTabs).show(self.active)

    def panel(self, name: str) -> Widget:
        return self.query_one(f"#{name}")

    def _focused_panel(self) -> str:
        node = self.focused
        while node is not None:
            if node.id in PANELS:
                return node.id  # type: ignore[return-value]
            node = node.parent  # type: ignore[assignment]
        return self.active

    def switch_to(self, name: str) -> None:
        """Shows (in narrow layouts) and focuses panel ``name``."""
        if name in TABBED:
            self.active = name
            self._layout()
        self.panel(name).focus()
        self.call_after_refresh(self.show_all)

    def action_next_panel(self, step: int = 1) -> None:
        i = PANELS.index(self._focused_panel())
        self.switch_to(PANELS[(i + step) % len(PANELS)])

    def action_prev_panel(self) -> None:
        self.action_next_panel(-1)

    def action_open_graph(self) -> None:
        """The detail of the graph under the Graphs cursor (the costliest at
        first), from any panel: the cause of a recompile is one key away."""
        self.query_one(GraphsPanel).open_cursor()

    def action_open_finding(self) -> None:
        """The detail of the finding under the Findings cursor (the costliest at first)."""
        self.query_one(FindingsPanel).open_cursor()

    def action_why_na(self) -> None:
        """Lists why each N/A is N/A (the words of ``tpu-info doctor``)."""
        s = self.state
        self.app.push_screen(ReasonsScreen(s.ordered(), s.local, s.host, s.all_chips))

    # Filter -----------------------------------------------------------------

    def open_filter(self) -> None:
        self.query_one("#process-filter", Input).display = False  # one box at a time
        box = self.query_one("#filter", Input)
        box.value = self.state.filter
        box.display = True
        box.focus()

    def action_close_filter(self) -> None:
        """Esc: closes the graphs filter (kept); clears and closes the process
        filter; on the Processes panel, clears its filter."""
        box = self.query_one("#filter", Input)
        pbox = self.query_one("#process-filter", Input)
        if pbox.display:
            pbox.display = False
            self.set_process_filter(ProcessFilter())
            self.panel("processes").focus()
        elif box.display:
            box.display = False
            self.panel(self.active).focus()
        elif self.state.process_filter and self._focused_panel() == "processes":
            self.set_process_filter(ProcessFilter())

    def action_filter_processes(self) -> None:
        """Opens the process filter (user and pid) under the panels."""
        self.query_one("#filter", Input).display = False  # one box at a time
        box = self.query_one("#process-filter", Input)
        box.value = self.state.process_filter.text()
        box.display = True
        box.focus()

    def on_processes_panel_filter_asked(self, _message: ProcessesPanel.FilterAsked) -> None:
        self.action_filter_processes()

    def set_process_filter(self, flt: ProcessFilter) -> None:
        if flt != self.state.process_filter:
            self.state.process_filter = flt
            self.post_message(self.ProcessFilterChanged())
        self.show_all()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "process-filter":
            try:
                flt = ProcessFilter.parse(event.value)
            except ValueError as e:  # half typed: the last good filter stays
                self.query_one(ProcessesPanel).border_subtitle = f"{clean(str(e), 60)}"
                return
            self.set_process_filter(flt)
            return
        self.state.filter = event.value
        self.show_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "process-filter":
            event.input.display = False
            self.panel("processes").focus()
            return
        self.action_close_filter()

    # Drawing ----------------------------------------------------------------

    def show_all(self) -> None:
        """Redraws every panel from :attr:`state` (each skips what did not change)."""
        if not self.is_mounted:
            return
        self.show_target(None)

    def show_target(self, target: str | None) -> None:
        """Redraws what ``target``'s update touches (None: everything): the
        step line (its steps/s and transfers/s) and the banner at every update,
        the rest when due (:meth:`_show_slow`)."""
        s = self.state
        self.show_header()
        if target is None or target == s.selected:
            self.query_one(StepsPanel).show(s.current(), self.palette)
            self._banner()
        self._show_slow(force=target is None)

    def _show_slow(self, force: bool = False) -> None:
        """Devices, graphs, transfers, processes, events and findings: at most every
        :data:`SLOW_S` seconds (a table whose numbers change ten times a second
        cannot be read anyway, and these are most of the cost of a redraw at
        10 Hz); every sample still gets its cell in the histories, and the last
        update is always drawn."""
        now = self.monotonic()
        if not force and now < self._slow_due:
            if self._slow_timer is None:
                self._slow_timer = self.set_timer(self._slow_due - now, self._slow_timer_fired)
            return
        self._slow_due = now + SLOW_S
        s, palette = self.state, self.palette
        targets, current = s.ordered(), s.current()
        joined = join(targets, s.local, s.host, s.all_chips)
        views, devs = joined
        self.query_one(DevicesPanel).show(targets, s.selected, palette, s.local, s.all_chips,
                                          s.host, joined)
        self.query_one(GraphsPanel).show(current, s.sort, s.filter, palette)
        self.query_one(TransfersPanel).show(current, palette)
        hooked = {v.snapshot.process.pid for v in views
                  if v.snapshot is not None and v.snapshot.process is not None}
        owners = owner_rows(devs.listed, s.local, hooked) if devs is not None else ()
        self.query_one(ProcessesPanel).show(targets, s.selected, palette, self.tz, owners,
                                            local=s.local, host=s.host, flt=s.process_filter)
        self.query_one(FindingsPanel).show(targets, current, palette, self.tz)
        self.query_one(EventsPanel).show(current, s.filter, palette, self.tz)

    def _slow_timer_fired(self) -> None:
        self._slow_timer = None
        if not self.state.paused:
            self._show_slow(force=True)

    def show_header(self) -> None:
        s = self.state
        info = HeaderInfo(s.hosts(), s.interval_s, self.clock(), s.ordered(), s.selected,
                          s.paused, s.sort, s.filter)
        self.query_one(HeaderBar).show(info, self.palette, self.tz)

    def _banner(self) -> None:
        banner = self.query_one("#banner", Static)
        d = self.state.current()
        down = d is not None and d.state is Conn.DISCONNECTED
        banner.display = down
        if down and d is not None:
            since = hms(d.since_unix, self.tz) if d.since_unix is not None else "?"
            what = "showing the last data read" if d.snapshot is not None else "nothing read yet"
            banner.update(f"{clean(d.target, 60)} disconnected since {since}: {what}; "
                          "r: retry now")
