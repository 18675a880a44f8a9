"""Bounded rings of recent events with one sequence of numbers.

Watchers remember the last ``seq`` they saw and ask :meth:`EventLog.since`
for what came after; if the rings dropped some in between, ``since`` says
how many were lost.

Steps and transfers come by the thousand a second; compiles, recompiles and
the rest come rarely and matter most. So they live in two rings of
``capacity`` each: a flood of steps never pushes a recompile out, and when
an answer must be cut to ``limit`` events, the rare kinds are kept first.

The frequent ring holds *chunks*: a journal's fold hands over its whole
batch with a function that turns any part of it into event rows
(:meth:`EventLog.emit_batch`), so the program's thread does no work per
event; rows are made only for the events a reader asks for.

Example:
    >>> from tpu_info.contract.model import EventKind
    >>> log = EventLog(capacity=2)
    >>> for i in range(3):
    ...     _ = log.emit(EventKind.STEP, value=i)
    >>> _ = log.emit(EventKind.COMPILE, name="jit(f)")
    >>> [e.seq for e in log.since(0)[0]]
    [2, 3, 4]
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from tpu_info.contract.model import Event, EventKind
from tpu_info.contract.reuse import Kept

_Question = tuple[int, "int | None"]  # (since seq, limit)
_Row = tuple[Any, ...]  # (seq, time_unix, kind, name, graph_hash, detail, location, value[, via])
# All rows of a batch whose first event is numbered ``first``.
Expand = Callable[[int], Iterable[_Row]]


class Chunk(NamedTuple):
    """One batch of frequent events in the ring (immutable: readers copy the
    ring and keep their copy's counts). Made per batch, never per event of a
    training step (steps and transfers come through journals, as batches)."""

    first: int  # sequence number of the batch's first event
    n: int  # events in the batch
    start: int  # index of the first one still held (the ring trims from the front)
    rows: list[_Row] | None  # ready rows, or None while lazy
    expand: Expand | None  # what makes the rows of a lazy batch, or None when ready


_Answer = tuple[tuple[Event, ...], int]  # (events, dropped)


def _seq_of(t: tuple[Any, ...]) -> int:
    return t[0]


FREQUENT = frozenset({EventKind.STEP, EventKind.TRANSFER_TO_DEVICE,
                      EventKind.TRANSFER_FROM_DEVICE})  # the flood kinds
_ROWS_CHUNK = 1024  # ready rows gathered in one chunk at most (then a new one)


class EventLog:
    """Thread-safe rings of the last ``capacity`` frequent events (steps,
    transfers) and the last ``capacity`` of all other kinds."""

    def __init__(self, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self._frequent: deque[Chunk] = deque()
        self._frequent_held = 0  # events the chunks hold from their first held one on
        self._notable: deque[_Row] = deque(maxlen=capacity)
        self._next_seq = 1
        self._lock = threading.Lock()
        self._built: dict[int, Event] = {}  # Events already made from rows
        # Answers given since the rings last changed, by (seq, limit); kept
        # by the rings' state (tpu_info.contract.reuse's rule).
        self._memo: Kept[dict[_Question, _Answer]] = Kept()
        self._last = 0
        self._clock = clock
        # Called before every read: folds hot-path journals in (the recorder's).
        self.before_read: Callable[[], None] = lambda: None

    # Writing (callers of the _add helpers hold the lock) -------------------

    def _add_row(self, row: _Row) -> None:
        if row[2] not in FREQUENT:
            self._notable.append(row)
            return
        ring = self._frequent
        if ring:  # gather single rows into the newest chunk while numbers run on
            last = ring[-1]
            rows = last.rows
            if rows is not None and last.first + last.n == row[0] and last.n < _ROWS_CHUNK:
                rows.append(row)  # readers' copies of the chunk still say n
                ring[-1] = last._replace(n=last.n + 1)
                self._frequent_held += 1
                self._trim()
                return
        self._add_chunk(Chunk(row[0], 1, 0, [row], None))

    def _add_chunk(self, chunk: Chunk) -> None:
        self._frequent.append(chunk)
        self._frequent_held += chunk.n
        self._trim()

    def _trim(self) -> None:
        ring, excess = self._frequent, self._frequent_held - self.capacity
        while excess > 0:
            oldest = ring[0]
            held = oldest.n - oldest.start
            if held <= excess:
                ring.popleft()
                excess -= held
                self._frequent_held -= held
            else:
                ring[0] = oldest._replace(start=oldest.start + excess)
                self._frequent_held -= excess
                excess = 0

    def emit(
        self,
        kind: str,
        name: str = "",
        graph_hash: str = "",
        detail: str = "",
        location: str | None = None,
        value: float | None = None,
        time_unix: float | None = None,
        via: str = "",
    ) -> int:
        """Appends one event (at ``time_unix``, default now) and returns its
        sequence number; ``via``: the library call its line went through."""
        # A plain tuple, because building the frozen Event costs more than the
        # rest of emit; readers build Events. Numbers are drawn and appended
        # under one lock, so each ring is in sequence order.
        when = self._clock() if time_unix is None else time_unix
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            self._add_row((seq, when, kind, name, graph_hash, detail, location, value, via))
            self._last = seq
        return seq

    def emit_many(
        self,
        kind: str | Sequence[str],
        times_unix: Sequence[float],
        values: Iterable[float | None] | None = None,
    ) -> None:
        """Appends one event per time, of ``kind`` (one, or one per event)
        with the matching value."""
        n = len(times_unix)
        if not n:
            return
        with self._lock:
            first = self._next_seq
            self._next_seq = first + n
            rows = list(rows_of(first, times_unix, kind, values))
            if kind in FREQUENT if isinstance(kind, str) else FREQUENT.issuperset(kind):
                keep = min(n, self.capacity)  # hold no more rows than the ring keeps
                if keep:
                    self._add_chunk(Chunk(first + n - keep, keep, 0, rows[n - keep:], None))
            else:  # kinds of both sorts in one batch
                for row in rows:
                    self._add_row(row)
            self._last = first + n - 1

    def emit_batch(self, n: int, expand: Expand) -> None:
        """Appends ``n`` events of the frequent kinds (steps, transfers) whose
        rows ``expand(first_seq)`` makes, once, when a reader first asks for
        any of them: how journal folds record a batch in O(1). ``expand`` must
        give the ``n`` rows numbered from ``first_seq`` (:func:`rows_of`)."""
        if n <= 0:
            return
        with self._lock:
            first = self._next_seq
            self._next_seq = first + n
            self._add_chunk(Chunk(first, n, 0, None, expand))
            self._last = first + n - 1

    def mirror(self, events: Iterable[Event]) -> None:
        """Appends events numbered elsewhere (another process's log), keeping
        their numbers; those not above :attr:`last_seq` are skipped."""
        with self._lock:
            for e in events:
                if e.seq > self._last:
                    self._add_row((e.seq, e.time_unix, e.kind, e.name, e.graph_hash,
                                   e.detail, e.location, e.value, e.via))
                    self._last = e.seq
            self._next_seq = self._last + 1

    @property
    def last_seq(self) -> int:
        return self._last

    # Reading ---------------------------------------------------------------

    def since(self, seq: int, limit: int | None = None) -> tuple[tuple[Event, ...], int]:
        """Events with ``seq`` greater than the given one, in order, and how
        many of those the rings already dropped. ``limit`` keeps the newest
        ones, rare kinds first (see the module docstring)."""
        events, dropped, _ = self.since_through(seq, limit)
        return events, dropped

    def since_through(self, seq: int, limit: int | None = None
                      ) -> tuple[tuple[Event, ...], int, int]:
        """:meth:`since`, and the last number the answer covers: the rings'
        :attr:`last_seq` when they were read. A snapshot's ``last_seq`` must
        be this one, never :attr:`last_seq` read later: readers ask next for
        the events after it, so those emitted in between would be skipped
        (issue 42 item 7: a reader lost events 37-39 of a busy program)."""
        self.before_read()
        with self._lock:  # consistent copies, made in C (chunks are immutable)
            chunks, notable, last = tuple(self._frequent), list(self._notable), self._last
        # Rings only grow at the end and shrink at the front, so the last
        # number and the first one each ring holds name their contents: the
        # same question then gets the same answer, without building again
        # (a watcher polling an idle program, many clients asking alike).
        state = (last, chunks[0].first + chunks[0].start if chunks else 0,
                 notable[0][0] if notable else 0)
        answers = self._memo.get(state, dict)
        answer = answers.get((seq, limit))
        if answer is not None:
            return (*answer, last)  # immutable: shared by everyone who asks the same
        part_n = notable[bisect.bisect_right(notable, seq, key=_seq_of):]
        spans = []  # (chunk, lo): its events from lo on come after seq; newest first
        n_frequent = 0
        for chunk in reversed(chunks):
            first, n = chunk.first, chunk.n
            if first + n - 1 <= seq:
                break
            lo = max(chunk.start, seq - first + 1)
            spans.append((chunk, lo))
            n_frequent += n - lo
        # Numbers run 1..last without gaps, so what is not in a ring was dropped.
        dropped = max(0, last - seq - n_frequent - len(part_n))
        room = n_frequent
        if limit is not None and n_frequent + len(part_n) > limit:
            part_n = part_n[-limit:] if limit else []
            room = limit - len(part_n)
        part_f: list[_Row] = []
        for (first, n, _start, rows, expand), lo in reversed(_newest(spans, room)):
            if rows is None and expand is not None:
                rows = self._materialize(first, n, expand)
            if rows is not None:
                part_f.extend(rows[lo:n])
        built, made = self._built, {}
        out = []
        for t in heapq.merge(part_n, part_f, key=_seq_of):
            e = built.get(t[0])
            if e is None:
                e = Event(*t)
            made[t[0]] = e
            out.append(e)
        self._built = made  # keeps only what the last reader saw
        answer = (tuple(out), dropped)
        if len(answers) < 8:  # a few distinct questions per state
            answers[(seq, limit)] = answer
        return (*answer, last)

    def _materialize(self, first: int, n: int, expand: Expand) -> list[_Row]:
        """A batch's rows, made once: the first reader to need any of them
        makes them all and the ring keeps them, so many readers (a server
        answering hundreds of calls a second) do not make them again."""
        rows = list(expand(first))
        with self._lock:
            ring = self._frequent
            for i in range(len(ring) - 1, -1, -1):
                chunk = ring[i]
                if chunk.first == first and chunk.expand is expand:
                    ring[i] = chunk._replace(rows=rows, expand=None)  # its start may have moved
                    break
        return rows

    def clear(self) -> None:
        with self._lock:
            self._frequent.clear()
            self._frequent_held = 0
            self._notable.clear()
        self._built = {}
        self._memo.forget()


def rows_of(first: int, times_unix: Iterable[float], kind: str | Iterable[str],
            values: Iterable[float | None] | None = None) -> Iterable[_Row]:
    """Rows of events numbered from ``first``, one per time, of ``kind`` (one,
    or one per event) with the matching value; zip builds them in C."""
    rep = itertools.repeat
    kinds = rep(kind) if isinstance(kind, str) else kind
    return zip(itertools.count(first), times_unix, kinds, rep(""), rep(""), rep(""),
               rep(None), rep(None) if values is None else values)


def _newest(spans: list[tuple[Chunk, int]], room: int) -> list[tuple[Chunk, int]]:
    """``spans`` (newest first) cut to their newest ``room`` events."""
    out = []
    for chunk, lo in spans:
        if room <= 0:
            break
        n = chunk.n
        if n - lo > room:
            lo = n - room
        out.append((chunk, lo))
        room -= n - lo
    return out
