"""``tpu-info --watch``: the App, its keys, and the plumbing from sources.

Data flows one way. Each of the source's loops runs in a thread worker
(``@work(thread=True)``) and posts a :class:`SourceMessage` per update; the
UI thread folds it into :class:`~tui.state.WatchState` (cheap) and schedules
one redraw for whatever changed, so bursts coalesce and the UI thread never
waits on the network. Screens read the state they are given ("attributes
down") and post messages when the user picks something ("messages up").

Example:
    >>> from tui.fake import FakeSource, FrozenClock
    >>> app = WatchApp(FakeSource.demo(), 1.0, clock=FrozenClock())
    >>> app.state.sort
    'cost/step'
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import tzinfo
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen

from tpu_info.contract.safe import clean
from tpu_info.host.processes import PROC_ROOT
from tpu_info.net.targets import normalize
from tui.pick import best, this_user
from tui.procs import ProcessFilter, target_proc
from tui.screens.confirm import SignalScreen
from tui.screens.detail import DetailScreen
from tui.screens.finding import FindingScreen
from tui.screens.help import HelpScreen
from tui.screens.main import MainScreen
from tui.signals import ENDED, SENT, Outcome, Pinned, Refusal, pin, signal_name
from tui.source import Conn, Found, LiveSource, Loop, Source, Update
from tui.state import TargetData, WatchState
from tui.widgets.findings import FindingsPanel
from tui.widgets.graphs import SORTS, GraphsPanel
from tui.widgets.processes import ProcessesPanel

MIN_INTERVAL_S = 0.1

class SourceMessage(Message):
    """One :class:`~tui.source.Update` or :class:`~tui.source.Found` from a loop."""

    def __init__(self, item: Update | Found) -> None:
        super().__init__()
        self.item = item


class WatchApp(App[int]):
    """The live dashboard.

    Args:
        source: where records come from (:class:`~tui.source.LiveSource`, or
            :class:`~tui.fake.FakeSource` in tests).
        interval_s: the refresh interval shown in the header (floor 0.1 s).
        clock: wall clock for the header (tests freeze it).
        tz: time zone for clock times (None: local).
        tick_s: how often the header clock redraws (None: never).
        all_chips: list every chip of this host, also those not usable here
            (``--all``); by default the Devices panel counts them.
        host: this host's name (default: ``socket.gethostname()``).
        process_filter: show only these users' and pids' rows in the Processes
            panel at first (``--user``, ``--pid``; the filter box changes it).
        proc_root: where ``/proc`` is (signals read owners there; tests point
            it at a fixture tree).
    """

    TITLE = "tpu-info --watch"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("r", "reconnect", "Reconnect"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, source: Source, interval_s: float = 1.0, *,
                 clock: Callable[[], float] = time.time, tz: tzinfo | None = None,
                 tick_s: float | None = 1.0, all_chips: bool = False,
                 host: str | None = None, process_filter: ProcessFilter | None = None,
                 proc_root: str = PROC_ROOT) -> None:
        super().__init__()
        self.source = source
        self.clock = clock
        self.tz = tz
        self.tick_s = tick_s
        self.state = WatchState(max(MIN_INTERVAL_S, interval_s), all_chips=all_chips,
                                host=socket.gethostname() if host is None else host,
                                process_filter=process_filter or ProcessFilter())
        self.proc_root = proc_root
        self.signal_log: list[Refusal | Outcome] = []  # what each i/t/k came to, in order
        self._stop = threading.Event()
        self._dirty: set[str | None] = set()
        self._draw_pending = False
        self._user_picked = False
        self._dropped: set[str] = set()
        self._me = this_user()
        self.main = MainScreen(self.state, clock, tz)

    def get_default_screen(self) -> Screen[None]:
        return self.main

    # Data plumbing ------------------------------------------------------------

    def on_mount(self) -> None:
        for item in self.source.initial():
            self._apply(item)
        self._dirty.clear()
        self.main.show_all()
        loops = self.source.loops()
        if loops:  # one thread per target: more than the default executor holds
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=64, thread_name_prefix="tpu-info-watch"))
        for name, loop in loops:
            self._run_loop(name, loop)
        if self.tick_s:
            self.set_interval(self.tick_s, self._tick)

    @work(thread=True, exit_on_error=False, group="sources")
    def _run_loop(self, name: str, loop: Loop) -> None:
        """Runs one source loop until the app stops it."""
        try:
            loop(self._sink, self._stop)
        except Exception as e:  # noqa: BLE001 - a bug in a loop must not end the app
            if not self._stop.is_set() and name != "discovery":
                self._sink(Update(name, Conn.DISCONNECTED, error=f"reader failed: {e!r}",
                                  since_unix=self.clock()))

    def _sink(self, item: Update | Found) -> None:
        """Called from worker threads: hands ``item`` to the UI thread."""
        if not self._stop.is_set():
            self.post_message(SourceMessage(item))

    def on_source_message(self, message: SourceMessage) -> None:
        target = self._apply(message.item)
        self._dirty.add(target)
        if not self._draw_pending:
            self._draw_pending = True
            self.call_later(self._draw)

    def _apply(self, item: Update | Found) -> str | None:
        """Folds one item into the state; returns the target it touched."""
        if isinstance(item, Found):
            self._found(item)
            return None
        if item.target in self._dropped:
            return None  # a late message from a reader that was stopped
        d = self.state.targets.get(item.target)
        if d is None:
            d = self.state.targets[item.target] = TargetData(item.target)
        d.apply(item)
        self._auto_pick()
        return item.target

    def _auto_pick(self) -> None:
        """Until the user picks, shows this user's newest process (:mod:`tui.pick`)."""
        s = self.state
        if self._user_picked and s.selected in s.targets:
            return
        pool = s.ordered()
        if s.process_filter:  # --pid 4242: that process first, when it is a target
            pool = [d for d in pool if s.process_filter.matches(target_proc(d))] or pool
        top = best(pool, s.started, self._me)
        s.selected = top.target if top is not None else None

    def _found(self, found: Found) -> None:
        """New hooked processes join; one that replaces a dead one takes its place."""
        self.state.started.update(found.started)
        if found.local is not None:
            self.state.local = found.local
        known = {normalize(t) for t in self.state.targets}
        for target, argv in found.processes:
            if normalize(target) in known:
                d = self.state.targets.get(target)
                if d is not None and argv:
                    d.argv = argv
                continue
            known.add(normalize(target))
            self._dropped.discard(target)
            old = next((d for d in self.state.ordered() if argv and d.argv == argv
                        and d.state is Conn.DISCONNECTED), None)
            self.state.targets[target] = TargetData(target, argv=tuple(argv))
            loop = self.source.add_target(target)
            if loop is not None:
                self._run_loop(*loop)
            if old is not None:  # the same program, restarted: follow it
                self.source.drop_target(old.target)
                self._dropped.add(old.target)
                del self.state.targets[old.target]
                if self.state.selected == old.target:
                    self.state.selected = target
        self._auto_pick()

    def _draw(self) -> None:
        self._draw_pending = False
        dirty, self._dirty = self._dirty, set()
        if self.state.paused or not dirty:
            return
        if isinstance(self.screen, DetailScreen | FindingScreen):
            self.screen.show(self.state.targets.get(self.screen.target))
        if None in dirty or len(dirty) > 1:
            self.main.show_all()
        else:
            self.main.show_target(next(iter(dirty)))

    def _tick(self) -> None:
        if self.main.is_mounted:
            self.main.show_header()

    # Messages from the panels -------------------------------------------------

    def on_processes_panel_picked(self, message: ProcessesPanel.Picked) -> None:
        if message.target != self.state.selected:
            self._user_picked = True
            self.state.selected = message.target
            self.main.show_all()
        if message.chosen:
            self.main.switch_to("graphs")

    def on_main_screen_process_filter_changed(self, _message: MainScreen.ProcessFilterChanged
                                              ) -> None:
        self._auto_pick()
        self.main.show_all()

    def on_processes_panel_signal_asked(self, message: ProcessesPanel.SignalAsked) -> None:
        """``i``/``t``/``k``: another user's process (or one elsewhere, or gone)
        is refused at once, in one line; the user's own is asked about first."""
        verdict = pin(message.proc, host=self.state.host, proc_root=self.proc_root)
        if isinstance(verdict, Refusal):
            self.signal_log.append(verdict)
            self.notify(verdict.words, title=f"{signal_name(message.sig)} not sent",
                        severity="error", timeout=6, markup=False)
            return
        self.push_screen(SignalScreen(verdict.proc, message.sig, self._me or
                                      f"uid {verdict.uid}"),
                         lambda send: self._signal_answered(verdict, message.sig, send))

    def _signal_answered(self, pinned: Pinned, sig: int, send: bool | None) -> None:
        if not send:
            pinned.close()
            self.notify(f"{signal_name(sig)} not sent to {pinned.proc.label()}", timeout=3,
                        markup=False)
            return
        outcome = pinned.send(sig)
        self.signal_log.append(outcome)
        severity: SeverityLevel = ("information" if outcome.kind == SENT
                                   else "warning" if outcome.kind == ENDED else "error")
        self.notify(outcome.words, severity=severity, timeout=5, markup=False)

    def on_graphs_panel_opened(self, message: GraphsPanel.Opened) -> None:
        screen = DetailScreen(message.target, message.graph_hash, self.tz)
        self.push_screen(screen)
        self.call_after_refresh(screen.show, self.state.targets.get(message.target))

    def on_findings_panel_opened(self, message: FindingsPanel.Opened) -> None:
        screen = FindingScreen(message.target, message.finding_id, self.tz)
        self.push_screen(screen)
        self.call_after_refresh(screen.show, self.state.targets.get(message.target))

    # Keys -----------------------------------------------------------------

    async def action_quit(self) -> None:
        self.stop_source()
        self.exit(0)

    def action_pause(self) -> None:
        self.state.paused = not self.state.paused
        if self.state.paused:
            self.main.show_header()
        else:
            self.main.show_all()
            if isinstance(self.screen, DetailScreen | FindingScreen):
                self.screen.show(self.state.targets.get(self.screen.target))

    def action_cycle_sort(self) -> None:
        self.state.sort = SORTS[(SORTS.index(self.state.sort) + 1) % len(SORTS)]
        self.main.show_all()
        self.notify(f"graphs sorted by {self.state.sort}", timeout=2)

    def action_filter(self) -> None:
        if self.screen is self.main:
            self.main.open_filter()

    def action_reconnect(self) -> None:
        self.source.reconnect()
        down = [d.target for d in self.state.ordered() if d.state is Conn.DISCONNECTED]
        self.notify(f"reconnecting {', '.join(down)}" if down else "every target is connected",
                    timeout=3)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def stop_source(self) -> None:
        """Ends every loop and closes every channel (idempotent)."""
        self._stop.set()
        self.source.stop()

    def on_unmount(self) -> None:
        self.stop_source()

    def _fatal_error(self) -> None:
        """An unexpected exception on the UI thread: the app ends with one line
        on stderr instead of a full-screen traceback, and exit code 1."""
        error = sys.exc_info()[1] or self._exception
        self.stop_source()
        self.panic(Text(f"tpu-info --watch: the dashboard stopped on an internal error: "
                        f"{type(error).__name__}: {clean(error)}"))


def run(targets: Sequence[str], rate: float = 1.0, *, discover: bool = True,
        timeout: float = 3.0, runtime_dir: str | Path | None = None,
        source: Source | None = None, all_chips: bool = False,
        process_filter: ProcessFilter | None = None) -> int:
    """Runs the dashboard in this terminal until ``q``; returns the exit code.

    Args:
        targets: ``host:port`` addresses to watch (besides discovered ones).
        rate: seconds between refreshes (floor 0.1).
        discover: also watch this host's hooked processes and libtpu.
        timeout: seconds allowed per unary call.
        runtime_dir: where discovery looks (default: the usual place).
        source: read this instead of live targets (a saved run's replay).
        all_chips: list the chips not usable here too (``--all``).
        process_filter: the Processes panel's first filter (``--user``, ``--pid``).
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Textual would write escape codes into a pipe or a file, forever.
        print("tpu-info --watch: needs a terminal on stdin and stdout; for a pipe or a file "
              "use tpu-info --streaming (or -l S, --json --streaming)", file=sys.stderr)
        return 2
    rate = max(MIN_INTERVAL_S, rate)
    if source is None:
        source = LiveSource(targets, rate, timeout, discover=discover, runtime_dir=runtime_dir)
    app = WatchApp(source, rate, all_chips=all_chips, process_filter=process_filter)
    try:
        result = app.run()
    finally:
        source.stop()
    return app.return_code or int(result or 0)  # 1 after a crash, whatever run() returned
