"""The Processes panel of the real app (Textual's pilot): on the first screen
at 80x24 (nvidia-smi's bottom half), every chip owner listed beside the
hooked processes, and the filter by user and pid (``u``, ``/`` on the panel,
``esc`` clears; ``--user``/``--pid`` set it at start). Data: the TPU
machine's sysfs tree with a hooked program and two owners without the hook
(one another uid's), and the deterministic demo source."""

from __future__ import annotations

import argparse
import os
import pwd
from datetime import UTC
from pathlib import Path

import pytest
from textual.widgets import Input

from tests.tpu_info.host.test_sandbox_host import sandbox
from tests.tui.test_tui import OTHER, second_process
from tests.tui.test_tui_chips import HOST, source
from tests.tui.waiting import until_drawn
from tpu_info.contract.model import LocalScan
from tui.app import WatchApp
from tui.fake import MAIN, FakeSource, FrozenClock
from tui.procs import Proc, ProcessFilter
from tui.widgets.processes import ProcessesPanel

OWNERS = {1624: ["DEV/vfio/vfio", "DEV/vfio/0"], 1700: ["DEV/vfio/0"], 1800: ["DEV/vfio/0"]}
WHO = {1624: ("python3", os.getuid(), ["python3", "prog.py"]),
       1700: ("python3", 654321, ["/usr/bin/python3", "other.py"]),
       1800: ("python3", os.getuid(), ["python3", "mine.py"])}
TARGET = "unix:/run/tpu-info/1624.sock"  # the hooked program (its user: alice)
SIZES = [(80, 24), (100, 30), (160, 45)]


@pytest.fixture
def scan(tmp_path: Path) -> LocalScan:
    return sandbox(tmp_path, OWNERS, WHO)[0]


def app(scan: LocalScan, **kw: object) -> WatchApp:
    return WatchApp(source(scan), 1.0, clock=FrozenClock(), tz=UTC, tick_s=None, host=HOST,
                    **kw)  # type: ignore[arg-type]


def panel_of(a: WatchApp) -> ProcessesPanel:
    return a.main.query_one(ProcessesPanel)


def users(panel: ProcessesPanel) -> list[str]:
    return [str(panel.get_cell(k, "user")) for k in panel.row_keys]


@pytest.mark.parametrize("size", SIZES)
async def test_processes_are_on_the_first_screen(scan: LocalScan, size: tuple[int, int]):
    a = app(scan)
    async with a.run_test(size=size) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: panel.region.height == 2 + 1 + 3)  # border, header, rows
        # The hooked program, then the chip's two owners without the hook.
        assert panel.row_keys == [TARGET, "pid|1700", "pid|1800"]
        assert str(panel.get_cell("pid|1700", "engine")) == "not hooked"
        assert str(panel.get_cell("pid|1800", "target")) == "holds tpu3"
        assert users(panel)[1] == "654321"  # another uid, as /proc names it
        screen_h = size[1]
        footer = 1
        region = panel.region
        assert panel.display and region.y >= 0
        assert region.bottom <= screen_h - footer  # no scrolling, nothing covers it
        lower = a.main.query_one("#graphs").region  # the tabbed panel keeps its room
        assert lower.height >= 4 and lower.bottom <= screen_h - footer


async def test_the_demo_at_80x24_shows_processes_and_graphs():
    a = WatchApp(FakeSource.demo(), 1.0, clock=FrozenClock(), tz=UTC, tick_s=None)
    async with a.run_test(size=(80, 24)) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: panel.region.height == 5)  # both targets
        assert panel.region.bottom <= 23
        graphs = a.main.query_one("#graphs")
        assert graphs.region.height >= 4 and graphs.region.bottom <= 23  # header and rows
        assert a.main.has_class("-short")
        assert a.main.query_one("#steps").region.height == 2  # the step line, no frame


async def test_u_filters_by_user_and_escape_clears(scan: LocalScan):
    a = app(scan)
    async with a.run_test(size=(80, 24)) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)
        await pilot.press("u")
        box = a.main.query_one("#process-filter", Input)
        assert box.display and box.has_focus
        await pilot.press(*"alice")
        await until_drawn(pilot, lambda: panel.row_keys == [TARGET])
        assert panel.border_title == "Processes · user alice"
        assert panel.border_subtitle == "1 of 3 shown · esc clears"
        await pilot.press("escape")
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)
        assert not box.display and panel.has_focus
        assert panel.border_title == "Processes" and not panel.border_subtitle
        assert not a.state.process_filter


async def test_slash_on_the_panel_filters_processes_by_pid(scan: LocalScan):
    a = app(scan)
    async with a.run_test(size=(80, 24)) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)
        await pilot.press("tab")  # graphs -> processes
        assert panel.has_focus
        await pilot.press("slash")
        assert a.main.query_one("#process-filter", Input).has_focus
        assert not a.main.query_one("#filter", Input).display  # not the graphs' filter
        await pilot.press(*"1800 1700", "enter")
        await until_drawn(pilot, lambda: panel.row_keys == ["pid|1700", "pid|1800"])
        assert panel.border_title == "Processes · pid 1700 or 1800"
        assert panel.has_focus  # enter keeps the filter and returns
        await pilot.press("slash")
        a.main.query_one("#process-filter", Input).value = "pid:x"
        await pilot.pause()
        assert a.state.process_filter == ProcessFilter.of(pids=[1700, 1800])  # the last good
        assert panel.border_subtitle == "pid:x: a pid is a positive integer"
        await pilot.press("escape")  # esc in the box: cleared
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)


async def test_escape_on_the_panel_clears_its_filter(scan: LocalScan):
    a = app(scan, process_filter=ProcessFilter.of(users=["654321"]))
    async with a.run_test(size=(80, 24)) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: panel.row_keys == ["pid|1700"])
        assert panel.border_title == "Processes · user 654321"  # --user, from the start
        await pilot.press("tab", "escape")
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)


async def test_a_pid_filter_picks_that_process_first():
    src = FakeSource(FakeSource.demo().initial() + second_process())
    a = WatchApp(src, 1.0, clock=FrozenClock(), tz=UTC, tick_s=None,
                 process_filter=ProcessFilter.of(pids=[5151]))
    async with a.run_test(size=(80, 24)) as pilot:
        panel = panel_of(a)
        await until_drawn(pilot, lambda: panel.row_keys == [OTHER])
        assert a.state.selected == OTHER  # not the demo's train.py, newest of this user's
        await pilot.press("u", *["backspace"] * 8, "escape")
        await until_drawn(pilot, lambda: len(panel.row_keys) == 3)
        assert a.state.selected == MAIN  # unfiltered, not picked: the usual first


def test_process_filter_words():
    f = ProcessFilter.parse("user:bob 7,alice pid:9")
    assert (f.users, f.pids) == ({"bob", "alice"}, {7, 9})
    assert ProcessFilter.parse(f.text()) == f
    me = pwd.getpwuid(os.getuid())
    by_uid = ProcessFilter.parse(f"user:{me.pw_uid}")  # a uid matches the name, and back
    assert by_uid.matches(Proc("k", 1, user=me.pw_name))
    assert ProcessFilter.parse(me.pw_name).matches(Proc("k", 1, user=str(me.pw_uid)))
    assert not ProcessFilter.parse("  ")
    for bad in ("pid:0", "pid:-3", "pid:", "user:", f"pid:{1 << 31}"):
        with pytest.raises(ValueError):
            ProcessFilter.parse(bad)


def test_python_m_tui_takes_user_and_pid(monkeypatch, capsys):
    import tui.__main__ as entry
    import tui.app

    seen: list[object] = []
    monkeypatch.setattr(tui.app, "run", lambda *a, **kw: seen.append(kw["process_filter"]) or 0)
    assert entry.main(["--user", "alice", "--pid", "4242,9", "--pid", "7"]) == 0
    assert seen == [ProcessFilter.of(["alice"], [4242, 9, 7])]
    assert entry.main(["--pid", "0"]) == 2
    assert "--pid must be process ids" in capsys.readouterr().err
    assert entry.main(["--user", "a b"]) == 2


def test_the_watch_flags_user_and_pid_reach_the_dashboard(monkeypatch):
    """The CLI's --user/--pid (nvitop's: ``users``, ``pids``) are passed on to
    the dashboard, whose filter they set."""
    from tpu_info.commands import cli

    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "is_terminal", lambda: True)
    monkeypatch.setattr(os, "execv", lambda exe, argv: seen.append(list(argv)))
    args = cli.build_parser().parse_args(["--watch"])
    ns = argparse.Namespace(**{**vars(args), "users": ["alice", "1000"], "pids": [4242, 7]})
    assert cli._watch(ns, []) == 0
    assert seen[0][-8:] == ["--user", "alice", "--user", "1000", "--pid", "4242", "--pid", "7"]
    cli._watch(argparse.Namespace(**{**vars(args), "users": None, "pids": None}), [])
    assert "--user" not in seen[1] and "--pid" not in seen[1]  # neither: nothing passed
