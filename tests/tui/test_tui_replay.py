"""``tpu-info --watch --from FILE``: a saved run replayed in the dashboard, its
events and step times filling in moment by moment, then read as ended."""

from __future__ import annotations

from datetime import UTC

from tests.tui.test_tui import header
from tui.app import WatchApp
from tui.fake import NOW, FrozenClock, demo_frame
from tui.replay import ReplaySource, frames
from tui.source import Conn, Update
from tui.widgets.graphs import GraphsPanel


def _run_snapshot():
    snap, _ = demo_frame(59, 0, NOW, 4)
    return snap


def test_frames_cut_the_events_and_samples_at_each_moment():
    snap = _run_snapshot()
    cut = frames(snap, 10)
    assert cut[-1] is snap and len(cut) == 10
    assert [f.taken_at_unix for f in cut] == sorted(f.taken_at_unix for f in cut)
    for f in cut:
        assert all(e.time_unix <= f.taken_at_unix for e in f.events)
        for d in f.distributions:
            assert all(t <= f.taken_at_unix for t, _ in d.recent)
    assert len(cut[0].events) <= len(cut[5].events) <= len(snap.events)


async def test_the_replay_shows_the_run_and_then_that_it_ended():
    snap = _run_snapshot()
    source = ReplaySource("train.py-7-20261204.tpurun", snap, "SIGTERM", NOW)
    updates = source.initial()
    assert isinstance(updates[-1], Update) and updates[-1].state == Conn.DISCONNECTED
    assert "the program ended (SIGTERM)" in updates[-1].error
    app = WatchApp(source, 1.0, clock=FrozenClock(), tz=UTC, tick_s=None)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        assert app.main.query_one(GraphsPanel).row_keys  # the run's graphs
        assert "train.py-7-20261204.tpurun" in header(app) or "ended" in header(app)
        await pilot.press("q")
