"""The whole-run series behind the HTML report's step-time plot: bounded,
every bucket exactly the aggregate of its consecutive samples at any length
and any batching, spikes kept, fed by the fold and never by the hot path."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics.recording.recorder import Recorder
from metrics.recording.registry import Distribution
from metrics.recording.series import WholeRun
from tpu_info.contract.catalog import STEP_TIME
from tpu_info.contract.model import Unit
from tpu_info.contract.series import RUN_SERIES_BUCKETS


def _check(w: WholeRun, times: list[int], values: list[float]) -> None:
    """Every bucket is exactly its samples' aggregate; all samples covered."""
    assert len(w.counts) <= w.most and w.width & (w.width - 1) == 0
    at = 0
    for i, n in enumerate(w.counts):
        assert 1 <= n <= w.width and (n == w.width or i == len(w.counts) - 1)
        part = values[at:at + n]
        assert (w.first[i], w.last[i]) == (times[at], times[at + n - 1])
        assert (w.mins[i], w.maxs[i]) == (min(part), max(part))
        assert w.totals[i] == pytest.approx(sum(part))
        at += n
    assert at == len(values)
    if len(values) > w.most:  # as fine as the bound allows: more than half the buckets used
        assert len(w.counts) > w.most // 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=12), st.integers(1, 4),
       st.booleans(), st.booleans())
def test_every_bucket_is_its_samples_at_any_length_and_batching(batches, half, ints, with_np):
    """With numpy loaded (one reduceat pass over a batch of many buckets)
    or not (C's min, max, sum per bucket); float and integer samples."""
    w = WholeRun(most=2 * half * 4)
    rng = random.Random(len(batches))
    times: list[int] = []
    values: list[float] = []
    saved = sys.modules.get("numpy")
    assert saved is np  # loaded, as in a JAX program: the reduceat path is there to take
    sys.modules["numpy"] = saved if with_np else None  # type: ignore[assignment]
    try:
        for n in batches:
            t = [len(times) + k for k in range(n)]
            v = ([rng.randint(10**6, 10**8) for _ in range(n)] if ints
                 else [rng.uniform(1.0, 2.0) for _ in range(n)])
            stats = (sum(v), min(v), max(v)) if n % 2 else None  # the fold's, when it has them
            w.add(t, v, stats)
            times += t
            values += v
            _check(w, times, values)
    finally:
        sys.modules["numpy"] = saved  # type: ignore[assignment]


def test_a_long_run_stays_bounded_and_keeps_its_spikes():
    w = WholeRun()
    values = [10.0] * 1_000_000
    for at in (3, 500_000, 999_999):
        values[at] = 250.0  # three slow steps, one at each end
    for start in range(0, len(values), 4096):
        chunk = values[start:start + 4096]
        w.add(list(range(start, start + len(chunk))), chunk)
    assert len(w.counts) <= RUN_SERIES_BUCKETS and sum(w.counts) == 1_000_000
    assert w.width == 4096 and w.first[0] == 0 and w.last[-1] == 999_999
    assert sum(hi == 250.0 for hi in w.maxs) == 3  # each spike is its bucket's max
    assert min(w.mins) == 10.0


def test_the_reading_carries_the_series_on_the_unix_clock_and_a_reset_clears_it():
    d = Distribution(STEP_TIME, Unit.TIME_NS)
    d.keep_whole_run()
    d.observe_many([float(v) for v in range(1, 1001)], list(range(10**9, 10**9 + 1000)))
    r = d.reading(100.0)
    assert r.series is not None and r.series.count == r.count == 1000
    assert r.series.first_unix[0] == pytest.approx(101.0)
    assert r.series.maxs[-1] == 1000.0 and r.series.width == 4
    d.reset()
    d.observe(5.0)
    again = d.reading(100.0)
    assert again.series is not None and again.series.count == 1
    plain = Distribution("Other", Unit.TIME_NS)
    plain.observe(5.0)
    assert plain.reading(0.0).series is None  # only where asked


def test_marked_steps_feed_it_in_the_fold_not_on_the_hot_path():
    rec = Recorder()
    whole = rec._step_time._whole_run
    assert whole is not None
    for _ in range(300):
        rec.mark_step()
    assert whole.counts == []  # 300 marks wait in the journal: nothing done per mark
    rec.flush()
    assert sum(whole.counts) == 299  # a step time between each two marks
    (steps,) = [d for d in rec.registry.snapshot()[1] if d.name == STEP_TIME]
    assert steps.series is not None and steps.series.count == steps.count == 299
