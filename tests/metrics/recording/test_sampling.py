"""Sampled timing (metrics.recording.sampling): every call and put counted,
one in TIME_EVERY timed, and the readings built from them still whole."""

from __future__ import annotations

import numpy as np
import pytest

from metrics.recording import sampling
from metrics.recording.callstats import CallTimes
from metrics.recording.registry import Distribution
from tpu_info.contract.model import EventKind, Unit

jax = pytest.importorskip("jax")
jnp = jax.numpy


class _Owner:
    def __init__(self, name: str, explicit: bool = False) -> None:
        self.name, self.explicit = name, explicit


def test_a_weighted_sample_reads_as_the_sample_repeated():
    values, weights = [10, 1000, 5, 0], [3, 1, 2, 4]
    weighted, repeated = Distribution("w", Unit.TIME_NS), Distribution("r", Unit.TIME_NS)
    weighted.observe_weighted(values, weights, [1, 2, 3, 4])
    flat = [v for v, w in zip(values, weights, strict=True) for _ in range(w)]
    repeated.observe_many(flat, list(range(1, len(flat) + 1)))
    a, b = weighted.reading(0.0), repeated.reading(0.0)
    assert (a.count, a.total, a.min, a.max) == (b.count, b.total, b.min, b.max) == (10, 1040, 0, 1000)
    assert a.percentiles == b.percentiles
    assert a.buckets == b.buckets


def test_timed_records_stand_for_their_owner_s_untimed_ones():
    f, g = _Owner("f"), _Owner("g")
    owners = [f, g, f, f, g, f, g]
    starts = [10, 20, 0, 0, 0, 60, 0]
    ends = [15, 22, 0, 0, 0, 61, 0]
    t = sampling.timed(owners, starts, ends, {f, g})
    assert t.owners == [f, g, f] and t.durations == [5, 2, 1]
    assert t.weights == [2, 3, 2]  # f: 4 calls over 2 timed; g: 3 over 1
    assert t.trailing == {f: 0, g: 2}
    assert t.untimed_only == {}
    only = sampling.timed([f, f], [0, 0], [0, 0], {f})
    assert only.untimed_only == {f: 2} and not only.owners
    assert sampling.filled([0, 5, 0, 0, 9, 0], 1) == [5, 5, 5, 5, 9, 9]
    assert sampling.filled([0, 0], 7) == [7, 7]
    assert all(sum(sampling.spread(n, k)) == n for n in range(1, 40) for k in range(1, n + 1))


def test_call_times_stay_whole_when_most_calls_are_untimed():
    """A function called every 100 ns for 64 calls, 1 in 16 timed (10 ns
    each) and read mid-way: all 64 calls count, its time is the timed calls'
    mean for each, and its span covers the untimed calls after the last
    timed one at the same rate."""
    step = _Owner("jit(step)")
    times = CallTimes("jitted function")
    starts = [i * 100 if i % 16 == 0 else 0 for i in range(64)]
    ends = [s + 10 if i % 16 == 0 else 0 for i, s in enumerate(starts)]
    for lo, hi in ((0, 20), (20, 30), (30, 64)):  # reads split the batches
        o, s, e = [step] * (hi - lo), starts[lo:hi], ends[lo:hi]
        t = sampling.timed(o, s, e, {step})
        if t.owners:
            times.fold(t.owners, t.starts, t.ends, t.durations, {step}, t.weights, t.trailing)
        times.fold_untimed(t.untimed_only)
    reading = times.steps(min_calls=10)
    assert reading is not None and reading.count == 64
    assert times.mean_ns(step) == 10
    # The last timed call (48) ends at 4810; 15 more at 100 ns each carry it on.
    assert reading.seconds_total == pytest.approx((4810 - 0) / 1e9 * 63 / 48)


def test_every_call_and_put_is_counted_though_one_in_16_is_timed(fresh_metrics):
    """101 calls of a jitted function and 101 puts (past the first 64, all
    timed, one in 16 is), read in between (which splits the journals into
    batches, some with no timed record): every one is counted, ExecuteTime
    and TransferToDeviceTime count them all, the bytes are exact, and every
    put has its event, in order, with a time."""
    import metrics

    rec = fresh_metrics
    f = jax.jit(lambda x: x * 2)
    x = jnp.ones(4)
    batch = np.ones((8, 8), np.float32)
    calls0 = metrics.counter_value("ExecuteComputation") or 0
    seq0 = rec.events.last_seq
    n = 101
    for i in range(n):
        f(x)
        jax.device_put(batch)
        if i in (3, 20, 70, 72, 90):
            metrics.metric_data("ExecuteTime")  # a read folds what waits
    assert (metrics.counter_value("ExecuteComputation") or 0) - calls0 == n
    assert metrics.metric_data("ExecuteTime")[0] == n
    assert metrics.metric_data("TransferToDeviceTime")[0] == n
    assert metrics.metric_data("OutboundData")[:2] == (n, n * batch.nbytes)
    moves, _ = rec.events.since(seq0)
    puts = [e for e in moves if e.kind == EventKind.TRANSFER_TO_DEVICE]
    assert len(puts) == n
    assert all(e.time_unix > 0 for e in puts)
    assert [e.time_unix for e in puts] == sorted(e.time_unix for e in puts)


def test_numpy_arguments_are_counted_on_every_call_once_a_function_takes_them(fresh_metrics):
    """The usual call checks one flag, not its arguments' types: a function
    that took only device arrays for 100 calls (past the first 64, timed and
    checked) and then numpy is flagged by the first numpy call (a C++ cache
    miss that runs the numpy shard handler under the wrapper), so every
    numpy call counts once, the untimed ones too; and the switch back to
    device arrays counts nothing."""
    rec = fresh_metrics
    f = jax.jit(lambda p, x: p + x)
    p = jnp.ones(16)
    for _ in range(100):
        f(p, jnp.ones(16))
    before = rec.registry.counter_value("ImplicitOutboundBytes") or 0
    host = np.ones(16, np.float32)
    for _ in range(21):
        f(p, host)
    for _ in range(5):
        f(p, jnp.ones(16))
    got = (rec.registry.counter_value("ImplicitOutboundBytes") or 0) - before
    assert got == 21 * host.nbytes
