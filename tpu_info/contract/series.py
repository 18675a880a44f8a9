"""A whole run of one distribution's samples, bounded: the record behind
the HTML report's step-time plot of the whole run (the hook keeps it with
``metrics.recording.series``; the wire carries it as ``RunSeries``).

Example:
    >>> r = RunSeries(2, [1.0, 3.0], [2.0, 3.0], [2, 1], [30.0, 5.0], [10.0, 5.0], [20.0, 5.0])
    >>> len(r), r.count, r.mean(0), list(r.first_index())
    (2, 3, 15.0, [0, 2])
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Iterator

# Buckets of a whole-run series (:class:`RunSeries`) the hook keeps (a reader
# accepts up to four times as many: tpu_info.wire.codec's MAX_SERIES).
RUN_SERIES_BUCKETS = 256


class RunSeries:
    """A whole run of one distribution's samples in a bounded number of
    buckets of consecutive samples, oldest first: bucket ``i`` holds
    ``counts[i]`` samples (``width``, the last one fewer) with their sum,
    min and max and the unix times of its first and last sample. The hook
    keeps at most :data:`RUN_SERIES_BUCKETS`; when they are full,
    neighbours merge pairwise and ``width`` doubles, so the series covers
    the whole run at any length and a spike survives as its bucket's max.

    Held as arrays of doubles (as :class:`~tpu_info.contract.model.Samples`: few objects to copy or
    collect). A run's 10,000 steps are 157 buckets of 64 (the last of 16).
    """

    __slots__ = ("width", "first_unix", "last_unix", "counts", "totals", "mins", "maxs")

    def __init__(self, width: int, first_unix: Iterable[float], last_unix: Iterable[float],
                 counts: Iterable[int], totals: Iterable[float], mins: Iterable[float],
                 maxs: Iterable[float]) -> None:
        self.width = int(width)
        self.first_unix = array.array("d", first_unix)
        self.last_unix = array.array("d", last_unix)
        self.counts = array.array("q", counts)
        self.totals = array.array("d", totals)
        self.mins = array.array("d", mins)
        self.maxs = array.array("d", maxs)
        n = len(self.counts)
        if any(len(a) != n for a in (self.first_unix, self.last_unix, self.totals, self.mins,
                                     self.maxs)):
            raise ValueError("a run series' arrays differ in length")

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def count(self) -> int:
        """Samples in all buckets."""
        return sum(self.counts)

    def mean(self, i: int) -> float:
        """Bucket ``i``'s mean sample."""
        return self.totals[i] / self.counts[i] if self.counts[i] else 0.0

    def first_index(self) -> Iterator[int]:
        """Each bucket's first sample's index in the run (0-based)."""
        at = 0
        for n in self.counts:
            yield at
            at += n

    def _key(self) -> tuple[object, ...]:
        return (self.width, self.first_unix, self.last_unix, self.counts, self.totals,
                self.mins, self.maxs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunSeries):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.width, len(self), self.count, self.last_unix[-1] if len(self) else 0))

    def __repr__(self) -> str:
        return f"RunSeries(width={self.width}, buckets={len(self)}, samples={self.count})"
