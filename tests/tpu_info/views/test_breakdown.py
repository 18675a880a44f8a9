"""Where the time went (issue 41): the run split into start-up, compiles,
steady steps, periodic work and the rest, and the steady step into the
host's copies, waits and other work beside the device's own time, read from
a snapshot (fixtures for the arithmetic; a real JAX program for the whole
path: the hook's figures, the text report, ``--json`` and the summary)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    DistributionReading,
    GraphRecord,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.breakdown import breakdown, copy_bound, device_idle
from tpu_info.views.cost import cost_of, steps_of


def _dist(name: str, seconds: float, count: int = 1) -> DistributionReading:
    return DistributionReading(name, Unit.TIME_NS, count, seconds * 1e9, None, None)


def _snapshot(device_seconds: float | None = 0.002, eval_gap: float = 10.0,
              steps_seconds: float = 80.0) -> Snapshot:
    """100 s of run: 7 s opening the TPU, 12 s of compiles (2 of them in the
    loop's first steps), 1,000 steps over 80 s of which 10 s are an
    evaluation every 100 steps in the loop's gaps; a numpy batch a step timed
    at 1 ms; the step graph measured at ``device_seconds`` an execution."""
    steps = StepsReading(1000, "inferred", "jit(step): the jitted function with the most time",
                         steps_seconds)
    graphs = (GraphRecord("a" * 64, "jit(step)", "jax", 0.0, 0.0, compiles=1,
                          compile_seconds_total=2.0, executions=1000,
                          device_seconds=device_seconds, device_samples=40 if device_seconds
                          else 0),
              GraphRecord("b" * 64, "jit(evaluate)", "jax", 0.0, 0.0, compiles=1,
                          executions=400, device_seconds=0.01, device_samples=30))
    sites = (SiteReading("implicit_to_device", "/u/train.py:40", 1000, bytes=1000 * 131072,
                         seconds=0.04, phase="step", timed=40, timed_bytes=40 * 131072),
             SiteReading("call", "/u/train.py:50", 10, phase="periodic", work="evaluation",
                         gaps=10, gap_seconds=eval_gap, occurrences=10))
    return Snapshot(0.0, uptime_seconds=100.0, steps=steps, graphs=graphs, sites=sites,
                    distributions=(_dist(catalog.BACKEND_START_TIME, 7.0),
                                   _dist(catalog.COMPILE_TIME, 10.0, 3),
                                   _dist(catalog.TRACE_TIME, 2.0, 3),
                                   _dist(catalog.COMPILE_STEP_TIME, 2.0, 2)))


def test_the_run_is_split_into_measured_parts_that_never_pass_it() -> None:
    b = breakdown(_snapshot())
    assert b is not None
    parts = {p.name: p.seconds for p in b.parts}
    # Steps: 80 s less the 2 s of compiles inside them and the 10 s evaluation.
    assert parts == pytest.approx({"start-up": 7.0, "compiles": 12.0, "steps": 68.0,
                                   "evaluation": 10.0, "other": 3.0})
    assert sum(parts.values()) == pytest.approx(b.run_seconds) and b.overlap == 0
    assert b.lines()[0] == ("run 100.0 s: start-up 7.0 s (7%), compiles 12.0 s (12%), "
                            "steps 68.0 s (68%), evaluation 10.0 s (10%), other 3.0 s (3%)")
    fields = b.fields()
    assert [p["name"] for p in fields["parts"]][-1] == "other"
    assert fields["parts"][0]["share"] == pytest.approx(0.07)


def test_parts_that_overlap_are_said_to_and_no_remainder_is_negative() -> None:
    # The steps' span measured at 95 s in a 100 s run with 7 s of start-up and
    # 12 s of compiles before it: the parts add up to 112 s.
    b = breakdown(_snapshot(steps_seconds=95.0))
    assert b is not None and "other" not in {p.name for p in b.parts}
    assert b.overlap == pytest.approx(7 + 12 + (95 - 2 - 10) + 10 - 100)
    assert "(parts overlap by 12.0 s)" in b.lines()[0]
    # An evaluation measured as long as the steps' span: the steps are 0, never less.
    b = breakdown(_snapshot(eval_gap=90.0))
    assert b is not None and dict((p.name, p.seconds) for p in b.parts)["steps"] == 0.0


def test_the_steady_step_splits_the_hosts_time_beside_the_devices() -> None:
    b = breakdown(_snapshot())
    assert b is not None and b.step_seconds == pytest.approx(0.068)
    host = {p.name: p.seconds for p in b.step_parts}
    # The copies: 40 timed of 1,000 (1 ms each), scaled by bytes to all: 1 ms a step.
    assert host == pytest.approx({"copies to the device": 0.001, "other": 0.067})
    assert b.device == pytest.approx(0.002) and "median of 40 timed executions" in b.device_basis
    assert b.device_waits == pytest.approx(1 - 0.002 / 0.068)
    assert "device busy 2.0 ms (3%, median of 40 timed executions)" in b.lines()[1]


def test_a_device_time_past_the_step_is_an_upper_bound_and_bounds_nothing() -> None:
    s = _snapshot(device_seconds=0.09)  # 90 ms measured for a 68 ms step
    b = breakdown(s)
    assert b is not None and "device busy all of it" in b.lines()[1]
    assert "is an upper bound" in b.lines()[1]
    assert device_idle(s) is None  # not trusted for a copy's bound
    c = cost_of(s, 60.0, 1000, phase="step")
    assert copy_bound(s, c) is c


def test_a_copy_costs_at_most_the_steps_the_device_was_not_busy() -> None:
    s = _snapshot(device_seconds=0.0675)  # the device busy 67.5 of the 68 ms step
    idle = device_idle(s)
    assert idle is not None and idle.seconds == pytest.approx(0.5)  # 68 s - 67.5 s
    bounded = copy_bound(s, cost_of(s, 1.0, 1000, phase="step"))
    assert bounded.seconds == pytest.approx(0.5)
    assert "at most the steps' time the device was not busy" in bounded.label()
    assert "68 ms/step (median of 40 timed executions)" in bounded.label()
    small = cost_of(s, 0.2, 1000, phase="step")
    assert copy_bound(s, small) is small  # under the bound: as measured


def test_no_uptime_no_breakdown_and_no_steps_no_step_line() -> None:
    assert breakdown(Snapshot(0.0)) is None
    b = breakdown(Snapshot(0.0, uptime_seconds=5.0))
    assert b is not None and [p.name for p in b.parts] == ["other"] and b.step_seconds is None
    assert len(b.lines()) == 1


def test_steps_of_takes_the_periodic_work_out_of_the_steady_steps() -> None:
    st = steps_of(_snapshot())
    assert st is not None
    assert (st.compile_seconds, st.periodic_seconds) == pytest.approx((2.0, 10.0))
    assert st.steady_seconds_total == pytest.approx(68.0)


PROGRAM = '''
import json, sys
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
X = np.random.default_rng(0).normal(size=(4096, 256)).astype(np.float32)
W = jnp.zeros((256, 256))

@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w - x) ** 2))(w), jnp.mean(x)

@jax.jit
def evaluate(w, x):
    return jnp.mean((x @ w - x) ** 2)

for i in range(400):
    j = (i * 64) % 4000
    W, loss = step(W, X[j:j + 64])  # the numpy batch
    if i % 50 == 49:
        total = 0.0
        for k in range(20):
            total += float(evaluate(W, X[k * 64:(k + 1) * 64]))  # the evaluation
W.block_until_ready()
s = metrics.snapshot()
from tpu_info.outputs.jsonview import dumps, report_json
from tpu_info.outputs.summary import summary
from tpu_info.outputs.textreport import metrics_report
from tpu_info.wire.fillers import snapshot_to_proto
print(json.dumps({"report": metrics_report(s), "json": json.loads(dumps(report_json("t", s))),
                  "summary": summary(s, "exit 0"),
                  "proto": snapshot_to_proto(s).SerializeToString().hex()}))
'''


@pytest.mark.slow
def test_a_real_program_s_time_is_split_in_every_output(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(out["proto"])))
    b = breakdown(s)
    assert b is not None
    parts = {p.name: p.seconds for p in b.parts}
    assert {"compiles", "steps", "evaluation"} <= set(parts)
    assert sum(parts.values()) <= b.run_seconds * 1.0001 + b.overlap
    st = steps_of(s)
    assert st is not None and parts["steps"] == pytest.approx(st.steady_seconds_total)
    # The evaluation's time is its gaps' (less its compile), not the steps'.
    (lead,) = [x for x in s.sites if x.work == "evaluation"]
    assert parts["evaluation"] == pytest.approx(lead.gap_seconds)
    assert st.periodic_seconds == pytest.approx(lead.gap_seconds)
    assert b.step_seconds is not None and b.step_seconds > 0
    assert any(p.name == "copies to the device" for p in b.step_parts)
    # Every output says it.
    assert "\nTime:\n  run " in out["report"] and "  steady step " in out["report"]
    assert out["json"]["target"]["time"]["parts"][0]["name"] in parts
    assert out["json"]["target"]["time"]["steady_step"]["seconds"] == pytest.approx(
        b.step_seconds)
    assert "\n  time: " in out["summary"] and "steady step" in out["summary"]
    from tpu_info.outputs.html import report_html

    page = report_html(s)
    assert '<section id="time"><h2>Where the time went</h2>' in page and "steady step" in page


def test_no_copy_bound_where_the_training_thread_set_the_pace() -> None:
    """On the TPU machine a host-bound step whose loop ran at 195 us a step
    sampled 471 us of device time (the watcher's samples are upper bounds),
    which cut the copies to 18 us a step where the A/B measured 147: where the
    training thread was on the CPU nearly all the loop, no bound applies."""
    import dataclasses

    s = _snapshot(device_seconds=0.0675)
    c = cost_of(s, 1.0, 1000, phase="step")
    assert copy_bound(s, c).seconds == pytest.approx(0.5)  # waited for the device: bounded
    busy = DistributionReading(catalog.TRAINING_THREAD_BUSY, Unit.NUMBER, 60, 60 * 97.0,
                               95.0, 99.0, percentiles=((50.0, 97.0),))
    paced = dataclasses.replace(s, distributions=(*s.distributions, busy))
    assert copy_bound(paced, c) is c
    few = dataclasses.replace(busy, count=2)
    assert copy_bound(dataclasses.replace(s, distributions=(*s.distributions, few)), c) \
        is not c  # two seconds stand on too little


def test_compiles_the_backend_cache_answered_count_their_graphs_time() -> None:
    # nanoGPT with a warm Inductor cache (issue 41 re-run): 2 compiles, both
    # backend cache hits, 2.63 s + 0.30 s in the graphs (slow_compile and
    # recompile_grad_mode said so), but a cache hit records only Dynamo's
    # TraceTime (663 ms), no CompileTime: the Time line said "compiles 663 ms
    # (6%)" and put the other 2.3 s in "other".
    graphs = (GraphRecord("a" * 64, "compile(GPT.forward)", "torch_compile", 0.0, 0.0,
                          compiles=1, compile_seconds_total=2.632, cache_hits=1,
                          executions=160),
              GraphRecord("b" * 64, "compile(GPT.forward)", "torch_compile", 0.0, 0.0,
                          compiles=1, compile_seconds_total=0.299, cache_hits=1,
                          executions=301))
    steps = StepsReading(301, "inferred", "optimizer.step(): 301 calls (AdamW)", 3.72)
    s = Snapshot(0.0, uptime_seconds=11.6, steps=steps, graphs=graphs,
                 distributions=(_dist(catalog.TRACE_TIME, 0.663, 2),))
    b = breakdown(s)
    assert b is not None
    parts = {p.name: p.seconds for p in b.parts}
    assert parts["compiles"] == pytest.approx(2.931)
    # Where the distributions hold more than the graphs (JAX's trace and
    # lowering beside the backend's compile), they still count.
    assert {p.name: p.seconds for p in breakdown(_snapshot()).parts}["compiles"] == 12.0


def _sub_ms(device_seconds: float) -> Snapshot:
    """nnx_lifted (issue 41 re-run): 10,000 steps of 357 us, flax's
    nnx.cached_partial wrapper 168 us of each (measured on the host), the
    step graph's device samples at ``device_seconds`` an execution."""
    steps = StepsReading(10000, "inferred", "jit(train_step): the jitted function with the "
                         "most time", 3.57)
    graph = GraphRecord("a" * 64, "jit(train_step)", "jax", 0.0, 0.0, compiles=1,
                        compile_seconds_total=0.17, executions=10000,
                        device_seconds=device_seconds, device_samples=64)
    wrapper = SiteReading("library_jit", "/w/prog.py:90", 10000, seconds=1.68,
                          detail="jit(train_step)", phase="step", timed=121,
                          via="flax nnx.cached_partial")
    return Snapshot(0.0, uptime_seconds=6.4, steps=steps, graphs=(graph,), sites=(wrapper,))


def test_device_samples_on_a_sub_ms_host_bound_step_are_not_called_all_of_it() -> None:
    # Before: "device busy all of it (its measured 1.0 ms a step ... is an
    # upper bound)" beside a jit wrapper of 47% of the step, which a plain
    # jax.jit removed (the loop 45% faster): the samples held the timing
    # thread's wait for the GIL, not the device's work.
    b = breakdown(_sub_ms(0.001))
    assert b is not None and b.step_seconds == pytest.approx(357e-6)
    line = b.lines()[1]
    assert "jit wrapper (flax nnx.cached_partial) 168 us (47%)" in line, line
    assert "all of it" not in line and "device time unmeasured" in line, line
    assert "ran past this sub-ms step" in line
    step = b.fields()["steady_step"]
    assert step["device_waits_share"] is None and step["device_upper_bound"] is True
    assert "device busy" not in b.short_line()
    # Samples under such a step: an upper bound, said as one.
    under = breakdown(_sub_ms(0.0002))
    assert under is not None and "device busy at most 200 us (56%" in under.lines()[1]
    assert under.fields()["steady_step"]["device_waits_share"] is None
    # A step of milliseconds the host's wrapper fills half of: the same.
    long = replace(_sub_ms(0.02), steps=StepsReading(
        10000, "inferred", "jit(train_step): the jitted function with the most time", 30.0),
        sites=(SiteReading("library_jit", "/w/prog.py:90", 10000, seconds=16.0,
                           detail="jit(train_step)", phase="step", timed=121,
                           via="flax nnx.jit"),))
    lb = breakdown(long)
    assert lb is not None and "all of it" not in lb.lines()[1]
    assert "ran past this step, 53% of it the host's measured work" in lb.lines()[1]
