"""Dense bucket counts of one sign of a distribution (see ``metrics.recording.registry``).

``counts[i]`` is the number of samples in bucket ``offset + i``: contiguous
machine integers, so a reading copies the filled ones in one C pass instead
of visiting a dict. The span is bounded to :data:`MAX_SPAN` buckets around
the first key counted; keys beyond (and infinite values, keyed :data:`EDGE`)
count in the edge bucket. Not thread-safe: the distribution's lock guards it.

Example:
    >>> d = DenseCounts()
    >>> d.add_keys([3, 3, 5])
    >>> keys, counts = d.filled()
    >>> list(keys), list(counts)
    ([3, 5], [2, 1])
"""

from __future__ import annotations

import array
import itertools
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from tpu_info.contract.buckets import StableKeys, bucket_value, interpolate
from tpu_info.contract.reuse import Kept

MAX_SPAN = 16_384  # buckets at most (128 KiB): a value ratio of ~10**35 each way at 0.5 %
EDGE = 1 << 40  # the key of an infinite value: beyond any window, so the edge bucket


def _zeros(n: int) -> array.array[int]:
    return array.array("q", bytes(8 * n))


class DenseCounts:
    """Counts by bucket key over a contiguous, growing, bounded range."""

    __slots__ = ("counts", "offset", "anchor", "nonzero", "_keys")

    def __init__(self) -> None:
        self.counts = array.array("q")
        self.offset = 0
        self.anchor: int | None = None  # the first key: the span is bounded around it
        # Buckets holding something. A count never drops back to zero, so
        # while this stays put so does the set of filled keys: the key list
        # readings hand out is kept by it (tpu_info.contract.reuse's rule; encoders
        # keep the list's encoding on it).
        self.nonzero = 0
        self._keys: Kept[StableKeys] = Kept()

    def window(self, lo: int, hi: int) -> tuple[int, int]:
        """``lo``..``hi`` clamped to the keys this may hold."""
        if self.anchor is None:
            self.anchor = lo
        low, high = self.anchor - MAX_SPAN // 2, self.anchor + MAX_SPAN // 2
        return min(max(lo, low), high), min(max(hi, low), high)

    def _cover(self, lo: int, hi: int) -> None:
        arr = self.counts
        if not arr:
            arr.extend(_zeros(hi - lo + 1))
            self.offset = lo
            return
        if lo < self.offset:
            arr[0:0] = _zeros(self.offset - lo)
            self.offset = lo
        end = self.offset + len(arr) - 1
        if hi > end:
            arr.extend(_zeros(hi - end))

    def add_keys(self, keys: list[int]) -> None:
        """Counts one sample per key (the pure-Python fold)."""
        self.add_weighted(keys, itertools.repeat(1, len(keys)))

    def add_key(self, key: int, times: int) -> None:
        """Counts ``times`` samples of one key (:meth:`add_keys` of ``[key] * times``)."""
        lo, _ = self.window(key, key)
        self._cover(lo, lo)
        i = lo - self.offset
        if not self.counts[i]:
            self.nonzero += 1
        self.counts[i] += times

    def add_weighted(self, keys: list[int], weights: Iterable[int]) -> None:
        """Counts ``weights[i]`` samples of ``keys[i]`` (one window and one
        cover for the batch, not one per key)."""
        lo, hi = min(keys), max(keys)
        wlo, whi = self.window(lo, hi)
        if (wlo, whi) != (lo, hi):
            keys = [min(max(key, wlo), whi) for key in keys]
        self._cover(wlo, whi)
        arr, off, filled = self.counts, self.offset, 0
        for key, w in zip(keys, weights, strict=True):
            i = key - off
            if w and not arr[i]:
                filled += 1
            arr[i] += w
        self.nonzero += filled

    def add_keys_numpy(self, np: Any, keys: Any) -> None:
        """:meth:`add_keys` for an int64 numpy array, in bulk."""
        first, last = int(keys.min()), int(keys.max())
        lo, hi = self.window(first, last)
        if (lo, hi) != (first, last):
            np.clip(keys, lo, hi, out=keys)
        self._cover(lo, hi)
        self.nonzero += _add(np, self.counts, lo - self.offset, np.bincount(keys - lo))

    def filled(self, np: Any = None,
               descending: bool = False) -> tuple[StableKeys, array.array[int]]:
        """(keys, counts) of the filled buckets in key order (or reversed),
        copied with ``np`` (numpy) when given. The key list is the same
        object until a bucket fills for the first time. Both are
        machine-integer arrays, not lists: a reading holds hundreds of
        counts, and the garbage collector walks every item of a young list
        but never looks inside an array, so scrapes leave it nothing to
        traverse (with lists, a young collection in a scrape cost 1.5-3.5 ms)."""
        if np is not None:
            return self._filled_numpy(np, descending)
        keys = self._keys.at(self.nonzero)
        if keys is None:
            keys = StableKeys(list(itertools.compress(
                range(self.offset, self.offset + len(self.counts)), self.counts)))
            if descending:
                keys.reverse()
            self._keys.put(self.nonzero, keys)
        counts = array.array("q", list(filter(None, self.counts)))
        if descending:
            counts.reverse()
        return keys, counts

    def _filled_numpy(self, np: Any, descending: bool) -> tuple[StableKeys, array.array[int]]:
        # One mask and two copies in C; about 3x faster than filter().
        view = np.frombuffer(self.counts, dtype=np.int64)
        if descending:
            view = view[::-1]
        mask = view != 0
        keys = self._keys.at(self.nonzero)
        if keys is None:
            at = np.flatnonzero(mask)
            found = (self.offset + len(view) - 1 - at) if descending else (self.offset + at)
            keys = self._keys.put(self.nonzero, StableKeys(found.tobytes()))  # int64 already
        return keys, array.array("q", view[mask].tobytes())


def percentiles_numpy(
    np: Any, gamma: float, neg: DenseCounts, zero: int, pos: DenseCounts,
    count: int, percents: Sequence[float], lo: float, hi: float,
) -> list[float]:
    """:func:`tpu_info.contract.buckets.sorted_percentiles` read straight from dense
    counts: one cumulative sum and one search in C instead of list copies and
    a Python pass over every bucket. The same ranks and formulas, so the same
    floats. The caller holds the distribution's lock (the counts are read in
    place)."""
    int64 = np.int64
    n_neg = len(neg.counts)
    # Value order: negative keys descending, the zero bucket, positive keys ascending.
    parts = [np.frombuffer(neg.counts, dtype=int64)[::-1]] if n_neg else []
    parts.append(np.array((zero,), dtype=int64))
    if pos.counts:
        parts.append(np.frombuffer(pos.counts, dtype=int64))
    cumulative = np.cumsum(np.concatenate(parts))
    # The first index whose cumulative count exceeds a rank is a filled bucket
    # (empty ones repeat the sum before them): what bisect_right picks.
    last, top, first_pos = len(cumulative) - 1, neg.offset + n_neg - 1, pos.offset - n_neg - 1

    def values_at(ranks: list[int]) -> list[float]:
        values = []
        for i in cumulative.searchsorted(ranks, side="right").tolist():
            i = min(i, last)
            if i > n_neg:
                values.append(bucket_value(gamma, first_pos + i))
            elif i == n_neg:
                values.append(0.0)
            else:
                values.append(-bucket_value(gamma, top - i))
        return values

    return interpolate(count, percents, values_at, lo, hi)


def fold_numpy(np: Any, values: Sequence[float], inv_log_gamma: float, pos: DenseCounts,
               neg: DenseCounts) -> tuple[float, float, float, int]:
    """Counts ``values`` (256 or more) into ``pos`` and ``neg`` (of ``|v|``) with
    numpy; returns their (sum, min, max, count of zeros and NaN), min and max
    as floats. The caller holds the distribution's lock."""
    a, ints = float_array(np, values)
    lo, hi = float(a.min()), float(a.max())
    total = None if ints is None else whole_total(np, ints, lo, hi)
    if total is None:
        total = fsum_total(values)
    # Whether a side may hold an infinity (lo and hi are NaN if any sample is).
    pos_inf, neg_inf = not hi < math.inf, not lo > -math.inf
    if lo > 0:  # the common case: every sample positive, no masks
        pos.add_keys_numpy(np, bucket_keys(np, a, inv_log_gamma, pos_inf))
        return total, lo, hi, 0
    placed = 0
    for dense, part, has_inf in ((pos, a[a > 0], pos_inf), (neg, -a[a < 0], neg_inf)):
        if part.size:
            dense.add_keys_numpy(np, bucket_keys(np, part, inv_log_gamma, has_inf))
            placed += part.size
    return total, lo, hi, int(a.size - placed)


def fold_python(values: Sequence[float], inv_log_gamma: float, pos: DenseCounts,
                neg: DenseCounts) -> tuple[float, float, float, int]:
    """:func:`fold_numpy` in pure Python (a small batch, or no numpy)."""
    k, log, ceil, inf = inv_log_gamma, math.log, math.ceil, math.inf
    # An infinite value has no key: it goes to the edge bucket.
    keys_pos = [ceil(log(v) * k) if v != inf else EDGE for v in values if v > 0]
    keys_neg = [ceil(log(-v) * k) if v != -inf else EDGE for v in values if v < 0]
    if keys_pos:
        pos.add_keys(keys_pos)
    if keys_neg:
        neg.add_keys(keys_neg)
    # NaN is neither > 0 nor < 0: it lands with the zeros, as it always has.
    return (fsum_total(values), min(values), max(values),
            len(values) - len(keys_pos) - len(keys_neg))


def fold_repeated(v: float, n: int, with_numpy: bool, inv_log_gamma: float, pos: DenseCounts,
                  neg: DenseCounts) -> tuple[float, float, float, int]:
    """The fold of ``[v] * n`` in O(1): one key counted ``n`` times (found
    as the fold it stands in for finds it: numpy's for a batch of 256 or
    more), and ``float(v) * n``, the correctly rounded sum ``math.fsum``
    gives."""
    total = float(v) * n
    if not v > 0 and not v < 0:  # zero or NaN: with the zeros, as in the other folds
        lo = float(v) if with_numpy else v
        return total, lo, lo, n
    dense, size = (pos, v) if v > 0 else (neg, -v)
    k = inv_log_gamma
    if with_numpy:
        np = sys.modules["numpy"]
        key = np.nan_to_num(np.ceil(np.log(np.array([size], np.float64)) * k), posinf=EDGE)
        dense.add_key(int(key[0]), n)
        return total, float(v), float(v), 0
    dense.add_key(math.ceil(math.log(size) * k) if size != math.inf else EDGE, n)
    return total, v, v, 0


def fold_weighted(values: Sequence[float], weights: Sequence[int], inv_log_gamma: float,
                  pos: DenseCounts, neg: DenseCounts) -> tuple[float, float, float, int]:
    """:func:`fold_python` of each value repeated by its weight, without the
    repeats (sampled timings: a few hundred values a batch); the count of
    zeros and NaN is weighted too."""
    k, log, ceil, inf = inv_log_gamma, math.log, math.ceil, math.inf
    zero = 0
    if min(values) > 0:  # the usual batch (durations): one side, one pass
        pos.add_weighted([ceil(log(v) * k) if v != inf else EDGE for v in values], weights)
    else:
        sides: tuple[tuple[list[int], list[int]], ...] = (([], []), ([], []))
        for v, w in zip(values, weights, strict=True):
            if v > 0 or v < 0:
                keys, ws = sides[v < 0]
                keys.append(ceil(log(abs(v)) * k) if abs(v) != inf else EDGE)
                ws.append(w)
            else:  # zero or NaN: with the zeros, as in the other folds
                zero += w
        for dense, (keys, ws) in zip((pos, neg), sides):
            if keys:
                dense.add_weighted(keys, ws)
    total = fsum_total([v * w for v, w in zip(values, weights, strict=True)])
    return total, min(values), max(values), zero


def fsum_total(values: Sequence[float]) -> float:
    """The exact sum (``math.fsum``); inf and -inf together make NaN, not an error."""
    try:
        return float(math.fsum(values))
    except (ValueError, OverflowError):
        return float(sum(values))


def float_array(np: Any, values: Sequence[float]) -> tuple[Any, Any]:
    """``values`` as a float64 numpy array, the same floats as
    ``np.asarray(values, np.float64)``, and as int64 when they are all
    integers (else None). From a list or tuple of ints through an
    ``array.array``, of floats through ``fromiter``: 35-45 % faster."""
    if type(values) is not list and type(values) is not tuple:
        return np.asarray(values, dtype=np.float64), None
    if values and type(values[0]) is int:
        try:
            ints = np.frombuffer(array.array("q", values), dtype=np.int64)
        except (TypeError, OverflowError):  # a float among them, or a huge int
            pass
        else:
            return ints.astype(np.float64), ints
    return np.fromiter(values, dtype=np.float64, count=len(values)), None


def bucket_keys(np: Any, part: Any, inv_log_gamma: float, has_inf: bool) -> Any:
    """The bucket key of every (positive) float in ``part`` as int64, the
    infinite ones :data:`EDGE`: ``ceil(log(v) / log(gamma))`` in place, one
    temporary array instead of four."""
    keys = np.log(part)
    keys *= inv_log_gamma
    np.ceil(keys, out=keys)
    if has_inf:
        np.nan_to_num(keys, copy=False, posinf=EDGE)
    return keys.astype(np.int64)


def whole_total(np: Any, ints: Any, lo: float, hi: float) -> float | None:
    """``math.fsum`` of the integers in ``ints`` (``lo``..``hi``) when all are
    under 2**53 in magnitude (durations in ns, sizes in bytes), at a 50th of
    its cost: they are exact as floats, their int64 sum is exact, and one
    correctly rounded conversion gives the float fsum gives. None otherwise
    (larger ones, a possible overflow, or a zero sum, which fsum may sign)."""
    bound = max(-lo, hi)
    if not bound < _WHOLE_EXACT or bound * len(ints) >= _INT64_SAFE:
        return None
    total = int(ints.sum())
    return float(total) if total else None


_WHOLE_EXACT = float(1 << 53)  # integers below this are exact floats
_INT64_SAFE = float(1 << 62)  # a sum bound below this cannot overflow int64


def _add(np: Any, arr: array.array[int], start: int, counts: Any) -> int:
    """Adds ``counts`` to ``arr[start:]`` through a numpy view; returns how
    many buckets went from empty to filled. The view is gone on return, so
    the array can grow again."""
    window = np.frombuffer(arr, dtype=np.int64)[start: start + len(counts)]
    filled = int(np.count_nonzero((window == 0) & (counts > 0)))
    window += counts
    return filled
