from __future__ import annotations

import pytest

from tpu_info.contract.model import (
    CounterReading,
    DistributionReading,
    GraphRecord,
    RecompileCause,
    Snapshot,
    Unit,
)
from tpu_info.outputs.textreport import (
    format_bytes,
    format_time_ns,
    metrics_report,
    short_metrics_report,
)


@pytest.mark.parametrize("ns,text", [
    (2_802_000, "002ms802.000us"),        # torch_xla prints 003ms802.000us
    (2_500_000, "002ms500.000us"),
    (467_580_793, "467ms580.793us"),      # torch_xla prints 468ms580.793us
    (1_352_039_967, "01s352ms039.967us"),
    (6_626_141_186, "06s626ms141.186us"),
    (428, "000.428us"),
    (999_999, "999.999us"),
    (1_000_000, "001ms000.000us"),
    (999_999_999.6, "01s000ms000.000us"),  # rounds to whole ns, then splits exactly
    (3_723_000_000_000, "01h02m03s000ms000.000us"),
    (0, "000.000us"),
])
def test_time_format_is_exact(ns: float, text: str):
    assert format_time_ns(ns) == text


@pytest.mark.parametrize("n,text", [(4, "4.00B"), (132, "132.00B"), (1536, "1.50KB"),
                                    (3 * 2**30, "3.00GB")])
def test_bytes_format(n: int, text: str):
    assert format_bytes(n) == text


def _snapshot() -> Snapshot:
    compile_time = DistributionReading(
        name="CompileTime", unit=Unit.TIME_NS, count=2, total=5_604_000.0,
        min=2_802_000.0, max=2_802_000.0, rate_per_second=4.0,
        value_rate_per_second=11_208_000.0,
        percentiles=tuple((p, 2_802_000.0) for p in (1, 5, 10, 20, 50, 80, 90, 95, 99)),
    )
    outbound = DistributionReading(
        name="OutboundData", unit=Unit.BYTES, count=1, total=132.0, min=132.0, max=132.0,
        percentiles=tuple((p, 132.0) for p in (1, 5, 10, 20, 50, 80, 90, 95, 99)),
    )
    cause = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[31,128]",
                           "/home/u/train.py:88", "batch", "f32[32,128]", "f32[31,128]")
    graphs = (
        GraphRecord("a" * 64, "jit(train_step)", "jax", 1.0, 3.0, compiles=1,
                    compile_seconds_total=0.0028, compile_seconds_last=0.0028, executions=40,
                    causes=(RecompileCause(1.0, "first call", "/home/u/train.py:88"),)),
        GraphRecord("b" * 64, "jit(train_step)", "jax", 2.0, 3.0, compiles=1,
                    compile_seconds_total=0.0028, compile_seconds_last=0.0028, executions=1,
                    causes=(cause,)),
    )
    return Snapshot(
        taken_at_unix=10.0, uptime_seconds=10.0,
        counters=(CounterReading("CachedCompile", 4), CounterReading("MarkStep", 41),
                  CounterReading("UncachedCompile", 2), CounterReading("aten::nonzero", 3)),
        distributions=(compile_time, outbound), graphs=graphs,
    )


GOLDEN = """\
Metric: CompileTime
  TotalSamples: 2
  Accumulator: 005ms604.000us
  ValueRate: 011ms208.000us / second
  Rate: 4 / second
  Percentiles: 1%=002ms802.000us; 5%=002ms802.000us; 10%=002ms802.000us; 20%=002ms802.000us; 50%=002ms802.000us; 80%=002ms802.000us; 90%=002ms802.000us; 95%=002ms802.000us; 99%=002ms802.000us
Metric: OutboundData
  TotalSamples: 1
  Accumulator: 132.00B
  Percentiles: 1%=132.00B; 5%=132.00B; 10%=132.00B; 20%=132.00B; 50%=132.00B; 80%=132.00B; 90%=132.00B; 95%=132.00B; 99%=132.00B
Counter: CachedCompile
  Value: 4
Counter: MarkStep
  Value: 41
Counter: UncachedCompile
  Value: 2
Counter: aten::nonzero
  Value: 3
Graphs: 2 known, top 2 by compile time
  hash          compiles   hits    compile time    execs  name
  aaaaaaaaaaaa         1      0  002ms800.000us       40  jit(train_step)
                last cause: first call at train.py:88
  bbbbbbbbbbbb         1      0  002ms800.000us        1  jit(train_step)
                last cause: argument 'batch' changed f32[32,128] -> f32[31,128] at train.py:88
Time:
  run 10.0 s: compiles 5.6 ms (<1%), other 10.0 s (100%)
Findings:
  - [recompile_short_last_batch] jit(train_step) compiled 2 times (5.6 ms compiling; 1 recompile, 2.8 ms: 0.024 per step, 68 us/step, measured); argument 'batch' changed f32[32,128] -> f32[31,128] (short last batch) at train.py:88. Pad or bucket the last batch to the batch size, or drop it: skip the short last slice (range(0, n - batch + 1, batch)), or drop_remainder=True where tf.data or grain batches it.
    cost: 68 us/step
  - [cpu_fallback] aten::nonzero ran on the CPU 3 times: it falls back to the CPU (no XLA lowering), so each call copies its inputs to the host and the result back. Replace it with ops that lower, or keep it out of the step; see torch_xla's TROUBLESHOOTING.md on aten:: counters.
"""


def test_metrics_report_golden():
    assert metrics_report(_snapshot()) == GOLDEN


def test_short_report_follows_torch_xla_order():
    text = short_metrics_report(_snapshot())
    blocks = [ln for ln in text.splitlines() if not ln.startswith(" ")]
    assert blocks == ["Counter: CachedCompile", "Metric: CompileTime", "Counter: MarkStep",
                      "Counter: aten::nonzero"]


def test_short_report_with_names():
    text = short_metrics_report(_snapshot(), counter_names=["MarkStep"],
                                metric_names=["OutboundData", "Missing"])
    assert [ln for ln in text.splitlines() if not ln.startswith(" ")] == [
        "Counter: MarkStep", "Metric: OutboundData"]


def test_empty_snapshot_reports_nothing():
    assert metrics_report(Snapshot(taken_at_unix=0.0)) == ""


def test_findings_say_what_the_hook_could_not_count():
    # The new JAX evaluation's nnx vae: a per-step np.asarray(loss) (a CPU
    # blind spot, 26 % of the step) sat beside other findings, and only
    # --json said the hook could not count it.
    from dataclasses import replace

    blind = "np.asarray(x) of a jax.Array on CPU is not counted"
    text = metrics_report(replace(_snapshot(), blind_spots=[blind]))
    findings = text.split("Findings:\n", 1)[1]
    assert f"  Not counted here: {blind}.\n" in findings
    assert "Not counted here" not in metrics_report(_snapshot())
