"""A whole run's samples in a bounded number of buckets (the step-time plot's).

A distribution's ring of recent samples forgets all but the last 64; a plot
of the whole run needs every stretch of it, in bounded memory. A
:class:`WholeRun` keeps at most ``most`` buckets of consecutive samples,
each its count, sum, min, max and the clock times of its first and last
sample. Bucket ``i`` holds samples ``i * width`` to ``(i + 1) * width - 1``;
when the buckets are full, neighbours merge pairwise (``most / 2`` of them,
once per doubling of the run) and ``width`` doubles. So the series covers
the whole run at any length, a spike survives as its bucket's max, and the
cost per sample is O(1) amortized: batches are folded (never on the hot
path: :mod:`metrics.recording.journal`), a batch costs one pass of C's
``min``, ``max`` and ``sum`` over its slice per bucket it touches, and a
merge touches each bucket once per doubling of the run.

Example:
    >>> w = WholeRun(most=4)
    >>> w.add(list(range(10)), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 90.0, 10.0])
    >>> w.width, w.counts, w.maxs
    (4, [4, 4, 2], [4.0, 8.0, 90.0])
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from metrics.recording.dense import float_array
from tpu_info.contract.series import RUN_SERIES_BUCKETS, RunSeries


class WholeRun:
    """The bounded whole-run series of one distribution. Not locked: its
    distribution's lock is held around every call."""

    __slots__ = ("most", "width", "first", "last", "counts", "totals", "mins", "maxs")

    def __init__(self, most: int = RUN_SERIES_BUCKETS) -> None:
        if most < 2 or most % 2:
            raise ValueError(f"most must be even and at least 2, got {most}")
        self.most = most
        self.clear()

    def clear(self) -> None:
        self.width = 1
        self.first: list[int] = []
        self.last: list[int] = []
        self.counts: list[int] = []
        self.totals: list[float] = []
        self.mins: list[float] = []
        self.maxs: list[float] = []

    def add(self, times: Sequence[int], values: Sequence[float],
            stats: tuple[float, float, float] | None = None) -> None:
        """Appends samples ``values`` taken at ``times`` (clock ns, in order);
        ``stats``: the batch's ``(sum, min, max)`` when the caller has them
        (the fold does): a batch that fits in the open bucket, the usual case
        once buckets are wider than a fold's batch, then costs no pass. A
        batch over many buckets is summed in one pass of numpy's ``reduceat``
        when the program has numpy loaded (else C's ``min``, ``max``, ``sum``
        per bucket)."""
        plan = self._plan(len(values))
        spans = [p for p in plan if p is not None]
        aggregates = self._aggregates(spans, values, stats)
        k = 0
        for step in plan:
            if step is None:
                self._halve()
                continue
            i, j, new = step
            total, lo, hi = aggregates[k]
            k += 1
            if new:
                self.first.append(times[i])
                self.last.append(times[j - 1])
                self.counts.append(j - i)
                self.totals.append(total)
                self.mins.append(lo)
                self.maxs.append(hi)
                continue
            self.last[-1] = times[j - 1]
            self.counts[-1] += j - i
            self.totals[-1] += total
            if lo < self.mins[-1]:
                self.mins[-1] = lo
            if hi > self.maxs[-1]:
                self.maxs[-1] = hi

    def _plan(self, n: int) -> list[tuple[int, int, bool] | None]:
        """How ``n`` new samples fall: ``(i, j, new)`` for samples ``i:j``
        into the open bucket or a new one, None where the buckets halve
        first. Counts only: a few steps per bucket touched."""
        plan: list[tuple[int, int, bool] | None] = []
        buckets, width = len(self.counts), self.width
        last = self.counts[-1] if buckets else 0
        i = 0
        while i < n:
            room = width - last if buckets else 0
            if not room and buckets == self.most:
                plan.append(None)
                buckets, width, last = buckets // 2, width * 2, width * 2  # all full
                continue
            j = min(n, i + (room or width))
            plan.append((i, j, not room))
            buckets, last = (buckets, last + j - i) if room else (buckets + 1, j - i)
            i = j
        return plan

    @staticmethod
    def _aggregates(spans: list[tuple[int, int, bool]], values: Sequence[float],
                    stats: tuple[float, float, float] | None) -> list[tuple[float, float, float]]:
        """``(sum, min, max)`` of each span of ``values``."""
        if len(spans) == 1 and stats is not None and spans[0][1] - spans[0][0] == len(values):
            return [stats]
        np = sys.modules.get("numpy")  # used only if the program loaded it
        if np is not None and len(spans) > 4 and len(values) >= 256:
            a, _ = float_array(np, values)
            starts = [i for i, _, _ in spans]
            return list(zip(np.add.reduceat(a, starts).tolist(),
                            np.minimum.reduceat(a, starts).tolist(),
                            np.maximum.reduceat(a, starts).tolist(), strict=True))
        out = []
        for i, j, _ in spans:
            chunk = values[i:j] if i or j < len(values) else values
            out.append((sum(chunk), min(chunk), max(chunk)))
        return out

    def _halve(self) -> None:
        """Merges neighbours pairwise: half the buckets, each twice as wide."""
        c, t, lo, hi = self.counts, self.totals, self.mins, self.maxs
        self.first = self.first[0::2]
        self.last = self.last[1::2]
        self.counts = [a + b for a, b in zip(c[0::2], c[1::2], strict=True)]
        self.totals = [a + b for a, b in zip(t[0::2], t[1::2], strict=True)]
        self.mins = [min(a, b) for a, b in zip(lo[0::2], lo[1::2], strict=True)]
        self.maxs = [max(a, b) for a, b in zip(hi[0::2], hi[1::2], strict=True)]
        self.width *= 2

    def reading(self, mono_to_unix: float) -> RunSeries:
        """A copy on the unix clock (``mono_to_unix``: clock ns / 1e9 + it)."""
        return RunSeries(self.width, [t / 1e9 + mono_to_unix for t in self.first],
                         [t / 1e9 + mono_to_unix for t in self.last], self.counts,
                         self.totals, self.mins, self.maxs)
