"""Sampled timing: count every call, read the clock on one in :data:`TIME_EVERY`.

The hooks that run on every step of a training loop (the ``jax.jit``
wrapper's call, the numpy ``device_put`` handler) spend most of their time
reading the clock twice and checking whether their journal is full. So on
the usual path they time one call in :data:`TIME_EVERY` (after timing each
of their first :data:`TIME_FIRST`: a short run, and the first calls whose
times vary most, are measured whole), and write the others as records with
``end == 0``: counts, bytes and graph
attribution stay exact, and each timed record stands for the untimed ones
of the same function in its batch (:func:`timed`), so a time distribution's
count and sum are the call count and an estimate of the time inside all
calls. A function whose batch holds no timed record is estimated at its
mean so far (the caller's). Implicit transfers, ``device_get`` and
``metrics.mark_step`` are always timed (they are not on a loop's usual path,
or a step's time is what they measure).

Example:
    >>> t = timed(["f", "f", "f", "f"], [10, 0, 0, 50], [20, 0, 0, 56], {"f"})
    >>> t.durations, t.weights, t.trailing
    ([10, 6], [2, 2], {'f': 0})
"""

from __future__ import annotations

import collections
import itertools
import operator
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

TIME_EVERY = 16  # one call in this many is timed on the usual path...
TIME_FIRST = 64  # ...after each hook's first this many, which are all timed


class Timed(NamedTuple):
    """The timed records of a batch, with what each stands for."""

    owners: list[Any]
    starts: list[int]
    ends: list[int]
    durations: list[int]
    weights: list[int]  # records of the same owner each timed one stands for (sum: all)
    untimed_only: dict[Any, int]  # owners with no timed record in the batch: their count
    trailing: dict[Any, int]  # per timed owner: its untimed records after its last timed one


def spread(n: int, k: int) -> list[int]:
    """``n`` records over ``k`` timed ones, as even as integers go (sum ``n``)."""
    base, extra = divmod(n, k)
    return [base + 1] * extra + [base] * (k - extra)


def timed(owners: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
          uniq: set[Any], groups: Sequence[Any] | None = None) -> Timed:
    """Splits a batch whose untimed records have ``end == 0`` (``uniq``: the
    set of ``owners``). A timed record stands for the untimed ones of its
    group (``groups``, parallel to ``owners``; default the owners): a
    caller keeps calls that compiled apart from the usual ones, so a timed
    compile never stands for a usual call, nor a usual call for a compile.
    ``untimed_only`` then counts by owner."""
    mask = list(map(bool, ends))
    t_owners = list(itertools.compress(owners, mask))
    t_starts = list(itertools.compress(starts, mask))
    t_ends = list(itertools.compress(ends, mask))
    durations = list(map(operator.sub, t_ends, t_starts))
    if groups is None and len(uniq) == 1:  # the usual batch: one function
        owner = owners[0]
        if not t_owners:
            return Timed([], [], [], [], [], {owner: len(owners)}, {})
        trailing = mask[::-1].index(True)
        return Timed(t_owners, t_starts, t_ends, durations, spread(len(owners), len(t_owners)),
                     {}, {owner: trailing})
    keys = owners if groups is None else groups
    t_keys = list(itertools.compress(keys, mask))
    counts = collections.Counter(keys)
    t_counts = collections.Counter(t_keys)
    shares = {g: iter(spread(counts[g], k)) for g, k in t_counts.items()}
    weights = [next(shares[g]) for g in t_keys]
    untimed_only: dict[Any, int] = {}
    after: dict[Any, int] = {}
    for o, g, is_timed in zip(owners, keys, mask, strict=True):
        after[o] = 0 if is_timed else after.get(o, 0) + 1
        if g not in t_counts:
            untimed_only[o] = untimed_only.get(o, 0) + 1
    return Timed(t_owners, t_starts, t_ends, durations, weights, untimed_only,
                 {o: after[o] for o in set(t_owners)})


def filled(ends: Sequence[int], default: int) -> list[int]:
    """``ends`` with each untimed record's 0 replaced by the end of the timed
    record before it (the first timed one's for those before it; ``default``
    in a batch with none): the time an untimed record's event carries."""
    last = next((e for e in ends if e), default)
    np = sys.modules.get("numpy")  # a batch of thousands: in C when the program has numpy
    if np is None or len(ends) < 64:
        out = []
        for e in ends:
            if e:
                last = e
            out.append(last)
        return out
    a = np.fromiter(ends, np.int64, len(ends))
    at = np.where(a != 0, np.arange(len(a)), 0)
    np.maximum.accumulate(at, out=at)  # each record: the index of the timed one at or before it
    out_a = a[at]
    out_a[out_a == 0] = last  # those before the first timed one
    return out_a.tolist()  # type: ignore[no-any-return]
