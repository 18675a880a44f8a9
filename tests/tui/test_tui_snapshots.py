"""Layout of the dashboard (pytest-textual-snapshot), against the deterministic
fake source and a frozen clock: main screen, graph detail, finding detail
and the disconnected state, at 80x24 and 200x50 (and the main screen at
160x45, the size the dashboard was judged at).

Update the SVGs under ``tests/__snapshots__/`` with ``pytest --snapshot-update``
after an intended change, and look at them before committing.
"""

from __future__ import annotations

from datetime import UTC

import pytest

from tui.app import WatchApp
from tui.fake import FakeSource, FrozenClock

SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
MAIN_SIZES = {**SIZES, "160x45": (160, 45)}


def app(**kw: object) -> WatchApp:
    return WatchApp(FakeSource.demo(**kw), 1.0, clock=FrozenClock(), tz=UTC,  # type: ignore[arg-type]
                    tick_s=None)


@pytest.mark.parametrize("size", MAIN_SIZES)
def test_main_screen(snap_compare, size):
    # Findings one line each under the processes, costliest first; graphs by
    # cost per step, JAX's set-up graphs dimmed under their own line.
    assert snap_compare(app(), terminal_size=MAIN_SIZES[size])


@pytest.mark.parametrize("size", SIZES)
def test_detail_screen(snap_compare, size):
    # By cost per step the second jit(train_step) graph (the recompile) is second.
    assert snap_compare(app(), press=["down", "enter"], terminal_size=SIZES[size])


@pytest.mark.parametrize("size", SIZES)
def test_finding_screen(snap_compare, size):
    # f: the costliest finding, its source line, history and advice.
    assert snap_compare(app(), press=["f"], terminal_size=SIZES[size])


@pytest.mark.parametrize("size", SIZES)
def test_disconnected(snap_compare, size):
    assert snap_compare(app(disconnected=True), terminal_size=SIZES[size])


FLOOD_SIZES = {"160x45": (160, 45), "80x24": (80, 24)}


def flood_app(**kw: object) -> WatchApp:
    from tui.recorded import flood

    return WatchApp(flood(**kw), 1.0, clock=FrozenClock(), tz=UTC,  # type: ignore[arg-type]
                    tick_s=None)


@pytest.mark.parametrize("size", FLOOD_SIZES)
def test_step_flood(snap_compare, size):
    """~1,200 steps/s: the step line (rate, P50/P99, busy, markers, the last
    recompile's cause) and events without a single step row."""
    assert snap_compare(flood_app(), terminal_size=FLOOD_SIZES[size])


def test_step_flood_disconnected(snap_compare):
    assert snap_compare(flood_app(disconnected=True), terminal_size=FLOOD_SIZES["160x45"])


def test_help_screen(snap_compare):
    """Every key and every panel, read from the bindings and the screen."""
    assert snap_compare(flood_app(), press=["question_mark"],
                        terminal_size=FLOOD_SIZES["160x45"])
