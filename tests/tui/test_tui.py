"""The dashboard's keys and data plumbing, driven by Textual's pilot against
the deterministic fake source and a frozen clock."""

from __future__ import annotations

import io
from datetime import UTC

import pytest
from rich.console import Console
from textual.widgets import Input, Static

from tpu_info.contract.model import GraphRecord, ProcessRecord, Snapshot
from tui.app import SourceMessage, WatchApp
from tui.fake import MAIN, NOW, REMOTE, FakeSource, FrozenClock, demo_frame
from tui.screens.detail import DetailScreen
from tui.screens.help import HelpScreen
from tui.source import Conn, Found, Update
from tui.widgets.graphs import GraphsPanel
from tui.widgets.header import HeaderBar
from tui.widgets.processes import ProcessesPanel

NARROW, WIDE = (80, 24), (200, 50)
OTHER = "127.0.0.1:40777"


def make(source: FakeSource | None = None, interval_s: float = 1.0) -> WatchApp:
    return WatchApp(source or FakeSource.demo(), interval_s, clock=FrozenClock(), tz=UTC,
                    tick_s=None)


def graph_rows(app: WatchApp) -> list[str]:
    return [key[:8] for key in app.main.query_one(GraphsPanel).row_keys]


def text_of(widget: Static) -> str:
    """What a Static shows, as plain text."""
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.file.getvalue()  # type: ignore[attr-defined]


def header(app: WatchApp) -> str:
    return text_of(app.main.query_one(HeaderBar))


def second_process() -> list[Update | Found]:
    snap = Snapshot(NOW, ProcessRecord(pid=5151, name="serve.py", engine="jax"),
                    graphs=(GraphRecord("ffee00112233" + "4" * 52, "forward", "jax", NOW - 40,
                                        NOW - 1, compiles=1, compile_seconds_total=21.5,
                                        executions=310),))
    return [Update(OTHER, Conn.STREAMING, snap)]


async def test_q_quits_with_code_0_and_stops_the_source():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_value == 0
    assert app.source.stopped.is_set()  # type: ignore[attr-defined]


async def test_p_pauses_drawing_but_keeps_data():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        execs = str(app.main.query_one(GraphsPanel).get_cell("3f9a1c0b7d2e" + "0" * 52, "execs"))
        await pilot.press("p")
        assert app.state.paused and "PAUSED" in header(app)
        snap, _ = demo_frame(80, 1000, NOW + 1)
        graphs = tuple(g if g.name != "jit(train_step)" or g.hash[0] != "3"
                       else GraphRecord(**{**{f: getattr(g, f) for f in g.__slots__},
                                           "executions": 999}) for g in snap.graphs)
        app.post_message(SourceMessage(Update(MAIN, Conn.STREAMING,
                                              Snapshot(**{**{f: getattr(snap, f) for f in
                                                             snap.__slots__},
                                                          "graphs": graphs}))))
        await pilot.pause()
        table = app.main.query_one(GraphsPanel)
        assert str(table.get_cell("3f9a1c0b7d2e" + "0" * 52, "execs")) == execs  # frozen
        assert app.state.targets[MAIN].snapshot.graphs == graphs  # type: ignore[union-attr]
        await pilot.press("p")
        await pilot.pause()
        assert not app.state.paused and "PAUSED" not in header(app)
        assert str(table.get_cell("3f9a1c0b7d2e" + "0" * 52, "execs")) == "999"


async def test_s_cycles_the_graph_sort():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        assert app.state.sort == "cost/step"
        assert graph_rows(app)[0] == "3f9a1c0b"  # the costliest per step
        await pilot.press("s")
        assert app.state.sort == "compiles"
        assert graph_rows(app)[0] == "9d0e7f6a"  # 3 compiles
        await pilot.press("s")
        assert app.state.sort == "compile time"
        assert graph_rows(app)[:3] == ["3f9a1c0b", "b71e55aa", "0c44de12"]
        await pilot.press("s")
        assert app.state.sort == "executions"
        assert graph_rows(app)[0] == "5e6f7081"  # 177 executions
        own = graph_rows(app)[:graph_rows(app).index("~setup")]
        assert own[-1] == "0c44de12"  # executions not counted: last of the program's own
        await pilot.press("s")
        assert app.state.sort == "cost/step"


async def test_slash_filters_graphs_and_events():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        box = app.main.query_one("#filter", Input)
        assert box.display and box.has_focus
        await pilot.press(*"train", "enter")
        assert not box.display
        assert app.state.filter == "train"
        assert graph_rows(app) == ["3f9a1c0b", "b71e55aa"]
        assert "filter: train" in header(app)
        await pilot.press("slash", *["backspace"] * 5, "escape")
        assert app.state.filter == "" and len(graph_rows(app)) == 10  # 9 and the set-up line


async def test_tab_switches_panels_in_the_narrow_layout():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        main = app.main
        assert main.query_one("#graphs").display and main.query_one("#graphs").has_focus
        assert main.query_one("#processes").display  # nvidia-smi's bottom half: always
        await pilot.press("tab")
        assert main.query_one("#processes").display and main.query_one("#processes").has_focus
        assert main.query_one("#graphs").display  # the lower panel stays
        await pilot.press("tab", "tab")
        assert main.query_one("#events").display and main.query_one("#events").has_focus
        await pilot.press("shift+tab")
        assert main.query_one("#transfers").has_focus
        await pilot.press("tab", "tab", "tab")  # events, findings, devices
        assert main.query_one("#devices").has_focus
        assert main.query_one("#findings").display  # the lower panel stays
        await pilot.press("tab")
        assert main.query_one("#graphs").has_focus and main.query_one("#graphs").display


async def test_tab_moves_focus_in_the_wide_layout():
    app = make()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        main = app.main
        assert all(main.query_one(f"#{n}").display for n in
                   ("devices", "processes", "graphs", "transfers", "events", "findings"))
        assert not main.query_one("#tabs").display
        await pilot.press("tab")
        assert main.query_one("#processes").has_focus
        assert main.query_one("#graphs").display  # nothing hidden


async def test_enter_opens_the_graph_detail_and_escape_returns():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("down", "enter")  # the recompile, second by cost per step
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        assert app.screen.graph_hash.startswith("b71e55aa")
        body = text_of(app.screen.query_one("#detail-body", Static))
        assert "argument 'batch' changed f32[32,128] -> f32[17,128]" in body
        assert "/home/alice/project/train.py:88" in body
        assert "f32[17,128], i32[17]" in body  # signature history
        assert "Other graphs of jit(train_step)" in body
        await pilot.press("escape")
        assert app.screen is app.main


async def test_detail_follows_live_updates():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("enter")  # the first jit(train_step) graph, the costliest
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        snap, _ = demo_frame(70, 1000, NOW + 10)
        app.post_message(SourceMessage(Update(MAIN, Conn.STREAMING, snap)))
        await pilot.pause()
        body = text_of(app.screen.query_one("#detail-body", Static))
        assert "executions  150" in body


async def test_enter_on_a_process_picks_it():
    src = FakeSource(FakeSource.demo().initial() + second_process())
    app = make(src)
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        assert app.state.selected == MAIN
        await pilot.press("tab")
        assert app.main.query_one(ProcessesPanel).has_focus
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        assert app.state.selected == OTHER
        assert graph_rows(app) == ["ffee0011"]
        assert app.main.query_one("#graphs").has_focus
        assert "◂" in header(app)


async def test_r_asks_the_source_to_reconnect():
    app = make(FakeSource.demo(disconnected=True))
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        assert app.source.reconnects == 1  # type: ignore[attr-defined]


async def test_question_mark_shows_help():
    app = make()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main


async def test_disconnected_target_keeps_its_last_data_and_says_since_when():
    app = make(FakeSource.demo(disconnected=True))
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.pause()
        banner = app.main.query_one("#banner", Static)
        assert banner.display
        assert "disconnected since 15:06:20" in text_of(banner)
        assert "disconnected since 15:06:20" in header(app)
        assert len(graph_rows(app)) == 10  # the last data read stays on screen


async def test_a_restarted_program_replaces_the_dead_one():
    argv = ("python", "train.py")
    first = [Found(((MAIN, argv),)),
             Update(MAIN, Conn.DISCONNECTED, error="refused", since_unix=NOW - 5)]
    snap, _ = demo_frame(0, 0, NOW)
    later = [Found(((MAIN, argv), (OTHER, argv))), Update(OTHER, Conn.STREAMING, snap)]
    app = make(FakeSource(first + later))
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert list(app.state.targets) == [OTHER]
        assert app.state.selected == OTHER


async def test_rate_has_a_floor_and_the_theme_can_change():
    app = make(interval_s=0.01)
    assert app.state.interval_s == 0.1
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert "every 0.1s" in header(app)
        app.theme = "textual-light"
        await pilot.pause()
        await pilot.pause()
        assert "every 0.1s" in header(app)


@pytest.mark.parametrize("size", [NARROW, WIDE])
async def test_hostile_strings_are_shown_inert(size):
    evil = "\x1b[31m[red]boom[/red]\x07"
    snap = Snapshot(NOW, ProcessRecord(pid=1, name=evil, engine=evil),
                    graphs=(GraphRecord("ab" * 32, evil, evil, NOW, NOW, compiles=2),))
    app = make(FakeSource([Update(MAIN, Conn.STREAMING, snap)]))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.pause()
        name = app.main.query_one(GraphsPanel).get_cell("ab" * 32, "name")
        assert "\x1b" not in str(name) and "[red]boom[/red]" in str(name)


async def test_remote_target_down_from_the_start_is_listed():
    app = make()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert list(app.state.targets) == [MAIN, REMOTE]
        assert app.state.targets[REMOTE].state is Conn.DISCONNECTED
        assert "10.0.0.7:8431 disconnected since 15:05:05" in header(app)


# Why N/A -----------------------------------------------------------------------------

def _unreported() -> Snapshot:
    """A process whose engine reports no device memory and no busy %, and a graph
    whose engine does not count executions: every N/A has a reason to show."""
    from tpu_info.contract.model import DeviceRecord, MemoryReading
    dev = DeviceRecord(0, "cpu", "cpu", MemoryReading(
        None, source="none", reason="the CPU backend has no memory statistics"))
    return Snapshot(NOW, ProcessRecord(pid=7, name="train.py", engine="torch_xla"),
                    devices=(dev,), uptime_seconds=30.0,
                    graphs=(GraphRecord("ab" * 32, "SyncTensorsGraph", "torch_xla", NOW - 9,
                                        NOW - 1, compiles=1, compile_seconds_total=0.5),))


async def test_tui_shows_why_each_na_is_na_in_the_words_of_doctor():
    from tpu_info.outputs.render import reasons
    from tpu_info.views.values import Header, TargetView
    from tui.screens.reasons import ReasonsScreen
    from tui.widgets.devices import DevicesPanel
    from tui.widgets.transfers import TransfersPanel

    snap = _unreported()
    doctor = reasons([TargetView(MAIN, snap)], header=Header(host="", time_unix=0.0))
    why = dict(doctor)
    memory = why[f"devices/{MAIN}/cpu:0/hbm_used"]
    busy = why[f"devices/{MAIN}/cpu:0/busy"]
    execs = why[f"compilation/{MAIN}/{'ab' * 6}/executions"]
    assert memory == "the CPU backend has no memory statistics"
    app = make(FakeSource([Update(MAIN, Conn.STREAMING, snap)]))
    async with app.run_test(size=WIDE) as pilot:
        devices = app.main.query_one(DevicesPanel)
        key = f"{MAIN}|0"
        for _ in range(100):  # until the update is drawn (a loaded machine takes a while)
            await pilot.pause(0.05)
            if key in devices.row_keys and app.main.query_one(GraphsPanel).tooltip:
                break
        # The history columns say why there is nothing to draw.
        assert str(devices.get_cell(key, "busy")) == "N/A"
        assert str(devices.get_cell(key, "busy_hist")) == busy
        assert str(devices.get_cell(key, "hbm_hist")) == memory
        # Each panel's tooltip says why its N/As are N/A.
        assert memory in str(devices.tooltip) and busy in str(devices.tooltip)
        assert execs in str(app.main.query_one(GraphsPanel).tooltip)
        assert "no host->device transfers recorded" in str(
            app.main.query_one(TransfersPanel).tooltip)
        # n lists every N/A: the same (where, why) pairs as `tpu-info doctor`.
        await pilot.press("n")
        for _ in range(40):
            await pilot.pause(0.05)
            if isinstance(app.screen, ReasonsScreen):
                break
        assert isinstance(app.screen, ReasonsScreen)
        shown = text_of(app.screen.query_one("#reasons-body", Static))
        for where, reason in doctor:
            if not where.startswith("header/"):
                assert where in shown and " ".join(reason.split()[:4]) in shown, where
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReasonsScreen)
