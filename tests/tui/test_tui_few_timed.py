"""The dashboard says how many timed samples a percentile stands on and shows
none from fewer than MIN_TIMED_SAMPLES (issue 28, item 11): the transfers
panel's Timed column and N/A with its reason, the step line's P50/P99."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC

from rich.console import Console

from tpu_info.contract import catalog
from tpu_info.contract.model import DistributionReading, Unit
from tui.app import WatchApp
from tui.fake import MAIN, NOW, FakeSource, FrozenClock, demo_frame, dist
from tui.source import Conn, Update
from tui.widgets.steps import StepsPanel
from tui.widgets.transfers import TransfersPanel

WIDE = (200, 50)


def _source(timed: int, transfers: int = 1623) -> FakeSource:
    """The demo process whose host->device row counted ``transfers`` and timed
    ``timed`` of them (a slow first one), with as many timed steps."""
    snap, _ = demo_frame(59, 0, NOW)
    slow_first = [81.4e6] + [200_000.0] * (timed - 1)
    dists = {d.name: d for d in snap.distributions}
    dists[catalog.TRANSFER_TO_DEVICE_TIME] = dist(catalog.TRANSFER_TO_DEVICE_TIME,
                                                  Unit.TIME_NS, slow_first)
    dists[catalog.OUTBOUND_DATA] = DistributionReading(
        catalog.OUTBOUND_DATA, Unit.BYTES, transfers, transfers * 4.0 * 2**20, 4.0 * 2**20,
        4.0 * 2**20)
    dists[catalog.STEP_TIME] = dist(catalog.STEP_TIME, Unit.TIME_NS, [706e6] + [12e6] * 4)
    return FakeSource([Update(MAIN, Conn.STREAMING,
                              replace(snap, distributions=tuple(dists.values())))])


async def _panels(timed: int) -> tuple[dict[str, str], str, str]:
    app = WatchApp(_source(timed), 1.0, clock=FrozenClock(), tz=UTC, tick_s=None)
    async with app.run_test(size=WIDE) as pilot:
        panel = app.main.query_one(TransfersPanel)
        for _ in range(100):  # until the reading is drawn
            await pilot.pause(0.05)
            if "h2d" in panel.row_keys:
                break
        cells = {c: str(panel.get_cell("h2d", c)) for c in ("count", "timed", "p50", "p999")}
        console = Console(width=400, file=io.StringIO(), color_system=None)
        console.print(app.main.query_one(StepsPanel).content)
        return cells, str(panel.tooltip), console.file.getvalue()  # type: ignore[attr-defined]


async def test_five_timed_of_1623_transfers_show_no_percentile_and_say_why():
    cells, tip, steps = await _panels(5)
    assert cells["count"] == "1623" and cells["timed"] == "5"
    assert cells["p50"] == "N/A" and cells["p999"] == "N/A"  # was 81.4 ms
    assert "only 5 timed samples (< 20)" in tip and "1,623 host->device" in tip
    # Five timed steps: no P50/P99 either, and the line says why.
    assert "P50 N/A" in steps and "only 5 timed samples (< 20)" in steps


async def test_enough_timed_transfers_show_percentiles_beside_how_many():
    cells, _, _ = await _panels(25)
    assert cells["timed"] == "25" and cells["p50"].endswith("µs")
