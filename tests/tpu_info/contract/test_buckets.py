"""Bucket percentile math in tpu_info.contract.buckets (shared with metrics.recording.registry)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_info.contract.buckets import merge_buckets, percentile, percentiles
from tpu_info.contract.model import BucketCounts

GAMMA = 1.02


def _buckets(samples: list[float]) -> BucketCounts:
    pos: dict[int, int] = {}
    neg: dict[int, int] = {}
    zero = 0
    for v in samples:
        if v == 0:
            zero += 1
            continue
        k = math.ceil(math.log(abs(v)) / math.log(GAMMA) - 1e-12)
        side = pos if v > 0 else neg
        side[k] = side.get(k, 0) + 1
    return BucketCounts(gamma=GAMMA, positive=pos, negative=neg, zero=zero)


def _exact(samples: list[float], percent: float) -> float:
    xs = sorted(samples)
    h = (len(xs) - 1) * percent / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e9), min_size=1, max_size=300),
       st.sampled_from([50.0, 90.0, 95.0, 99.0, 99.9]))
def test_within_relative_error(samples: list[float], percent: float):
    b = _buckets(samples)
    got = percentile(b, len(samples), percent, min(samples), max(samples))
    want = _exact(samples, percent)
    bound = (GAMMA - 1) / (GAMMA + 1) + 1e-9
    assert abs(got - want) <= bound * want * 1.0001


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1,
                max_size=100), st.floats(min_value=0, max_value=100))
def test_many_at_once_equal_one_at_a_time(samples: list[float], percent: float):
    b = _buckets(samples)
    wanted = (0.0, percent, 50.0, 100.0)
    assert percentiles(b, len(samples), wanted) == [
        percentile(b, len(samples), p) for p in wanted]


def test_p999_sees_the_tail():
    samples = [100.0] * 999 + [10_000.0]
    b = _buckets(samples)
    assert percentile(b, 1000, 99.0, 100.0, 10_000.0) == pytest.approx(100.0, rel=0.01)
    p999 = percentile(b, 1000, 99.9, 100.0, 10_000.0)
    assert 100.0 < p999 <= 10_000.0


def test_merge_adds_counts_in_value_order_and_errors():
    b = _buckets([-5.0, -0.5, 0.0, 0.0, 3.0])
    m = merge_buckets([b, b])
    assert m is not None and m.zero == 4
    assert dict(m.positive) == {k: 2 * n for k, n in b.positive.items()}
    assert dict(m.negative) == {k: 2 * n for k, n in b.negative.items()}
    assert list(m.positive) == sorted(m.positive)
    assert list(m.negative) == sorted(m.negative, reverse=True)
    assert percentiles(m, 10, (0.0, 100.0)) == percentiles(b, 5, (0.0, 100.0))
    assert merge_buckets([]) is None
    with pytest.raises(ValueError):
        merge_buckets([b, BucketCounts(gamma=1.1, positive={})])
    with pytest.raises(ValueError):
        percentile(b, 0, 50.0)
    with pytest.raises(ValueError):
        percentile(b, 4, 101.0)
    with pytest.raises(ValueError):
        percentile(BucketCounts(gamma=GAMMA, positive={}), 1, 50.0)
