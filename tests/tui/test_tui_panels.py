"""Findings and graphs panels (issue 18, items 3 and 4): findings over the whole
event window, ranked as the CLI ranks them, with a detail per finding; graphs
by cost per step, the program's own functions above the library's set-up
graphs, and ↻ only on a real recompile. Pilot tests against the fake source
and real records."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC

from rich.console import Console
from textual.widgets import Static

from tests.tui.waiting import until_drawn
from tpu_info.contract.catalog import GRAPH_BREAKS, MARK_STEP
from tpu_info.contract.model import (
    CounterReading,
    Event,
    EventKind,
    ProcessRecord,
    Snapshot,
    Unit,
)
from tpu_info.views.findings import find
from tui.fake import MAIN, NOW, FakeSource, FrozenClock
from tui.source import Conn, Update
from tui.state import TargetData

BREAK_AT = "/home/alice/project/train.py:56"
BREAK_WHY = "Unsupported Tensor.item() call with capture_scalar_outputs=False"


def make(source: FakeSource | None = None) -> object:
    from tui.app import WatchApp

    return WatchApp(source or FakeSource.demo(), 1.0, clock=FrozenClock(), tz=UTC,
                    tick_s=None)


def text_of(widget: Static) -> str:
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _torch_frame(k: int, events: tuple[Event, ...], last_seq: int) -> Snapshot:
    return Snapshot(NOW - 10 + k, ProcessRecord(pid=99, name="t.py", engine="torch_compile",
                                                start_time_unix=NOW - 100),
                    counters=(CounterReading(GRAPH_BREAKS, 3), CounterReading(MARK_STEP, 10 + k)),
                    events=events, last_seq=last_seq)


def test_findings_read_every_event_the_stream_sent_not_only_the_newest():
    # A stream sends each snapshot with only its new events: the graph break
    # arrived in the first one. The findings must still name its line and
    # reason, as the CLI does from one read of the whole window.
    brk = Event(1, NOW - 10, EventKind.GRAPH_BREAK, "compile(Net.forward)", "", BREAK_WHY,
                BREAK_AT)
    d = TargetData(MAIN)
    d.apply(Update(MAIN, Conn.STREAMING, _torch_frame(0, (brk,), 1)))
    for k in range(1, 5):
        step = Event(1 + k, NOW - 10 + k, EventKind.STEP)
        d.apply(Update(MAIN, Conn.STREAMING, _torch_frame(k, (step,), 1 + k)))
    assert d.events[0] == brk  # the events panel lists it ...
    said = [f.message for f in d.findings]
    assert not any("no longer in the recent events" in m for m in said), said
    assert any(BREAK_WHY in m and "train.py:56" in m for m in said), said  # ... and so do they
    # The same findings as the CLI's read of the whole window.
    whole = replace(d.snapshot, events=(brk,))
    assert [f.message for f in find(whole)] == said


def test_each_finding_keeps_its_history_per_refresh():
    d = TargetData(MAIN)
    for u in FakeSource.demo(remote=False).initial():
        if isinstance(u, Update):
            d.apply(u)
    fid = next(i for i, f in zip(d.finding_ids, d.findings, strict=True)
               if f.kind.startswith("recompile_"))
    points = list(d.finding_history[fid])
    assert len(points) >= 2  # one per refresh since it appeared
    assert points[-1].seconds_lost >= points[0].seconds_lost


# Graphs ----------------------------------------------------------------------

def graph_rows(app) -> list[str]:  # type: ignore[no-untyped-def]
    from tui.widgets.graphs import GraphsPanel

    return [key[:8] for key in app.main.query_one(GraphsPanel).row_keys]


def _jax_like_run() -> Snapshot:
    """What a hooked JAX loop sends (the shape of a real jax_mlp.py read):
    JAX's own set-up graphs with no line of the program's, then the step,
    compiled once for the full batch and again for the short last one."""
    from tpu_info.contract.catalog import EXECUTE_TIME
    from tpu_info.contract.model import GraphRecord, RecompileCause, StepsReading
    from tui.fake import dist

    t0 = NOW - 30
    setup = [GraphRecord(f"{i:02x}" * 32, name, "jax", t0 + i, t0 + i, compiles=1,
                         compile_seconds_total=1.0)
             for i, name in enumerate(("jit(_threefry_split)", "jit(_normal)", "jit(_normal)",
                                       "jit(broadcast_in_dim)"))]
    first = GraphRecord("aa" * 32, "jit(train_step)", "jax", t0 + 8, NOW, compiles=1,
                        compile_seconds_total=1.4, executions=9_900,
                        causes=(RecompileCause(t0 + 8, "first call", "/w/train.py:61"),))
    again = GraphRecord("bb" * 32, "jit(train_step)", "jax", t0 + 9, NOW, compiles=1,
                        compile_seconds_total=0.9, executions=100,
                        causes=(RecompileCause(t0 + 9, "argument 'x' changed f32[32,64] -> "
                                               "f32[31,64]", "/w/train.py:61", "x"),))
    return Snapshot(NOW, ProcessRecord(pid=5, name="train.py", engine="jax"),
                    graphs=(*setup, first, again),
                    steps=StepsReading(10_000, "marked", seconds_total=20.0),
                    distributions=(dist(EXECUTE_TIME, Unit.TIME_NS, [1e6] * 10),))


def test_graph_rules_cost_per_step_own_functions_and_real_recompiles():
    from tpu_info.views.graphs import graph_cost, is_recompile, own_hashes, per_step_cell

    s = _jax_like_run()
    by_name = {g.hash[:2]: g for g in s.graphs}
    # 1.4 s compiling + 9,900 runs at the mean 1 ms, over 10,000 steps.
    c = graph_cost(s, by_name["aa"])
    assert c.estimated and abs(c.seconds_per_step - (1.4 + 9.9) / 10_000) < 1e-12
    assert per_step_cell(c) == "~1.1 ms"
    assert own_hashes(s) == {"aa" * 32, "bb" * 32}  # JAX's jit(_normal) & co are set-up
    assert [is_recompile(g) for g in s.graphs] == [False] * 5 + [True]
    # An eager op compiled after the program's first function is the program's
    # own code (an un-jitted accuracy() in the loop), not set-up.
    from tpu_info.contract.model import GraphRecord

    eager = GraphRecord("cc" * 32, "jit(add)", "jax", NOW - 5, NOW - 5, compiles=1,
                        compile_seconds_total=0.3)
    assert "cc" * 32 in own_hashes(replace(s, graphs=(*s.graphs, eager)))
    steps_unknown = replace(s, steps=None)
    assert per_step_cell(graph_cost(steps_unknown, by_name["aa"])) == ""


async def test_graphs_by_cost_per_step_own_functions_first_and_recompiles_marked():
    from tui.widgets.graphs import GraphsPanel

    app = make(FakeSource([Update(MAIN, Conn.STREAMING, _jax_like_run())]))
    async with app.run_test(size=(160, 45)) as pilot:
        await until_drawn(pilot, lambda: graph_rows(app))
        table = app.main.query_one(GraphsPanel)
        rows = graph_rows(app)
        assert app.state.sort == "cost/step"
        assert rows[:3] == ["aaaaaaaa", "bbbbbbbb", "~setup"]  # the step on top
        assert "library set-up: 4 graphs" in table.get_cell("~setup", "name").plain
        assert str(table.get_cell("aa" * 32, "cost")) == "~1.1 ms"
        marked = [k[:2] for k in table.row_keys if k != "~setup"
                  and table.get_cell(k, "name").plain.startswith("↻")]
        assert marked == ["bb"]  # the second graph of train_step, not a first compile
        assert "dim" in str(table.get_cell("01" * 32, "name").style)  # set-up: dimmed


async def test_enter_or_g_opens_a_graph_with_its_cause_without_panel_keys():
    from tui.screens.detail import DetailScreen

    app = make()
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        await pilot.press("g")  # at first: the costliest per step
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        assert app.screen.graph_hash.startswith("3f9a1c0b")
        await pilot.press("escape", "down", "enter")  # the graphs table has the focus
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        body = text_of(app.screen.query_one("#detail-body", Static))
        assert "argument 'batch' changed f32[32,128] -> f32[17,128]" in body
        await pilot.press("escape", "tab", "tab")  # focus elsewhere: no panel keys needed
        await pilot.press("g")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        assert app.screen.graph_hash.startswith("b71e55aa")  # the graph under the cursor


# Findings --------------------------------------------------------------------

def _sync_run(path: str) -> Snapshot:
    from tpu_info.contract.model import SiteReading, StepsReading

    return Snapshot(NOW, ProcessRecord(pid=7, name="train.py", engine="jax"),
                    sites=(SiteReading("sync", f"{path}:2", 1200, bytes=4800, seconds=4.92,
                                       detail="float()"),),
                    steps=StepsReading(1200, "inferred", "jit(step)", seconds_total=164.0))


async def test_findings_one_line_each_costliest_on_top_and_f_opens_its_detail(tmp_path):
    from tui.screens.finding import FindingScreen
    from tui.widgets.findings import FindingsPanel

    src = tmp_path / "train.py"
    src.write_text("for batch in data:\n    total += float(loss)  # the sync\n    step()\n")
    snaps = [_sync_run(str(src)), replace(_sync_run(str(src)), taken_at_unix=NOW + 1)]
    grown = replace(snaps[1].sites[0], count=2400, seconds=9.84)
    snaps.append(replace(snaps[1], taken_at_unix=NOW + 2, sites=(grown,),
                         steps=replace(snaps[1].steps, count=2400, seconds_total=328.0)))
    app = make(FakeSource([Update(MAIN, Conn.STREAMING, s) for s in snaps]))
    async with app.run_test(size=(160, 45)) as pilot:
        panel = app.main.query_one(FindingsPanel)
        await until_drawn(pilot, lambda: panel.row_keys)
        top = find(snaps[-1])[0]
        assert panel.row_keys[0] == app.state.targets[MAIN].finding_ids[0]
        assert panel.plain_rows()[0].startswith("warn") and top.message in panel.plain_rows()[0]
        assert panel.region.y < app.main.query_one("#graphs").region.y  # above the fold
        await pilot.press("f")
        await until_drawn(pilot, lambda: isinstance(app.screen, FindingScreen))
        body = text_of(app.screen.query_one("#finding-body", Static))
        assert f"{src}:2" in body and "total += float(loss)  # the sync" in body
        assert "History" in body and "2,400" in body and "1,200" in body  # how it grew
        assert "Advice" in body and "Log every N steps" in body
        await pilot.press("escape")
        panel.focus()
        await pilot.press("enter")
        await until_drawn(pilot, lambda: isinstance(app.screen, FindingScreen))
