"""The step line, the events panel, the help screen and the first selection,
driven by Textual's pilot against the recorded step flood (:mod:`tui.recorded`,
about 1,200 steps a second with a recompile 20 s before the end)."""

from __future__ import annotations

from tests.tui.test_tui import make, text_of
from tpu_info.contract.model import DeviceRecord, Event, EventKind, MemoryReading, ProcessRecord
from tpu_info.contract.model import Snapshot as Snap
from tpu_info.views.cost import duration
from tpu_info.views.derived import readings
from tpu_info.views.steps import step_line
from tpu_info.views.values import NO_STEPS, Header, TargetView
from tui import recorded
from tui.app import WatchApp
from tui.fake import NOW, FakeSource
from tui.screens.help import HelpScreen, key_rows
from tui.screens.main import MainScreen
from tui.source import Conn, Found, Update
from tui.state import TargetData
from tui.widgets.events import EventsPanel, age_text
from tui.widgets.steps import StepsPanel
from tui.widgets.table import LiveTable

WIDE = (160, 45)


async def drawn(app: WatchApp, pilot, cond, tries: int = 200) -> None:  # type: ignore[no-untyped-def]
    for _ in range(tries):  # until the updates are drawn (a loaded machine takes a while)
        await pilot.pause(0.05)
        if cond():
            return
    raise AssertionError("never drawn")


def step_text(app: WatchApp) -> str:
    return text_of(app.main.query_one(StepsPanel))


def event_rows(app: WatchApp) -> list[dict[str, str]]:
    panel = app.main.query_one(EventsPanel)
    return [{c: str(panel.get_cell(k, c)) for c in ("age", "kind", "name", "detail")}
            for k in panel.row_keys]


# The step line ------------------------------------------------------------------

async def test_step_line_shows_the_views_numbers_and_the_recompile_cause():
    app = make(recorded.flood())
    async with app.run_test(size=WIDE) as pilot:
        await drawn(app, pilot, lambda: "steps/s" in step_text(app))
        shown = step_text(app)
        d = app.state.current()
        assert d is not None and d.snapshot is not None
        line = step_line(TargetView(d.target, d.snapshot), d.previous)
        assert line.per_second.value == 1230.0  # 1,200 + (59 % 7) * 10 steps in the last second
        assert "1,230 steps/s" in shown
        # Percentiles from the StepTime distribution, busy % from the devices table.
        assert f"P50 {duration(line.p50_seconds.value)}" in shown  # type: ignore[arg-type]
        assert f"P99 {duration(line.p99_seconds.value)}" in shown  # type: ignore[arg-type]
        cli = readings([TargetView(d.target, d.snapshot)], header=Header("h", 0.0))
        assert f"busy {cli.targets[0].devices[0].busy.text(lambda v: f'{v:.0f}%')}" in shown
        assert f"({cli.targets[0].process.steps_short.value} in all)" in shown  # type: ignore[union-attr]
        # Compile and recompile markers on the step-time axis: the recompile
        # 20 updates from the right, the first compile 60.
        marks = shown.splitlines()[2].rstrip()
        assert marks.endswith("↻" + "·" * 19) and marks[-60] == "▲"
        # The cause, in the CLI's words, without scrolling anything.
        assert ("last recompile 19s ago: jit(train_step): argument 'x' changed f32[32,4] -> "
                "f32[33,4] at loop.py:14") in shown


async def test_step_line_says_why_in_the_words_of_the_cli():
    dev = DeviceRecord(0, "cpu", "cpu", MemoryReading(None, source="none", reason="no stats"),
                       busy_reason="the engine does not report busy %")
    snap = Snap(NOW, ProcessRecord(pid=7, name="t.py", engine="jax"), devices=(dev,))
    app = make(FakeSource([Update(recorded.TARGET, Conn.STREAMING, snap)]))
    async with app.run_test(size=WIDE) as pilot:
        await drawn(app, pilot, lambda: "steps" in step_text(app))
        shown = " ".join(step_text(app).split())
        cli = readings([TargetView(recorded.TARGET, snap)], header=Header("h", 0.0)).targets[0]
        assert cli.process.steps.text() == "N/A"  # type: ignore[union-attr]
        assert "steps N/A" in shown and " ".join(NO_STEPS.split()[:8]) in shown
        assert f"busy N/A ({cli.devices[0].busy.reason})" in shown
        assert "0 steps" not in shown


# Events -------------------------------------------------------------------------

async def test_events_are_the_rare_ones_while_steps_flood():
    app = make(recorded.flood(disconnected=True))
    async with app.run_test(size=WIDE) as pilot:
        await drawn(app, pilot, lambda: any(r["kind"] == "disconnect" for r in event_rows(app)))
        rows = event_rows(app)
        kinds = [r["kind"] for r in rows]
        assert not {"step", "h->d", "d->h"} & set(kinds)  # rates, never rows
        assert {"compile", "recompile", "cache hit", "graph break", "finding",
                "disconnect"} <= set(kinds)
        assert len(rows) < 15  # 60,000 step events did not become rows
        recompile = rows[kinds.index("recompile")]
        assert recompile["detail"].startswith("argument 'x' changed f32[32,4] -> f32[33,4]")
        assert kinds[0] == "disconnect"  # newest on top
        assert all(not r["age"].startswith("-") for r in rows)
        assert recompile["age"] == "19s"


def test_ages_are_never_negative_under_clock_skew():
    assert age_text(100.0, 100.4) == "0s" and age_text(100.0, 250.0) == "0s"
    assert age_text(100.0, 85.2) == "15s"
    # A hook whose events are stamped after its reading (another thread's clock).
    d = TargetData("h:1")
    ahead = Event(1, NOW + 3.0, EventKind.RECOMPILE, "jit(f)", "", "argument 'x' changed")
    d.apply(Update("h:1", Conn.STREAMING, Snap(NOW, events=(ahead,), last_seq=1)))
    assert [e.seq for e in d.events] == [1]


async def test_skewed_event_shows_age_zero_not_minus_zero():
    ahead = Event(1, NOW + 0.3, EventKind.COMPILE, "jit(f)", "", "first call")
    snap = Snap(NOW, ProcessRecord(pid=7, name="t.py", engine="jax"), events=(ahead,),
                last_seq=1)
    app = make(FakeSource([Update(recorded.TARGET, Conn.STREAMING, snap)]))
    async with app.run_test(size=WIDE) as pilot:
        await drawn(app, pilot, lambda: any(r["kind"] == "compile" for r in event_rows(app)))
        assert [r["age"] for r in event_rows(app) if r["kind"] == "compile"] == ["0s"]


def test_steps_do_not_push_compiles_out_of_the_history():
    d = TargetData(recorded.TARGET)
    for u in recorded.flood_updates():
        d.apply(u)
    kinds = [e.kind for e in d.events]
    assert EventKind.STEP not in kinds and EventKind.COMPILE in kinds
    assert kinds.count(EventKind.RECOMPILE) == 1


# Help ---------------------------------------------------------------------------

async def test_help_lists_every_key_and_every_panel():
    app = make(recorded.flood())
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await drawn(app, pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        help_screen = app.screen
        shown = "\n".join(text_of(s) for s in help_screen.query("Static"))  # type: ignore[arg-type]
        box = help_screen.query_one("VerticalScroll")
        assert box.size.width > 60 and box.size.height > 20  # not an empty box
        for cls in (WatchApp, MainScreen, LiveTable):
            for b in cls.BINDINGS:
                assert app.get_key_display(b) in shown, b.key  # type: ignore[union-attr]
        assert len(key_rows(app, app.main)) >= len(WatchApp.BINDINGS) + len(MainScreen.BINDINGS)
        for panel in app.main.query(".panel"):
            assert str(panel.border_title) in shown
        assert "Steps" in shown and "Events" in shown


# Selection ----------------------------------------------------------------------

def _proc(pid: int, user: str, started: float) -> Snap:
    return Snap(NOW, ProcessRecord(pid=pid, name="t.py", user=user, engine="jax",
                                   start_time_unix=started))


async def test_first_selection_is_this_users_newest_process():
    old, new, libtpu = "127.0.0.1:41001", "127.0.0.1:41002", "localhost:8431"
    src = FakeSource([
        Found(((old, ("old.py",)), (new, ("new.py",)), (libtpu, ())),
              started=((old, NOW - 600), (new, NOW - 5))),
        # Another user's process on libtpu's port answers first and started last.
        Update(libtpu, Conn.STREAMING, _proc(99, "bob", NOW - 1)),
        Update(old, Conn.STREAMING, _proc(1, "alice", NOW - 600)),
        Update(new, Conn.STREAMING, _proc(2, "alice", NOW - 5)),
    ])
    app = make(src)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert app.state.selected == new


def test_discovery_reports_start_times(tmp_path):
    from tests.tpu_info.host.test_libtpu_port import fake_proc
    from tests.tui.test_tui_discovery import _records
    from tui.source import DiscoveryLoop

    _records(tmp_path / "rt", 0)
    loop = DiscoveryLoop(tmp_path / "rt", probe_libtpu=False,
                         proc_root=fake_proc(tmp_path / "proc", []))
    found = loop.scan()
    assert [t for t, _ in found.started] == ["127.0.0.1:2"]


def test_flood_frames_count_steps_like_a_hook():
    frames = recorded.flood_updates(frames=3)
    counts = [u.snapshot.steps.count for u in frames]  # type: ignore[union-attr]
    assert counts == [recorded.steps_done(k) for k in range(3)]
    s = frames[-1].snapshot
    assert s is not None
    assert sum(e.kind == EventKind.STEP for e in s.events) == recorded.STEP_EVENTS
