"""The program's own metrics carry a unit and help to ``metrics_report()`` and
Prometheus (``# HELP`` and the unit suffix); across the wire (``tpu-info
--metric NAME``, ``--json``) in tests/metrics/engines/jax/test_jax_monitoring.py.
``executed_fallback_ops()`` has torch_xla's call shape (its real answer is
compared in tests/metrics/engines/torch/test_torch_xla.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from metrics.export.prometheus import SnapshotCollector
from metrics.recording import custom
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from tpu_info.contract.model import Unit
from tpu_info.outputs.textreport import metrics_report


def _exposition(rec: Recorder) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: build(rec, [])))
    return generate_latest(registry).decode()


def test_a_custom_distribution_carries_its_unit_and_help_to_report_and_prometheus():
    rec = Recorder()
    load = custom.define(rec, "distribution", "DataLoadTime", "ns", "Time to load one batch.")
    load.observe(1_000_000)
    read = custom.define(rec, "distribution", "BatchBytes", "bytes", "Bytes of one batch.")
    read.observe(2_500_000)
    plain = custom.define(rec, "distribution", "Plain", "1", "")
    plain.observe(1_000_000)
    ckpt = custom.define(rec, "counter", "Checkpoints", "1", "Checkpoints written.")
    ckpt.inc()
    report = metrics_report(build(rec, []))
    assert "Metric: DataLoadTime\n  TotalSamples: 1\n  Accumulator: 001ms000.000us\n" in report
    assert "Metric: BatchBytes\n  TotalSamples: 1\n  Accumulator: 2.38MB\n" in report
    assert "Metric: Plain\n  TotalSamples: 1\n  Accumulator: 1000000.00\n" in report
    text = _exposition(rec)
    assert "# HELP tpu_info_data_load_time_seconds Time to load one batch." in text
    assert "tpu_info_data_load_time_seconds_sum 0.001" in text
    assert "# HELP tpu_info_batch_bytes Bytes of one batch." in text
    assert "# HELP tpu_info_checkpoints_total Checkpoints written." in text


def test_custom_metric_units_are_checked_and_one_name_has_one_unit():
    rec = Recorder()
    assert custom.parse_unit("NS") is Unit.TIME_NS and custom.parse_unit("B") is Unit.BYTES
    with pytest.raises(ValueError, match="not one of 'ns'"):
        custom.define(rec, "distribution", "X", "seconds", "")
    d = custom.define(rec, "distribution", "X", "ns", "")
    assert custom.define(rec, "distribution", "X", "ns", "later help") is d
    assert d.help == "later help"  # first made without one
    with pytest.raises(ValueError, match="already recorded in 'ns', not 'bytes'"):
        custom.define(rec, "distribution", "X", "bytes", "")
    with pytest.raises(ValueError, match="1..200 characters"):
        custom.define(rec, "counter", "", "1", "")


def test_metrics_module_api_and_executed_fallback_ops_without_torch_xla():
    import metrics

    d = metrics.distribution("TestCustomLatency", unit="ns", help="A latency.")
    d.observe(5_000)
    assert d.unit is Unit.TIME_NS and d.help == "A latency."
    assert metrics.counter("TestCustomN", unit="bytes").unit is Unit.BYTES
    # torch_xla's shape: a list of the aten:: counter names that hold something.
    fallbacks = metrics.executed_fallback_ops()
    assert isinstance(fallbacks, list) and all(n.startswith("aten::") for n in fallbacks)
    assert "executed_fallback_ops" in metrics.__all__
