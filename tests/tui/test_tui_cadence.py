"""What a 10 Hz refresh redraws and recomputes (``bench/tui_cpu.py`` measures
its cost): the step line at every update; the other panels at most every
``SLOW_S`` and always the last update; the findings at once when what they
read changed shape, else at most every ``FINDINGS_EVERY_S``, and up to date
again at the next update after that or at a disconnect."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.model import GraphRecord
from tpu_info.views.findings import find
from tui import state
from tui.fake import MAIN, NOW, FakeSource, synthetic
from tui.source import Conn, Update
from tui.state import TargetData

BENCH = "127.0.0.1:50000"  # the target of tui.fake.synthetic


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
