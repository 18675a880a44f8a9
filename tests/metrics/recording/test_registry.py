from __future__ import annotations

import itertools
import math
import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics.recording.registry import Counter, Distribution, Registry
from tpu_info.contract.buckets import merge_buckets, percentile
from tpu_info.contract.model import PERCENTILES, Unit


def test_counter_exact_under_8_threads():
    c = Counter("x")
    n_threads, per_thread = 8, 100_000

    def work() -> None:
        for _ in range(per_thread):
            c.inc()

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value == n_threads * per_thread


def test_distribution_exact_count_and_sum_under_threads():
    d = Distribution("x")

    def work(k: int) -> None:
        for i in range(20_000):
            d.observe(float(k * 20_000 + i + 1))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r = d.reading(0.0)
    n = 8 * 20_000
    assert r.count == n
    assert r.total == n * (n + 1) / 2
    assert r.min == 1.0 and r.max == float(n)
    assert sum(r.buckets.positive.values()) == n


@pytest.mark.parametrize("name,samples", [
    ("lognormal", np.random.default_rng(1).lognormal(10, 2, 50_000)),
    ("uniform", np.random.default_rng(2).uniform(1, 1e6, 5_000)),
    ("bimodal", np.concatenate([np.full(900, 50.0), np.full(100, 5e6)])),
    ("two", np.array([10.0, 1000.0])),
    ("one", np.array([2.8e6])),
    ("signed", np.random.default_rng(3).normal(0, 100, 10_000)),
])
def test_percentiles_match_numpy_within_1_percent(name: str, samples: np.ndarray):
    d = Distribution(name)
    for x in samples:
        d.observe(float(x))
    r = d.reading(0.0)
    for p, v in r.percentiles:
        want = np.percentile(samples, p)
        assert abs(v - want) <= 0.01 * abs(want) + 1e-9, (p, v, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e12, allow_nan=False), min_size=1,
                max_size=300))
def test_percentiles_property(values: list[float]):
    d = Distribution("h")
    for v in values:
        d.observe(v)
    r = d.reading(0.0)
    for p, v in r.percentiles:
        want = float(np.percentile(values, p))
        assert abs(v - want) <= 0.01 * want, (p, v, want)


def test_merge_adds_counts_and_keeps_accuracy():
    rng = np.random.default_rng(4)
    parts = [rng.lognormal(8, 1, 3_000) for _ in range(3)]
    dists = []
    for xs in parts:
        d = Distribution("m")
        for x in xs:
            d.observe(float(x))
        dists.append(d.reading(0.0))
    merged = merge_buckets(r.buckets for r in dists)
    allv = np.concatenate(parts)
    assert sum(merged.positive.values()) == len(allv)
    for p in PERCENTILES:
        want = np.percentile(allv, p)
        got = percentile(merged, len(allv), p)
        assert abs(got - want) <= 0.01 * want


def test_memory_is_bounded_by_value_range():
    d = Distribution("b", Unit.TIME_NS)
    for i in range(200_000):
        d.observe(1 + (i * 7919) % 3_600_000_000_000)  # 1 ns .. 1 h
    assert len(d.reading(0.0).buckets.positive) < 3_000


def test_rates_and_recent_samples():
    ticks = iter(range(0, 10**12, 10**9))  # one second per sample
    d = Distribution("r", clock=lambda: next(ticks))
    for v in (1.0, 2.0, 3.0):
        d.observe(v)
    r = d.reading(1000.0)
    assert r.rate_per_second == pytest.approx(1.5)  # 3 samples over 2 s
    assert r.value_rate_per_second == pytest.approx(3.0)
    assert [v for _, v in r.recent] == [1.0, 2.0, 3.0]
    assert r.recent[0][0] == pytest.approx(1000.0)


def test_recent_ring_keeps_last_64_in_order():
    d = Distribution("r")
    for v in range(100):
        d.observe(float(v))
    assert [v for _, v in d.reading(0.0).recent] == [float(v) for v in range(36, 100)]


def test_recent_samples_between_readings_match_a_fresh_reading():
    # Readings reuse the previous reading's converted samples; whatever the
    # number of samples between readings, the result equals a full conversion.
    rng = random.Random(5)
    ticks = itertools.count(0, 10**6)
    d = Distribution("r", clock=lambda: next(ticks))
    for _ in range(60):
        for _ in range(rng.choice([0, 1, 2, 5, 63, 64, 65, 200])):
            d.observe(rng.random())
        r = d.reading(7.0)
        with d._lock:
            expected = tuple((t / 1e9 + 7.0, v) for t, v in d._recent)
        assert r.recent == expected


def test_torch_xla_call_shapes():
    reg = Registry()
    assert reg.counter_names() == [] and reg.metric_names() == []
    assert reg.metric_data("CompileTime") is None
    assert reg.counter_value("MarkStep") is None
    reg.counter("MarkStep")  # created but never incremented: not listed yet
    assert reg.counter_names() == []
    reg.counter("MarkStep").inc(3)
    reg.distribution("CompileTime", Unit.TIME_NS).observe(5.0)
    assert reg.counter_names() == ["MarkStep"]
    assert reg.counter_value("MarkStep") == 3
    assert reg.metric_names() == ["CompileTime"]
    total, acc, samples = reg.metric_data("CompileTime")
    assert (total, acc, len(samples)) == (1, 5.0, 1)
    reg.clear_counters()
    assert reg.counter_names() == [] and reg.metric_names() == ["CompileTime"]
    reg.clear_all()
    assert reg.metric_names() == [] and reg.metric_data("CompileTime") is None


def test_snapshot_is_a_copy():
    reg = Registry()
    reg.counter("A").inc()
    counters, _ = reg.snapshot()
    reg.counter("A").inc()
    assert counters[0].value == 1


def test_observe_many_equals_one_at_a_time():
    rng = random.Random(3)
    one, many = Distribution("a"), Distribution("b")
    for _ in range(30):
        n = rng.choice([1, 5, 300, 2000])
        values = [rng.lognormvariate(5, 2) * rng.choice([1, -1, 0]) for _ in range(n)]
        times = [rng.randrange(10**12) for _ in range(n)]
        many.observe(1.5)
        one.observe_at(1.5, 0)
        many.observe_many(values, times)
        for v, t in zip(values, times):
            one.observe_at(v, t)
    a, b = one.reading(0.0), many.reading(0.0)
    assert (a.count, a.min, a.max, a.percentiles) == (b.count, b.min, b.max, b.percentiles)
    assert a.total == pytest.approx(b.total)
    assert [v for _, v in a.recent] == [v for _, v in b.recent]


@pytest.mark.parametrize("numpy_path", [False, True])
def test_extreme_and_infinite_values_stay_bounded_and_never_raise(numpy_path):
    d = Distribution("x")
    values = [1e-300, 1e300, math.inf, -math.inf, -1e-300, 5.0] * (60 if numpy_path else 1)
    if numpy_path:
        d.observe_many(values, list(range(len(values))))  # >= 256 at once: numpy folds
    else:
        for v in values:
            d.observe(v)
    r = d.reading(0.0)
    assert r.count == len(values) and r.max == math.inf and r.min == -math.inf
    from metrics.recording.dense import MAX_SPAN
    assert len(r.buckets.positive) <= MAX_SPAN + 1 and len(r.buckets.negative) <= MAX_SPAN + 1
    assert sum(r.buckets.positive.values()) + sum(r.buckets.negative.values()) == r.count
    median = r.percentile(50.0)
    assert median is not None and -math.inf <= median <= math.inf


def test_dense_buckets_read_like_the_samples_from_either_side():
    # Keys added below and above the first ones (the counts grow both ways).
    rng = random.Random(9)
    d = Distribution("g")
    values = []
    for scale in (1e3, 1e-3, 1e9, 1.0, -1e4, -1e-2):
        batch = [scale * rng.lognormvariate(0, 1) for _ in range(400)]
        values += batch
        for v in batch:
            d.observe(v)
        r = d.reading(0.0)
        for p, v in r.percentiles:
            exact = float(np.percentile(values, p))
            assert v == pytest.approx(exact, rel=0.01, abs=1e-12), (p, v, exact)


def test_counter_readings_are_reused_until_the_value_moves():
    reg = Registry()
    c = reg.counter("MarkStep")
    c.inc()
    a = reg.snapshot()[0][0]
    assert reg.snapshot()[0][0] is a
    c.inc(2)
    assert reg.snapshot()[0][0].value == 3
    reg.clear_counters()
    assert reg.snapshot()[0] == ()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e12, 1e12, allow_nan=False), st.just(0.0)),
                min_size=1, max_size=400))
def test_numpy_percentiles_are_the_python_ones(values: list[float]):
    """Readings of many buckets take their percentiles from numpy over the
    dense counts; they must be the very floats the list pass gives."""
    from metrics.recording.dense import percentiles_numpy
    from tpu_info.contract.buckets import sorted_percentiles

    d = Distribution("x")
    for v in values:
        d.observe(v)
    d._fold()
    pos, neg = d._pos.filled(), d._neg.filled(descending=True)
    expected = sorted_percentiles(d.gamma, neg[0], neg[1], d._zero, pos[0], pos[1],
                                  d._count, PERCENTILES, d._min, d._max)
    got = percentiles_numpy(np, d.gamma, d._neg, d._zero, d._pos, d._count, PERCENTILES,
                            d._min, d._max)
    assert got == expected


def test_readings_reuse_what_did_not_move():
    """A reading after one more sample reuses the percentile pairs whose value
    stayed (fewer new objects per scrape), and its values are a fresh
    reading's."""
    import random

    rng = random.Random(5)
    d = Distribution("x")
    for _ in range(2000):
        d.observe(rng.lognormvariate(13, 1.5))
    before = d.reading(0.0)
    d.observe(rng.lognormvariate(13, 1.5))
    after = d.reading(0.0)
    reused = [a is b for a, b in zip(before.percentiles, after.percentiles)]
    assert any(reused)
    assert before.buckets.negative is after.buckets.negative  # the shared empty side
    assert len(after.buckets.negative) == 0
    d2 = Distribution("z")
    rng = random.Random(5)
    for _ in range(2001):
        d2.observe(rng.lognormvariate(13, 1.5))
    assert d2.reading(0.0).percentiles == after.percentiles


@pytest.mark.parametrize("with_numpy", [False, True])
def test_filled_buckets_are_the_same_with_or_without_numpy(with_numpy):
    """DenseCounts.filled copies the filled buckets with numpy when the
    program has it loaded, else in pure Python: the same keys and counts,
    in value order on either side."""
    from metrics.recording.dense import DenseCounts
    from tpu_info.contract.buckets import StableKeys

    rng = random.Random(4)
    keys = [rng.randint(-300, 300) for _ in range(2000)]
    dense = DenseCounts()
    dense.add_keys(keys)
    expected = sorted({k: keys.count(k) for k in keys}.items())
    for descending in (False, True):
        got_keys, got_counts = dense.filled(np if with_numpy else None, descending=descending)
        assert type(got_keys) is StableKeys
        want = expected[::-1] if descending else expected
        assert list(zip(got_keys, got_counts, strict=True)) == want
        dense._keys.forget()  # as after a new bucket: keys are made again


def test_a_reading_leaves_the_garbage_collector_little_to_walk():
    """A reading's bucket counts and recent samples are machine arrays, so the
    young objects a scrape makes hold a few dozen references, not one per
    bucket and sample: with lists and pair tuples a reading of 500 buckets
    and 64 samples made ~1,200, and young collections that landed in a scrape
    cost milliseconds."""
    import gc

    rng = random.Random(8)
    d = Distribution("x")
    for _ in range(20_000):
        d.observe(rng.lognormvariate(13, 1.5))
    d.reading(0.0)
    d.observe(1e6)  # a reading is made anew only when something changed
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects(0)}
        r = d.reading(0.0)
        made = [o for o in gc.get_objects(0) if id(o) not in before]
        walked = sum(len(gc.get_referents(o)) for o in made)
    finally:
        gc.enable()
    assert len(r.buckets.positive) > 400 and len(r.recent) == 64
    assert walked < 150, f"a reading holds {walked} references for the collector to walk"


@pytest.mark.parametrize("value", [4, 4.0, 0, 0.0, -3, 1e308, math.inf, -math.inf, 7.3e-9,
                                   2**60, 1.0000001, -2.5e-300])
@pytest.mark.parametrize("n", [2, 255, 256, 4096])
def test_a_repeated_value_folds_exactly_as_the_general_fold(value, n):
    """A batch of one value (4 bytes per float(loss)) takes an O(1) fold;
    the distribution must hold exactly what the general fold leaves."""

    def state(d):  # type: ignore[no-untyped-def]
        return (d._count, d._sum, d._min, type(d._min), d._max, type(d._max), d._zero,
                list(d._pos.counts), d._pos.offset, d._pos.nonzero, list(d._neg.counts),
                d._neg.offset, d._neg.nonzero, list(d._recent), d._first_ns, d._last_ns)

    fast, general = Distribution("a"), Distribution("b")
    for d in (fast, general):
        d.observe_many([3, 9], [1, 2])
    times = list(range(10, 10 + n))
    fast.observe_many([value] * n, times)
    general.observe_many(tuple([value] * n), times)  # not a list: the general fold
    assert state(fast) == state(general)


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN reads as NaN


_BATCH_KINDS = {
    "durations": lambda rng: [rng.randrange(1, 10**9) for _ in range(4096)],
    "signed ints": lambda rng: [rng.randrange(-10**6, 10**6) for _ in range(3000)],
    "floats": lambda rng: [rng.lognormvariate(3, 4) * rng.choice([1, -1]) for _ in range(2000)],
    "whole floats": lambda rng: [float(rng.randrange(1, 10**6)) for _ in range(500)],
    "ints then a float": lambda rng: [rng.randrange(1, 10**6) for _ in range(300)] + [2.5],
    "ints past 2**53": lambda rng: [2**53 + rng.randrange(10) for _ in range(300)],
    "ints past int64": lambda rng: [2**70] + [rng.randrange(9) for _ in range(299)],
    "signed zeros": lambda rng: [-0.0] * 300,
    "zero sum": lambda rng: [5, -5] * 150,
    # (Not NaN: there min and max already differ between the two folds.)
    "infinities": lambda rng: [math.inf, -math.inf, 0.0, 1.0, -3] * 60,
    "bools and numpy ints": lambda rng: [True, 2, 3] * 100 + [np.int64(7)] * 10,
    "a tuple": lambda rng: tuple(rng.randrange(1, 10**9) for _ in range(1000)),
}


@pytest.mark.parametrize("kind", sorted(_BATCH_KINDS))
def test_the_numpy_batch_fold_reads_as_the_per_sample_fold(kind):
    """One batch of 256 or more folds through numpy (fromiter or an int64
    array, the int64 sum standing in for fsum); the same samples in batches
    under 256 take the pure-Python per-sample fold. Buckets, percentiles,
    count, min and max must be identical, and the sum is fsum's float."""
    values = _BATCH_KINDS[kind](random.Random(len(kind)))
    batch, singles = Distribution("a"), Distribution("b")
    batch.observe_many(values, list(range(len(values))))
    for start in range(0, len(values), 200):
        chunk = list(values[start:start + 200])
        singles.observe_many(chunk, list(range(start, start + len(chunk))))
    a, b = batch.reading(0.0), singles.reading(0.0)
    assert a.buckets == b.buckets and a.count == b.count == len(values)
    assert _same(a.min, float(b.min)) and _same(a.max, float(b.max))  # numpy's are floats
    assert all(p == q and _same(x, y) for (p, x), (q, y) in zip(a.percentiles, b.percentiles))
    try:
        expected = math.fsum(values)
    except (ValueError, OverflowError):
        expected = float(sum(values))
    assert repr(a.total) == repr(float(expected))  # -0.0 stays -0.0


def test_a_nan_in_a_numpy_batch_still_puts_infinities_in_the_edge_buckets():
    values = [math.nan, -math.inf, math.inf, 2.0] * 100
    batch, singles = Distribution("a"), Distribution("b")
    batch.observe_many(values, list(range(len(values))))
    for start in range(0, len(values), 200):
        singles.observe_many(values[start:start + 200], list(range(200)))

    def counts(d):  # type: ignore[no-untyped-def]
        return [list(map(list, side.filled())) for side in (d._pos, d._neg)], d._zero

    assert counts(batch) == counts(singles)
