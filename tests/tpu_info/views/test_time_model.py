"""Costs charged to the work that spent them (issue 41): a device->host read
costs the drain it causes, not the device's queued work it waited for, and
an extrapolation never says more than was measured. Real JAX on the CPU for
the hook's side; snapshots for the views' arithmetic. Wall-clock A/B
comparisons are in bench/tpu_costs.py (not asserted: the machine is shared)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tests.tpu_info.views.test_findings_cost import STEPS, _one, _snap, _sync
from tpu_info.contract.model import DistributionReading, Samples, SiteReading, Snapshot, Unit
from tpu_info.views.findings import find
from tpu_info.wire.codec import snapshot_from_proto
from tpu_info.wire.fillers import snapshot_to_proto

ROOT = Path(__file__).resolve().parents[3]


def test_a_reads_drain_is_the_least_of_its_wait_and_the_hosts_time_since_the_last_read():
    # (kinds, starts, ends): a read after 10 ns of host time waiting 30 ns
    # drains 10; one right after it (a device_get's next leaf) drains 0; an
    # untimed host->device record (kind 4) is no wait.
    from metrics.engines.jax.drains import drains

    per, last = drains([0, 2, 4, 0], [10, 40, 45, 100], [40, 42, 45, 101], last_end=0)
    assert per == [10, 0, -1, 1] and last == 101


# A device-bound loop (a step of several big matmuls) that prints its loss every
# 20 steps: the print waits for ~20 steps of device work, which runs either way.
PRINT_EVERY_20 = '''
import json, sys
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
from tpu_info.views.findings import find
@jax.jit
def step(w, x):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return w - 1e-4 * x.T @ x, jnp.mean(x)
w = jnp.eye(512) * 0.5; x = jnp.ones((512, 512))
for i in range(120):
    w, loss = step(w, x)
    if i % 20 == 0:
        print(f"step {i} loss {loss}", file=sys.stderr)  # the read
w.block_until_ready()
''' + PRINT_SNAPSHOT


@pytest.mark.slow
def test_a_print_every_20_steps_in_a_device_bound_loop_costs_its_drain_not_its_wait(tmp_path):
    # Before: "periodic_sync ... 688 ms each, 82% of run time" for a print whose
    # removal changed nothing (A/B: bench/tpu_costs.py --variant).
    s = snapshot_printed_by(tmp_path, PRINT_EVERY_20, "print20.py")  # as the CLI reads it
    line = next(n for n, text in enumerate(PRINT_EVERY_20.splitlines(), start=1)
                if "# the read" in text)
    (read,) = [x for x in s.sites if x.kind == "sync" and x.location.endswith(f":{line}")]
    assert read.count == 6 and read.drain_seconds is not None  # travelled the wire
    assert read.drain_seconds < 0.2 * read.seconds  # the wait was the device's queue
    for f in find(s):
        assert f.seconds_lost <= s.uptime_seconds
        if f.location == read.location:
            assert f.seconds_lost < 0.2 * read.seconds and f.severity == "info", f.message
            assert "queued work" in f.message


def test_a_per_step_read_costs_its_drain_with_what_it_stands_on():
    # Host-bound: each read's wait is all drain (1.2 ms a step), as removing it saves.
    host = _one(_snap(SiteReading("sync", "/src/train.py:88", 1200, bytes=4800, seconds=1.5,
                                  function="train", detail="float()", drain_seconds=1.5)),
                "per_step_sync")
    assert host.seconds_lost == 1.5 and "drain it caused" in host.message
    # Device-bound: 4.9 s of waiting held 4.8 s of the device's own steps.
    dev = replace(_sync(seconds=4.92), drain_seconds=0.06)
    f = _one(_snap(dev), "per_step_sync")
    assert abs(f.seconds_lost - 0.06) < 1e-9 and f.seconds_lost <= STEPS.seconds_total
    assert "4.9 s of waiting held 4.9 s of the device's queued work" in f.message
    # An older hook's read (no drain told) keeps the bound it had.
    assert _one(_snap(_sync(seconds=4.92)), "per_step_sync").seconds_lost <= 4.92


def test_slow_steps_never_say_more_than_was_measured():
    # 275 s of uptime, 10,000 timed steps of 20 ms, the last 64 holding 10
    # of 1.5 s: scaling the window to all steps said "~1017.6 s in all".
    times = [1000.0 + 0.1 * i for i in range(64)]
    values = [1.5e9 if i % 6 == 5 else 20e6 for i in range(64)]
    total = 20e6 * 10_000 + sum(v - 20e6 for v in values)
    d = DistributionReading("StepTime", Unit.TIME_NS, 10_000, total, 20e6, 1.5e9,
                            percentiles=((50.0, 20e6), (99.0, 1.5e9)),
                            recent=Samples(times, values))
    s = Snapshot(1010.0, uptime_seconds=275.0, steps=STEPS, distributions=(d,))
    (f,) = [f for f in find(s) if f.kind == "slow_steps"]
    measured = total / 1e9 - 0.02 * 10_000
    assert f.seconds_lost <= measured + 1e-6 and f.seconds_lost <= 275.0
    assert (f.share_of_run or 0.0) <= 1.0
    assert "at most" in f.message and "timed steps took above the median" in f.message
    # The wire and Prometheus read the same figure.
    back = snapshot_from_proto(snapshot_to_proto(s))
    (g,) = [g for g in find(back) if g.kind == "slow_steps"]
    assert g.seconds_lost == f.seconds_lost


def test_slow_steps_name_only_the_periodic_reads_seen_in_them():
    # makemore (karpathy) on a loaded 2-core machine: 16 of the last 64 steps
    # slow at random (CPU contention), and the finding said "in them the hook
    # saw item() at makemore.py:695 (62 times); tolist() at makemore.py:468
    # (30 times)": every periodic site, counted over the whole run, none of
    # them seen in a slow step. A periodic read last seen inside a slow step
    # (an evaluation's reads at its last evaluation) is still named.
    times = [1000.0 + 0.1 * i for i in range(64)]
    values = [0.09e9 if i in (7, 19, 20, 41, 52) else 0.012e9 for i in range(64)]
    d = DistributionReading("StepTime", Unit.TIME_NS, 620, sum(values) + 0.012e9 * 556,
                            0.011e9, 0.09e9, percentiles=((50.0, 0.012e9), (99.0, 0.09e9)),
                            recent=Samples(times, values))
    log = SiteReading("sync", "/w/makemore.py:695", 62, seconds=0.001, detail="item()",
                      phase="periodic", first_seen_unix=940.0, last_seen_unix=1000.35)
    ev = SiteReading("sync", "/w/makemore.py:495", 40, seconds=0.001, detail="item()",
                     phase="periodic", first_seen_unix=950.0, last_seen_unix=1004.05)
    s = Snapshot(1007.0, uptime_seconds=18.0, steps=STEPS, distributions=(d,),
                 sites=(log, ev))
    (f,) = [f for f in find(s) if f.kind == "slow_steps"]
    assert "makemore.py:695" not in f.message, f.message
    assert "item() at makemore.py:495 (40 times in the run)" in f.message, f.message


def test_two_odd_slow_steps_in_the_window_are_not_scaled_to_the_whole_run():
    # nanoGPT on a loaded 2-core machine, hooked (issue 41 re-run): 300 timed
    # steps of 9.8 ms, 2 of the last 64 slow at random (25 and 42 ms, no
    # evaluation or log step; 2 more runs with the same arguments had none,
    # nor did the program without the hook). Scaled 300/64 they said "~223 ms
    # in all, 1.9% of run time" (over the 1% bar) and blamed host work; the
    # 47 ms measured is 0.4%. Two make no rate: only 3 or more are scaled.
    median, run = 0.0098, 11.6
    times = [1000.0 + 0.011 * i for i in range(64)]
    values = [(0.0254 if i == 20 else 0.0417 if i == 26 else median) * 1e9 for i in range(64)]
    total = (300 * median + 0.305) * 1e9  # all steps' time above the median: 305 ms
    d = DistributionReading("StepTime", Unit.TIME_NS, 300, total, 8.5e6, 0.0417e9,
                            percentiles=((50.0, median * 1e9), (99.0, 0.0425e9)),
                            recent=Samples(times, values))
    s = Snapshot(1001.0, uptime_seconds=run, steps=STEPS, distributions=(d,))
    assert "slow_steps" not in {f.kind for f in find(s)}
    # Three in the window are a rate: scaled to all (estimated, saying so).
    values[40] = 0.0417e9
    d3 = replace(d, recent=Samples(times, values))
    (f,) = [f for f in find(replace(s, distributions=(d3,))) if f.kind == "slow_steps"]
    assert f.count == 3 and "scaled to all" in f.message, f.message
    assert f.seconds_lost > (0.0254 + 2 * 0.0417 - 3 * median) * 1.5


def test_a_read_on_a_busy_cpu_backend_is_an_upper_bound_at_information():
    # flax's fsdp example on the CPU backend at load 2-5 on 2 cores: a
    # float() every step said 181-284 us/step (13-18 %, a warning) where
    # removing it saved ~28 us/step: the device is the host's own cores, and
    # with none free its work could not overlap the host's anyway.
    from tpu_info.contract.model import DeviceRecord, MemoryReading

    read = replace(_sync(seconds=40.0), drain_seconds=30.0)
    cpu = (DeviceRecord(0, "TFRT_CPU_0", "cpu", MemoryReading(None)),)
    queue = DistributionReading("TrainingThreadRunQueue", Unit.NUMBER, 20, 20 * 40.0, 30.0,
                                50.0, percentiles=((50.0, 40.0),))
    free = _one(_snap(read, devices=cpu), "per_step_sync")
    assert free.severity == "warning" and "upper bound" not in free.message
    busy = _one(_snap(read, devices=cpu, distributions=(queue,)), "per_step_sync")
    assert busy.severity == "info" and busy.seconds_lost == free.seconds_lost
    assert "waited for a core 40% of the loop's time" in busy.message
    assert "an upper bound" in busy.message
