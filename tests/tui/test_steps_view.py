"""The step line's view (:mod:`tpu_info.views.steps`): rates from two readings,
percentiles from StepTime, and the CLI's N/A words when a value is missing."""

from __future__ import annotations

from tpu_info.contract.catalog import MARK_STEP
from tpu_info.contract.model import CounterReading, Snapshot, StepsReading
from tpu_info.views.derived import readings
from tpu_info.views.steps import (
    NO_RATE,
    interval_step_seconds,
    step_line,
    steps_per_second,
    transfers_per_second,
)
from tpu_info.views.values import NO_STEPS, Header, TargetView
from tui.recorded import flood_updates


def _marked(t: float, n: int) -> Snapshot:
    return Snapshot(t, counters=(CounterReading(MARK_STEP, n),))


def test_rate_needs_two_readings_and_survives_a_restart():
    assert steps_per_second(None, _marked(1.0, 10)) is None
    assert steps_per_second(_marked(1.0, 10), _marked(3.0, 30)) == 10.0
    assert steps_per_second(_marked(1.0, 10), _marked(1.0, 30)) is None  # same instant
    assert steps_per_second(_marked(1.0, 500), _marked(2.0, 3)) is None  # restarted
    assert interval_step_seconds(_marked(1.0, 10), _marked(3.0, 30)) == 0.1


def test_marked_steps_have_percentiles_from_step_time():
    a, b = (u.snapshot for u in flood_updates(frames=2))
    assert a is not None and b is not None
    line = step_line(TargetView("h:1", b), a)
    assert line.per_second.value == b.steps.count - a.steps.count  # type: ignore[union-attr]
    assert line.p50_seconds.value is not None and line.p99_seconds.value is not None
    assert line.p50_seconds.value < line.p99_seconds.value
    assert transfers_per_second(a, b) == (10.0, 0.0)
    assert line.na == ()


def test_missing_values_say_why_in_the_clis_words():
    s = Snapshot(5.0)
    line = step_line(TargetView("h:1", s))
    cli = readings([TargetView("h:1", s)], header=Header("h", 0.0)).targets[0].process
    assert cli is not None and line.steps.text() == cli.steps_short.text() == "N/A"
    assert line.steps.reason == cli.steps.reason == NO_STEPS
    assert line.busy.reason == "the process reported no devices"
    inferred = Snapshot(5.0, steps=StepsReading(1200, "inferred", "jit(step): most time", 2.4))
    line = step_line(TargetView("h:1", inferred))
    assert line.per_second.reason == NO_RATE and line.step_seconds.value == 0.002
    assert line.p50_seconds.reason.startswith("the steps are inferred (jit(step))")
