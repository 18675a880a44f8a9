"""Everything a hot path defers, and when it is folded: the one mechanism.

A hot path (a training step, a transfer, a tracked call, a sample, a graph
execution) appends one record to a :class:`Journal` - one value, a tuple,
or the fields of a record through one ``list.extend`` of a tuple (each
atomic under the GIL, no lock) - and the journal's fold function turns
batches of them into counters, distributions, graph executions and events.

What is deferred (every one of them a journal):

============================  ====================================  ==========
records                       folded into                           owner
============================  ====================================  ==========
``mark_step`` times           MarkStep, StepTime, step events       Recorder
engine calls and transfers    counters, distributions, events       Recorder
single samples (``observe``)  one distribution's aggregates         Distribution
graph executions              the ledger's entries                  GraphLedger
============================  ====================================  ==========

When a journal folds (the one policy; nothing else folds, no timer):

1. on the appending thread, when it finds :data:`FOLD_AT` records waiting
   (:data:`SAMPLES_FOLD_AT` for one distribution's samples: a program has
   hundreds of distributions, and each waiting sample is an allocated pair);
2. before anything reads what it folds into: the recorder's journals in
   :meth:`metrics.recording.recorder.Recorder.flush` (the registry's, ledger's and
   event log's ``before_read``), a distribution's samples in its reading,
   the ledger's executions in its snapshot and before a compile changes an
   entry. A reader therefore sees every record appended before it asked.

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

FOLD_AT = 4096  # records waiting before the appending thread folds them
SAMPLES_FOLD_AT = FOLD_AT // 4  # one distribution's single samples (see the policy)


class Journal:
    """One hot path's pending records and the function that folds them.

    Args:
        fold: called with each batch, in the order appended, under ``lock``.
        fold_at: records waiting before :meth:`append` folds them.
        lock: the lock folds run under: the owner's own, where the fold
            changes state the owner guards with it (then the owner folds
            with :meth:`flush_held` while it holds the lock); a new one
            by default.
    """

    __slots__ = ("_queue", "_fold", "_lock", "fold_at", "folded", "before")

    def __init__(self, fold: Callable[[list[Any]], None], fold_at: int = FOLD_AT,
                 lock: threading.Lock | None = None) -> None:
        # A list, not a deque: a list is drained in bulk, one slice copy and
        # one slice delete in C (a deque only pops one item per call: ~35 ns
        # per field, a quarter of a call record's fold).
        self._queue: list[Any] = []
        self._fold = fold
        self._lock = lock if lock is not None else threading.Lock()
        self.fold_at = fold_at
        # Items taken off the queue so far (folded or cleared): ``folded +
        # len(queue)`` only ever grows, so a hot path can tell "nothing was
        # appended since" across a fold (the eager-op hook's separators).
        self.folded = 0
        # Called first by every fold, under the lock: an owner's state kept
        # outside the queue (counted in place) joins the fold there.
        self.before: Callable[[], None] | None = None

    @property
    def queue(self) -> list[Any]:
        """The list hot paths append to directly (saves a call per record);
        only ``append`` and ``extend`` (of a tuple) may touch it there, and
        whoever appends checks ``len(queue) >= fold_at`` and calls
        :meth:`flush` (policy 1)."""
        return self._queue

    def append(self, record: Any) -> None:
        q = self._queue
        q.append(record)
        if len(q) >= self.fold_at:
            self.flush()

    def flush(self) -> None:
        """Folds everything waiting, in the order it was appended."""
        with self._lock:
            self.flush_held()

    def flush_held(self) -> None:
        """:meth:`flush` for a caller that holds the journal's lock."""
        if self.before is not None:
            self.before()
        q = self._queue
        n = len(q)
        if n:
            # Other threads only append, at the end: the first n items
            # are this batch, whatever they add between the copy and the
            # delete (each one step in C under the GIL).
            batch = q[:n]
            del q[:n]
            self.folded += n
            self._fold(batch)

    def clear(self) -> None:
        with self._lock:
            self.folded += len(self._queue)
            self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)
