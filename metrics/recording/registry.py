"""Counters and distributions, thread-safe, with O(1) recording.

Recording appends numbers under a short lock; percentiles, rates and copies
happen in :meth:`Registry.snapshot`, called at scrape time.

A :class:`Distribution` keeps, since its last clear:

* exact count, sum, min, max;
* log-spaced bucket counts with relative accuracy ``alpha`` (0.5 % by
  default): every percentile is within ``alpha`` of numpy's linear-interpolated
  percentile over *all* samples since the clear, the buckets merge across
  processes by adding counts, and memory stays bounded: dense counts over
  the range of keys seen, about ``ln(max/min) / ln(gamma)`` buckets (under
  3,000 for 1 ns .. 1 h), at most :data:`metrics.recording.dense.MAX_SPAN` per sign (a value
  ratio of about 10**35 either side of the first sample; values beyond, and infinite
  ones, count in the edge bucket);
* the time of the first and last sample (for the rates);
* the last :data:`RECENT` samples with their times (torch_xla's
  ``metric_data`` third element);
* where asked (:meth:`Distribution.keep_whole_run`: ``StepTime``'s), the
  whole run in a bounded number of buckets of consecutive samples
  (:mod:`metrics.recording.series`), for a plot of the whole run.

Recording does no arithmetic: samples wait in a journal (at most
:data:`metrics.recording.journal.SAMPLES_FOLD_AT`) and are folded into the aggregates
in batches, as :mod:`metrics.recording.journal` says for everything deferred.

Example:
    >>> reg = Registry()
    >>> reg.counter("MarkStep").inc()
    >>> reg.distribution("CompileTime", Unit.TIME_NS).observe(2_800_000)
    >>> reg.snapshot()[0][0].value
    1
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from metrics.recording.dense import (
    DenseCounts,
    fold_numpy,
    fold_python,
    fold_repeated,
    fold_weighted,
    percentiles_numpy,
)
from metrics.recording.journal import SAMPLES_FOLD_AT, Journal
from metrics.recording.series import WholeRun
from tpu_info.contract.buckets import SortedCounts, sorted_percentiles
from tpu_info.contract.model import (
    PERCENTILES,
    BucketCounts,
    CounterReading,
    DistributionReading,
    Samples,
    Unit,
)
from tpu_info.contract.reuse import Kept

RECENT = 64
DEFAULT_ALPHA = 0.005
# Filled buckets from which a reading's percentiles come from numpy (when the
# program has it loaded): fewer, and the pure-Python pass is as fast.
_NUMPY_PERCENTILES_AT = 64


class Counter:
    """A monotonic integer counter.

    ``inc()`` by one is a single C-level ``next()`` on an ``itertools.count``
    (atomic under the GIL, no lock); other amounts take a short lock.
    """

    __slots__ = ("name", "unit", "help", "_ones", "_extra", "_lock", "_reading")

    def __init__(self, name: str, unit: Unit = Unit.NUMBER, help: str = "") -> None:
        self.name = name
        self.unit = unit
        self.help = help
        self._ones = itertools.count()
        self._extra = 0
        self._lock = threading.Lock()
        self._reading: Kept[CounterReading] = Kept()  # by value (tpu_info.contract.reuse)

    def inc(self, amount: int = 1) -> None:
        """Adds ``amount`` (default 1)."""
        if amount == 1:
            next(self._ones)
        else:
            with self._lock:
                self._extra += amount

    @property
    def value(self) -> int:
        # repr(itertools.count(n)) is "count(n)": the one way to read it
        # without advancing it.
        return int(repr(self._ones)[6:-1]) + self._extra

    def reading(self) -> CounterReading:
        """The value now, as a reading (the previous one while unchanged)."""
        value = self.value
        last = self._reading.at(value)
        if last is None:
            last = self._reading.put(value, CounterReading(self.name, value, self.unit, self.help))
        return last

    def reset(self) -> None:
        with self._lock:
            self._ones = itertools.count()
            self._extra = 0


class Distribution:
    """Samples of one quantity (time in ns, bytes or a plain number).

    ``observe`` appends ``(time, value)`` to the distribution's journal
    (atomic under the GIL, no lock); the samples are folded into count,
    sum, min, max and buckets in batches, by the policy of
    :mod:`metrics.recording.journal`: by whichever thread finds
    :data:`~metrics.recording.journal.SAMPLES_FOLD_AT` of them waiting, and by every
    reading. So recording is O(1) amortized and memory stays bounded.
    """

    __slots__ = (
        "name", "unit", "help", "gamma", "_inv_log_gamma", "_lock", "_samples", "_queue",
        "_count", "_sum", "_min", "_max", "_pos", "_neg", "_zero",
        "_first_ns", "_last_ns", "_recent", "_clock", "_kept", "_whole_run",
    )

    def __init__(
        self,
        name: str,
        unit: Unit = Unit.NUMBER,
        help: str = "",
        alpha: float = DEFAULT_ALPHA,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.name = name
        self.unit = unit
        self.help = help
        self.gamma = (1 + alpha) / (1 - alpha)
        self._inv_log_gamma = 1.0 / math.log(self.gamma)
        self._lock = threading.Lock()
        self._clock = clock
        self._samples = Journal(self._fold_samples, SAMPLES_FOLD_AT, lock=self._lock)
        self._queue = self._samples.queue  # (clock_ns, value) pairs
        self._whole_run: WholeRun | None = None
        self._reset()

    def keep_whole_run(self) -> None:
        """Keeps the whole run in bounded buckets from now on (the readings'
        ``series``; folded with the samples, never on the hot path)."""
        with self._lock:
            if self._whole_run is None:
                self._whole_run = WholeRun()

    def _reset(self) -> None:
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
        # Dense counts per sign (of |v| for negative samples): metrics.recording.dense.
        self._pos = DenseCounts()
        self._neg = DenseCounts()
        self._zero = 0
        self._first_ns = 0
        self._last_ns = 0
        self._recent: deque[tuple[int, float]] = deque(maxlen=RECENT)
        if self._whole_run is not None:
            self._whole_run.clear()
        # The last reading, by (count, clock offset): tpu_info.contract.reuse's rule.
        self._kept: Kept[DistributionReading] = Kept()

    def observe(self, value: float) -> None:
        """Records one sample: one clock read and one list append."""
        q = self._queue
        q.append((self._clock(), value))
        if len(q) >= SAMPLES_FOLD_AT:
            self._samples.flush()

    def observe_at(self, value: float, clock_ns: int) -> None:
        """Records one sample taken at ``clock_ns`` (``time.monotonic_ns``, the
        distributions' clock): how journals fold samples recorded earlier."""
        q = self._queue
        q.append((clock_ns, value))
        if len(q) >= SAMPLES_FOLD_AT:
            self._samples.flush()

    def observe_many(self, values: Sequence[float], clock_ns: Sequence[int]) -> None:
        """Records samples taken at the matching ``clock_ns`` (how journals
        fold): the batch goes straight into the aggregates, after any
        single samples still waiting."""
        if not values:
            return
        with self._lock:
            self._samples.flush_held()
            self._add(clock_ns, values, None)

    def observe_weighted(self, values: Sequence[float], weights: Sequence[int],
                         clock_ns: Sequence[int]) -> None:
        """Records samples of which ``values[i]`` stands for ``weights[i]``
        (how sampled timings fold: a timed call stands for itself and the
        calls counted untimed beside it, :mod:`metrics.recording.sampling`):
        the count and sum are the weighted ones, and the percentiles those of
        each value repeated by its weight; min, max and the recent samples are
        the values themselves."""
        if not values:
            return
        with self._lock:
            self._samples.flush_held()
            self._add(clock_ns, values, None, weights)

    def _fold(self) -> None:
        """Moves waiting samples into the aggregates (under the lock)."""
        if self._queue:  # the common case at scrape time: nothing to take
            self._samples.flush()

    def _fold_samples(self, batch: list[tuple[int, float]]) -> None:
        # The journal's fold: the caller holds the lock.
        self._add([t for t, _ in batch], [v for _, v in batch], batch)

    def _add(self, times: Sequence[int], values: Sequence[float],
             pairs: list[tuple[int, float]] | None,
             weights: Sequence[int] | None = None) -> None:
        # Caller holds the lock; ``pairs`` is zip(times, values) if at hand;
        # ``weights``: what each value stands for (observe_weighted).
        n = len(values)
        np = sys.modules.get("numpy")  # used only if the program loaded it
        if weights is not None:  # a few hundred timed samples at most: a loop
            total, lo, hi, zero = fold_weighted(values, weights, self._inv_log_gamma, self._pos,
                                                self._neg)
            n = sum(weights)
        elif n > 1 and type(values) is list and _repeated(values, n):
            # One value repeated (4 bytes per float(loss)); min and max as
            # the fold it stands in for gives them (numpy's are floats).
            total, lo, hi, zero = fold_repeated(values[0], n, np is not None and n >= 256,
                                                self._inv_log_gamma, self._pos, self._neg)
        elif np is not None and n >= 256:
            total, lo, hi, zero = fold_numpy(np, values, self._inv_log_gamma, self._pos, self._neg)
        else:
            total, lo, hi, zero = fold_python(values, self._inv_log_gamma, self._pos, self._neg)
        if self._count == 0:
            self._first_ns = times[0]
        self._last_ns = times[-1]
        self._count += n
        self._sum += total
        self._zero += zero
        if lo < self._min:
            self._min = lo
        if hi > self._max:
            self._max = hi
        if pairs is not None:
            self._recent.extend(pairs[-RECENT:])
        else:
            self._recent.extend(zip(times[-RECENT:], values[-RECENT:], strict=False))
        if self._whole_run is not None and weights is None:
            self._whole_run.add(times, values, (total, lo, hi))

    @property
    def count(self) -> int:
        return self._count + len(self._queue)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._reset()

    def _recent_unix(self, count: int, recent: list[tuple[int, float]],
                     mono_to_unix: float) -> Samples:
        """``recent`` on the unix clock, reusing the previous reading's
        samples that are still recent: a scrape converts only the new ones."""
        previous = self._kept.peek()
        if (previous is not None and self._kept.version == (previous.count, mono_to_unix)
                and type(previous.recent) is Samples):
            new = count - previous.count
            kept = len(recent) - new  # the newest ``kept`` of the previous samples stay
            if new >= 0 and 0 <= kept <= len(previous.recent):
                start = len(previous.recent) - kept
                times = previous.recent.times[start:]
                values = previous.recent.values[start:]
                times.extend([t / 1e9 + mono_to_unix for t, _ in recent[kept:]])
                values.extend([v for _, v in recent[kept:]])
                return Samples(times, values)
        return Samples([t / 1e9 + mono_to_unix for t, _ in recent], [v for _, v in recent])

    def reading(self, mono_to_unix: float) -> DistributionReading:
        """A consistent copy with percentiles and rates computed now (or the
        previous reading when nothing was recorded since: scrapes of many
        idle distributions stay cheap)."""
        kept = self._kept  # read in place: this runs for every distribution of a scrape
        version = (self._count, mono_to_unix)
        if not self._queue and kept.version == version:
            return kept.value  # type: ignore[return-value]  # nothing recorded since
        self._fold()
        version = (self._count, mono_to_unix)
        if kept.version == version:
            return kept.value  # type: ignore[return-value]
        cached = kept.value
        with self._lock:
            count, total = self._count, self._sum
            lo, hi = self._min, self._max
            zero = self._zero
            first, last = self._first_ns, self._last_ns
            recent = list(self._recent)
            whole = self._whole_run
            series = (whole.reading(mono_to_unix) if whole is not None and whole.counts
                      else None)
            # Dense counts are contiguous: copying out the filled ones is one
            # pass in C, not a lookup per bucket.
            np = sys.modules.get("numpy")  # used only if the program loaded it
            pos = SortedCounts(*self._pos.filled(np)) if self._pos.nonzero else _NO_COUNTS
            neg = (SortedCounts(*self._neg.filled(np, descending=True)) if self._neg.nonzero
                   else _NO_COUNTS)
            values = None
            if count and np is not None and len(pos) + len(neg) >= _NUMPY_PERCENTILES_AT:
                values = percentiles_numpy(np, self.gamma, self._neg, zero, self._pos,
                                           count, PERCENTILES, lo, hi)
        if count == 0:
            return kept.put((0, mono_to_unix), DistributionReading(
                name=self.name, unit=self.unit, count=0, total=0.0,
                min=None, max=None, help=self.help,
            ))
        buckets = BucketCounts(gamma=self.gamma, positive=pos, negative=neg, zero=zero)
        if values is None:
            values = sorted_percentiles(
                self.gamma, neg.key_list, neg.count_list, zero, pos.key_list,
                pos.count_list, count, PERCENTILES, lo, hi)
        pct = _pairs(PERCENTILES, values, cached.percentiles if cached is not None else ())
        rate = value_rate = None
        span_s = (last - first) / 1e9
        if count > 1 and span_s > 0:
            rate = count / span_s
            value_rate = total / span_s
        reading = DistributionReading(
            name=self.name, unit=self.unit, count=count, total=total,
            min=lo, max=hi, rate_per_second=rate, value_rate_per_second=value_rate,
            percentiles=pct,
            recent=self._recent_unix(count, recent, mono_to_unix),
            buckets=buckets, help=self.help, series=series,
        )
        return kept.put((count, mono_to_unix), reading)


# The bucket counts of a side with no samples (most distributions have no
# negative ones): one shared object instead of two new ones per reading.
_NO_COUNTS = SortedCounts((), ())


def _pairs(percents: Sequence[float], values: Sequence[float],
           previous: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """(percent, value) pairs, reusing the previous reading's pair wherever
    the value is the same (about half of them: neighbouring ranks often fall
    in one bucket). Fewer new objects per scrape means shorter pauses when
    the garbage collector runs inside one."""
    if len(previous) != len(values):
        return tuple(zip(percents, values))
    return tuple(old if old[1] == v else (p, v)
                 for p, v, old in zip(percents, values, previous))


def _repeated(values: list[float], n: int) -> bool:
    """Whether ``values`` is one value ``n`` times (``list.count``'s identity-
    or-equal test); the last item rules out most batches without a pass."""
    first, last = values[0], values[-1]
    return (last is first or last == first) and values.count(first) == n


def _nothing() -> None:
    pass


def _name_of(item: Counter | Distribution) -> str:
    return item.name


class Registry:
    """Named counters and distributions. Get-or-create is thread-safe.

    Counters and distributions are listed by :meth:`counter_names` and
    :meth:`metric_names` only once they hold something, as torch_xla does.
    """

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, Counter] = {}
        self._distributions: dict[str, Distribution] = {}
        # Sorted by name, by how many there are: names are only ever added
        # (clears keep them), so the same number is the same list.
        self._sorted_counters: Kept[list[Counter]] = Kept()
        self._sorted_dists: Kept[list[Distribution]] = Kept()
        self._clock = clock
        # ``clock`` -> unix seconds, fixed once, so unchanged readings can be
        # reused across snapshots; the recorder dates its events with it too.
        self.mono_to_unix = time.time() - clock() / 1e9
        # Called before every read: folds hot-path journals in (the recorder's).
        self.before_read: Callable[[], None] = _nothing

    def counter(self, name: str, unit: Unit = Unit.NUMBER, help: str = "") -> Counter:
        """The counter called ``name``, created on first use."""
        c = self._counters.get(name)
        if c is None:
            with self._lock:
                c = self._counters.get(name)
                if c is None:
                    c = self._counters[name] = Counter(name, unit, help)
        return c

    def distribution(
        self, name: str, unit: Unit = Unit.NUMBER, help: str = ""
    ) -> Distribution:
        """The distribution called ``name``, created on first use."""
        d = self._distributions.get(name)
        if d is None:
            with self._lock:
                d = self._distributions.get(name)
                if d is None:
                    d = self._distributions[name] = Distribution(
                        name, unit, help, clock=self._clock
                    )
        return d

    def existing_distribution(self, name: str) -> Distribution | None:
        """The distribution called ``name`` if one was made, else None."""
        return self._distributions.get(name)

    # torch_xla.debug.metrics call shapes -----------------------------------

    def counter_names(self) -> list[str]:
        self.before_read()
        with self._lock:
            items = list(self._counters.values())
        return [c.name for c in items if c.value]

    def counter_value(self, name: str) -> int | None:
        self.before_read()
        c = self._counters.get(name)
        return c.value if c is not None and c.value else None

    def metric_names(self) -> list[str]:
        self.before_read()
        with self._lock:
            items = list(self._distributions.values())
        return [d.name for d in items if d.count]

    def metric_data(self, name: str) -> tuple[int, float, tuple[tuple[float, float], ...]] | None:
        """``(total_samples, accumulator, ((unix_time, value), ...))`` or None."""
        self.before_read()
        d = self._distributions.get(name)
        if d is None or not d.count:
            return None
        r = d.reading(self._mono_to_unix())
        return (r.count, r.total, tuple(r.recent))

    def clear_counters(self) -> None:
        self.before_read()  # what was recorded before the clear is cleared too
        with self._lock:
            items = list(self._counters.values())
        for c in items:
            c.reset()

    def clear_metrics(self) -> None:
        self.before_read()
        with self._lock:
            items = list(self._distributions.values())
        for d in items:
            d.reset()

    def clear_all(self) -> None:
        self.clear_counters()
        self.clear_metrics()

    # Scrape time -----------------------------------------------------------

    def _mono_to_unix(self) -> float:
        return self.mono_to_unix

    def snapshot(self) -> tuple[tuple[CounterReading, ...], tuple[DistributionReading, ...]]:
        """Consistent copies of every non-empty counter and distribution."""
        self.before_read()
        with self._lock:
            counters = self._sorted_counters.get(
                len(self._counters), lambda: sorted(self._counters.values(), key=_name_of))
            dists = self._sorted_dists.get(
                len(self._distributions),
                lambda: sorted(self._distributions.values(), key=_name_of))
        offset = self._mono_to_unix()
        return (
            tuple(r for r in map(Counter.reading, counters) if r.value),
            tuple(d.reading(offset) for d in dists if d.count),
        )
