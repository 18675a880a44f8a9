"""What a 10 Hz refresh redraws and recomputes (``bench/tui_cpu.py`` measures
its cost): the step line at every update; the other panels at most every
``SLOW_S`` and always the last update; the findings at once when what they
read changed shape, else at most every ``FINDINGS_EVERY_S``, and up to date
again at the next update after that or at a disconnect."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from tests.tui.test_tui import WIDE, make, text_of
from tpu_info.contract.model import GraphRecord
from tpu_info.views.findings import find
from tui import state
from tui.app import SourceMessage
from tui.fake import MAIN, NOW, FakeSource, demo_frame, synthetic
from tui.source import Conn, Update
from tui.state import TargetData
from tui.widgets.devices import DevicesPanel
from tui.widgets.events import EventsPanel
from tui.widgets.findings import FindingsPanel
from tui.widgets.graphs import GraphsPanel
from tui.widgets.processes import ProcessesPanel
from tui.widgets.steps import StepsPanel
from tui.widgets.transfers import TransfersPanel

BENCH = "127.0.0.1:50000"  # the target of tui.fake.synthetic
SLOW = (DevicesPanel, GraphsPanel, TransfersPanel, ProcessesPanel, FindingsPanel, EventsPanel)


def _count_finds(monkeypatch) -> list[object]:  # type: ignore[no-untyped-def]
    calls: list[object] = []
    real = state.find

    def counted(s):  # type: ignore[no-untyped-def]
        calls.append(s)
        return real(s)

    monkeypatch.setattr(state, "find", counted)
    return calls


def _fresh(d: TargetData) -> list[object]:
    """The findings of ``d``'s last reading, as the CLI reads the whole window."""
    assert d.snapshot is not None
    return find(replace(d.snapshot, events=tuple(d.read_events)))  # type: ignore[return-value]


def test_counts_alone_rerun_the_findings_at_most_twice_a_second(monkeypatch):
    calls = _count_finds(monkeypatch)
    t = [NOW]
    src = synthetic(devices=2, graphs=40, clock=lambda: t[0])
    assert src.live is not None
    d = TargetData(BENCH)
    for n in range(21):  # 2 s at 10 Hz: every step moves the counts, nothing else changes
        for u in src.live(n):
            assert isinstance(u, Update)
            d.apply(u)
        t[0] += 0.1
    assert d.version == 21
    assert len(calls) <= 6, len(calls)  # one per 0.5 s of the target's clock (was 21)
    # A new compile is news: its findings come with the update that brought it.
    snap = d.snapshot
    assert snap is not None
    g = snap.graphs[0]
    grown = replace(snap, taken_at_unix=t[0], graphs=(
        GraphRecord(**{**{f: getattr(g, f) for f in g.__slots__}, "compiles": 9}),
        *snap.graphs[1:]))
    before = len(calls)
    d.apply(Update(BENCH, Conn.STREAMING, grown))
    assert len(calls) == before + 1
    assert d.findings == _fresh(d)
    # Counts that moved since the last find are folded in when the target goes away.
    moved = replace(grown, taken_at_unix=t[0] + 0.1, counters=(), events=())
    d.apply(Update(BENCH, Conn.STREAMING, moved))
    assert len(calls) == before + 1  # 0.1 s later: not yet
    d.apply(Update(BENCH, Conn.DISCONNECTED, error="gone", since_unix=t[0] + 0.2))
    assert len(calls) == before + 2
    assert d.findings == _fresh(d)


def test_findings_keep_one_history_point_per_refresh_at_one_hz(monkeypatch):
    calls = _count_finds(monkeypatch)
    d = TargetData(MAIN)
    updates = [u for u in FakeSource.demo(remote=False).initial() if isinstance(u, Update)]
    for u in updates:
        d.apply(u)
    assert len(calls) == sum(1 for u in updates if u.snapshot is not None)  # frames 1 s apart


async def test_only_the_step_line_is_drawn_at_every_update(monkeypatch):
    shown: Counter[str] = Counter()
    for cls in (*SLOW, StepsPanel):
        def show(self, *a, _real=cls.show, _name=cls.__name__, **k):  # type: ignore[no-untyped-def]
            shown[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, "show", show)
    app = make(FakeSource.demo(remote=False))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        frozen = time.monotonic() - 100.0  # the slow panels are not due before the end
        app.main.monotonic = lambda: frozen
        shown.clear()
        seq = 10_000
        for k in range(60, 70):  # ten updates, 0.1 s apart
            snap, seq = demo_frame(k, seq, NOW + (k - 59) / 10)
            app.post_message(SourceMessage(Update(MAIN, Conn.STREAMING, snap)))
            await pilot.pause()
        assert shown[StepsPanel.__name__] == 10  # steps/s at every update
        assert "130 in all" in text_of(app.main.query_one(StepsPanel))  # frame 69's count
        assert {c.__name__: shown[c.__name__] for c in SLOW} == {c.__name__: 0 for c in SLOW}
        devices = app.main.query_one(DevicesPanel)
        assert str(devices.get_cell(f"{MAIN}|0", "hbm")) == "3.63/15.75 GiB"  # frame 59's
        # When due, the next update draws every panel, with the latest reading.
        app.main.monotonic = lambda: frozen + 1000.0
        snap, seq = demo_frame(70, seq, NOW + 1.2)
        app.post_message(SourceMessage(Update(MAIN, Conn.STREAMING, snap)))
        await pilot.pause()
        assert {c.__name__: shown[c.__name__] for c in SLOW} == {c.__name__: 1 for c in SLOW}
        assert str(devices.get_cell(f"{MAIN}|0", "hbm")) == "3.45/15.75 GiB"  # frame 70's
