"""Raw records appended on a hot path, folded into aggregates in batches.

A hot path (a training step, a transfer, a tracked call) appends one record
to a :class:`Journal` - one value, a tuple, or the fields of a record through
one ``list.extend`` of a tuple (each atomic under the GIL, no lock) - and the
journal's fold function turns batches of them into counters, distributions,
graph executions and events: when :data:`FOLD_AT` records wait, and before
anything reads the recorder (the recorder's ``flush``).

Example:
    >>> seen = []
    >>> j = Journal(seen.extend)
    >>> j.append((1,)); j.append((2,))
    >>> j.flush(); seen
    [(1,), (2,)]
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

FOLD_AT = 4096


class Journal:
    """One hot path's pending records and the function that folds them."""

    __slots__ = ("_queue", "_fold", "_lock", "fold_at")

    def __init__(self, fold: Callable[[list[Any]], None], fold_at: int = FOLD_AT) -> None:
        # A list, not a deque: a list is drained in bulk, one slice copy and
        # one slice delete in C (a deque only pops one item per call: ~35 ns
        # per field, a quarter of a call record's fold).
        self._queue: list[Any] = []
        self._fold = fold
        self._lock = threading.Lock()
        self.fold_at = fold_at

    @property
    def queue(self) -> list[Any]:
        """The list hot paths append to directly (saves a call per record);
        only ``append`` and ``extend`` (of a tuple) may touch it there."""
        return self._queue

    def append(self, record: Any) -> None:
        q = self._queue
        q.append(record)
        if len(q) >= self.fold_at:
            self.flush()

    def flush(self) -> None:
        """Folds everything waiting, in the order it was appended."""
        with self._lock:
            q = self._queue
            n = len(q)
            if n:
                # Other threads only append, at the end: the first n items
                # are this batch, whatever they add between the copy and the
                # delete (each one step in C under the GIL).
                batch = q[:n]
                del q[:n]
                self._fold(batch)

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
