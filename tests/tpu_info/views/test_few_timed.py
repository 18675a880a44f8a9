"""Percentiles say how many timed samples they stand on, and none is shown from
fewer than MIN_TIMED_SAMPLES (issue 28, item 11): transfers (tables, JSON),
the step line; metrics_report() keeps torch_xla's format and hides nothing."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    CounterReading,
    DistributionReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.outputs.jsonview import to_json
from tpu_info.outputs.render import render_text
from tpu_info.outputs.textreport import metrics_report
from tpu_info.views.steps import step_line
from tpu_info.views.values import (
    MIN_TIMED_SAMPLES,
    Header,
    TargetView,
    dist_percentile,
    transfer_stats,
)
from tui.fake import dist


def _times(n: int) -> DistributionReading:
    # The slow first transfer, then fast ones.
    return dist(catalog.TRANSFER_TO_DEVICE_TIME, Unit.TIME_NS,
                [81.4e6] + [200_000.0 * (1 + i % 5 / 10) for i in range(n - 1)])


def snapshot(timed: int, transfers: int = 1623) -> Snapshot:
    """``transfers`` host->device transfers counted (bytes), ``timed`` of them timed."""
    return Snapshot(
        taken_at_unix=10.0, uptime_seconds=10.0,
        counters=(CounterReading(catalog.IMPLICIT_TRANSFER_TO_DEVICE, transfers - timed),
                  CounterReading(catalog.IMPLICIT_OUTBOUND_BYTES, (transfers - timed) * 1024)),
        distributions=(_times(timed),
                       DistributionReading(catalog.OUTBOUND_DATA, Unit.BYTES, transfers,
                                           transfers * 1024.0, 1024.0, 1024.0)))


def test_the_minimum_is_twenty():
    assert MIN_TIMED_SAMPLES == 20


def test_few_timed_transfers_have_no_percentiles_and_say_why():
    h2d, _ = transfer_stats(snapshot(5))
    assert h2d.count == 1623 and h2d.timed == 5
    assert h2d.p50_ns is None and h2d.p999_ns is None
    why = h2d.reasons["p50_ns"]
    assert "only 5 timed samples (< 20)" in why and "of 1,623 host->device" in why


def test_enough_timed_transfers_show_percentiles_and_how_many_were_timed():
    h2d, _ = transfer_stats(snapshot(25))
    assert h2d.p50_ns is not None and h2d.p50_ns < 1e6 and not h2d.reasons
    assert h2d.timed == 25 and h2d.timed_note() == "25 timed"
    every, _ = transfer_stats(snapshot(40, transfers=40))
    assert every.timed == 40 and every.timed_note() == ""  # all timed: nothing to add


def test_table_and_json_say_how_many_were_timed():
    views = [TargetView("127.0.0.1:9", snapshot(25)), TargetView("127.0.0.1:8", snapshot(5))]
    out = render_text(views, 200, header=Header(host="h", time_unix=0.0))
    assert "1623 (1598 implicit, 25 timed)" in out
    doc = to_json(views, header=Header(host="h", time_unix=0.0))
    few, enough = doc["targets"][1]["transfers"]["h2d"], doc["targets"][0]["transfers"]["h2d"]
    assert enough["timed"] == 25 and enough["p50_ns"] is not None
    assert few["timed"] == 5 and few["p50_ns"] is None
    assert "only 5 timed samples (< 20)" in few["reasons"]["p50_ns"]


def test_metrics_report_keeps_torch_xlas_format_and_hides_nothing():
    text = metrics_report(snapshot(5))
    assert "Metric: TransferToDeviceTime\n  TotalSamples: 5\n" in text
    assert "  Percentiles: 1%=" in text  # shown, with TotalSamples beside them


def _steps(timed: int, marks: int) -> Snapshot:
    return Snapshot(taken_at_unix=10.0, uptime_seconds=10.0,
                    steps=StepsReading(marks, "marked", "metrics.mark_step", marks * 0.01),
                    counters=(CounterReading(catalog.MARK_STEP, marks),),
                    distributions=(dist(catalog.STEP_TIME, Unit.TIME_NS,
                                        [706e6] + [12e6] * (timed - 1)),))


def test_step_percentiles_from_few_timed_steps_are_na():
    line = step_line(TargetView("h:1", _steps(5, 6)))
    assert line.p50_seconds.value is None and line.p99_seconds.value is None
    assert "only 5 timed samples (< 20)" in line.p50_seconds.reason
    assert line.timed == 5


def test_step_percentiles_say_when_they_stand_on_fewer_steps_than_counted():
    # N marks time the N - 1 steps between them: nothing to add.
    line = step_line(TargetView("h:1", _steps(40, 41)))
    assert line.p50_seconds.value is not None and line.timed_note == ""
    fewer = step_line(TargetView("h:1", _steps(40, 400)))  # a clear between
    assert fewer.timed_note == "40 timed"


def test_a_percentile_from_enough_samples_but_no_buckets_says_so():
    d = DistributionReading(catalog.STEP_TIME, Unit.TIME_NS, 20, 20.0, 1.0, 1.0)
    value, why = dist_percentile(d, 50.0)
    assert value is None and "bucket counts" in why


def test_the_hooks_time_every_call_up_to_the_minimum():
    # Sampled timing times each hook's first TIME_FIRST calls: a distribution
    # of MIN_TIMED_SAMPLES or more holds at least that many timed values.
    from metrics.recording.sampling import TIME_FIRST

    assert TIME_FIRST >= MIN_TIMED_SAMPLES


def test_inferred_steps_that_were_timed_have_percentiles():
    # A torch program's optimizer steps, nothing marked: the hook times them into StepTime.
    s = _steps(40, 41)
    s = replace(s, steps=StepsReading(41, "inferred", "optimizer.step(): 41 calls (SGD)", 0.41))
    line = step_line(TargetView("h:1", s))
    assert line.p50_seconds.value is not None and abs(line.p50_seconds.value - 0.012) < 0.001
    bare = replace(s, distributions=())
    assert "inferred" in step_line(TargetView("h:1", bare)).p50_seconds.reason
