"""Percentiles from log-spaced bucket counts (:class:`~tpu_info.contract.model.BucketCounts`).

Pure math shared by the in-process hook (``metrics.recording.registry`` computes the
percentiles it ships) and the CLI (which computes the ones that were not
shipped, such as P99.9, from the buckets that were). It lives here because
``tpu_info`` must not import ``metrics``; ``metrics`` may import ``tpu_info``.

Bucket ``k`` holds samples ``v`` with ``gamma**(k-1) < |v| <= gamma**k``; its
representative value ``2 * gamma**k / (gamma + 1)`` has the least relative
error to any value inside it, so a percentile estimated from the buckets is
within ``(gamma - 1) / (gamma + 1)`` of the exact one, relatively.

Example:
    >>> from tpu_info.contract.model import BucketCounts
    >>> b = BucketCounts(gamma=1.02, positive={0: 3})   # three samples of 1.0
    >>> round(percentile(b, 3, 50.0), 2)
    0.99
    >>> percentile(b, 3, 50.0, lo=1.0, hi=1.0)
    1.0
"""

from __future__ import annotations

import array
import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, ValuesView

from tpu_info.contract.model import BucketCounts


def bucket_value(gamma: float, key: int) -> float:
    """The representative value of positive bucket ``key``: the point of
    ``(gamma**(key-1), gamma**key]`` with the least relative error."""
    return 2.0 * gamma**key / (gamma + 1.0)


def percentile(
    b: BucketCounts, count: int, percent: float,
    lo: float | None = None, hi: float | None = None,
) -> float:
    """numpy's linear-interpolation percentile, estimated from buckets.

    Estimates the two order statistics numpy interpolates between and
    interpolates them the same way, so the result keeps the buckets' relative
    error. Exact ``lo``/``hi`` (min, max) clamp the estimate when known.

    Args:
        b: the bucket counts.
        count: how many samples they hold (``DistributionReading.count``).
        percent: 0 to 100.
        lo: the exact minimum, if known.
        hi: the exact maximum, if known.

    Raises:
        ValueError: ``count`` is not positive, ``percent`` is outside 0..100,
            or the buckets are empty.
    """
    return percentiles(b, count, (percent,), lo, hi)[0]


def percentiles(
    b: BucketCounts, count: int, percents: Sequence[float],
    lo: float | None = None, hi: float | None = None,
) -> list[float]:
    """:func:`percentile` for several percents, sorting the buckets once.

    Raises:
        ValueError: as :func:`percentile`.
    """
    if count <= 0:
        raise ValueError("a percentile of no samples")
    for percent in percents:
        if not 0.0 <= percent <= 100.0:
            raise ValueError(f"percent {percent} is outside 0..100")
    neg = SortedCounts.of(b.negative, descending=True)
    pos = SortedCounts.of(b.positive)
    return sorted_percentiles(
        b.gamma, neg.key_list, neg.count_list, b.zero, pos.key_list, pos.count_list,
        count, percents, lo, hi,
    )


class StableKeys(array.array):  # type: ignore[type-arg]
    """A bucket key list its owner never changes while the list is alive (the
    hook's, replaced only when a bucket fills for the first time): an encoder
    may keep the list's encoding on it (``encoded``), where it lives and dies
    with the list. Lists from anywhere else (a decoded message, say) are plain
    lists and are encoded each time. Machine integers (an ``array("q")``), so
    the garbage collector has nothing inside it to walk.

    Args:
        keys: ints, or their int64 machine bytes.
    """

    __slots__ = ("encoded",)

    def __new__(cls, keys: Iterable[int] | bytes = ()) -> StableKeys:
        return super().__new__(cls, "q", keys)  # type: ignore[return-value]


class SortedCounts(Mapping[int, int]):
    """Read-only bucket counts held as two parallel lists in value order.

    The hook keeps its bucket keys sorted between scrapes; readings hand out
    this form so percentiles and the wire encoder use the lists as they are,
    without a dict copy, a sort or a lookup per bucket.
    """

    __slots__ = ("key_list", "count_list", "_index")

    def __init__(self, keys: Sequence[int], counts: Sequence[int]) -> None:
        self.key_list = keys
        self.count_list = counts
        self._index: dict[int, int] | None = None

    @classmethod
    def of(cls, counts: Mapping[int, int], descending: bool = False) -> SortedCounts:
        """``counts`` in this form (as it is, if it already is, ascending)."""
        if isinstance(counts, SortedCounts) and not descending:
            return counts
        keys = sorted(counts, reverse=descending)
        return cls(keys, [counts[k] for k in keys])

    def __getitem__(self, key: int) -> int:
        if self._index is None:
            self._index = dict(zip(self.key_list, self.count_list))
        return self._index[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self.key_list)

    def __len__(self) -> int:
        return len(self.key_list)

    def values(self) -> ValuesView[int]:  # in key order, like keys()
        return _ListValues(self)

    def __repr__(self) -> str:
        return f"SortedCounts({dict(zip(self.key_list, self.count_list))!r})"


class _ListValues(ValuesView[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(self._mapping.count_list)  # type: ignore[attr-defined]


def sorted_percentiles(
    gamma: float,
    neg_keys: Sequence[int], neg_counts: Sequence[int], zero: int,
    pos_keys: Sequence[int], pos_counts: Sequence[int],
    count: int, percents: Sequence[float],
    lo: float | None = None, hi: float | None = None,
) -> list[float]:
    """:func:`percentiles` over bucket keys in value order (``neg_keys``
    descending, ``pos_keys`` ascending) and their counts. Arguments are not
    checked again.
    """
    counts = list(neg_counts)
    has_zero = 1 if zero else 0
    if has_zero:
        counts.append(zero)
    counts += pos_counts
    if not counts:
        raise ValueError("no buckets to read a rank from")
    cumulative = list(itertools.accumulate(counts))
    n_neg, last = len(neg_keys), len(counts) - 1

    def at_rank(rank: int) -> float:
        i = min(bisect.bisect_right(cumulative, rank), last)
        if i < n_neg:
            return -bucket_value(gamma, neg_keys[i])
        i -= n_neg
        if i < has_zero:
            return 0.0
        return bucket_value(gamma, pos_keys[i - has_zero])

    return interpolate(count, percents, lambda ranks: [at_rank(r) for r in ranks], lo, hi)


def interpolate(
    count: int, percents: Sequence[float],
    values_at: Callable[[list[int]], Sequence[float]],
    lo: float | None = None, hi: float | None = None,
) -> list[float]:
    """numpy's linear-interpolation percentiles of ``count`` samples, given
    ``values_at(ranks)``: the estimates of those order statistics (0-based).
    It is asked once, for the rank below each percentile's position followed
    by the rank above; exact ``lo``/``hi`` clamp the results."""
    heights = [(count - 1) * p / 100.0 for p in percents]
    below = [math.floor(h) for h in heights]
    values = values_at(below + [min(b + 1, count - 1) for b in below])
    n, out = len(percents), []
    for j, h in enumerate(heights):
        v = values[j]
        if h != below[j]:
            v = v + (h - below[j]) * (values[n + j] - v)
        if lo is not None and v < lo:
            v = lo
        if hi is not None and v > hi:
            v = hi
        out.append(v)
    return out


def merge_buckets(parts: Iterable[BucketCounts]) -> BucketCounts | None:
    """Adds bucket counts of distributions that share one ``gamma`` (a fleet
    view's processes, or an engine's part and the registry's in a snapshot);
    the counts come back in value order, as the hook's own readings hold them.

    Raises:
        ValueError: the parts have different bucket widths.
    """
    parts = list(parts)
    if not parts:
        return None
    gamma = parts[0].gamma
    pos: dict[int, int] = {}
    neg: dict[int, int] = {}
    zero = 0
    for p in parts:
        if not math.isclose(p.gamma, gamma):
            raise ValueError("cannot merge distributions with different bucket widths")
        for k, n in p.positive.items():
            pos[k] = pos.get(k, 0) + n
        for k, n in p.negative.items():
            neg[k] = neg.get(k, 0) + n
        zero += p.zero
    return BucketCounts(gamma=gamma, positive=SortedCounts.of(pos),
                        negative=SortedCounts.of(neg, descending=True), zero=zero)
