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

from tpu_info.contract.catalog import GRAPH_BREAKS, MARK_STEP
from tpu_info.contract.model import (
    CounterReading,
    Event,
    EventKind,
    ProcessRecord,
    Snapshot,
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
