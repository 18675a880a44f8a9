"""Bounded rings of recent events with one sequence of numbers.

Watchers remember the last ``seq`` they saw and ask :meth:`EventLog.since`
for what came after; if the rings dropped some in between, ``since`` says
how many were lost.

Steps and transfers come by the thousand a second; compiles, recompiles and
the rest come rarely and matter most. So they live in two rings of
``capacity`` each: a flood of steps never pushes a recompile out, and when
an answer must be cut to ``limit`` events, the rare kinds are kept first.

Example:
    >>> log = EventLog(capacity=2)
    >>> for i in range(3):
    ...     _ = log.emit("step", value=i)
    >>> _ = log.emit("compile", name="jit(f)")
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
from typing import Any

from tpu_info.model import Event

_Question = tuple[int, "int | None"]  # (since seq, limit)
_Answer = tuple[tuple[Event, ...], int]  # (events, dropped)


def _seq_of(t: tuple[Any, ...]) -> int:
    return t[0]


# Kinds the hook emits; renderers may meet others from newer hooks.
COMPILE = "compile"
RECOMPILE = "recompile"
CACHE_HIT = "cache_hit"
TRANSFER_TO_DEVICE = "transfer_to_device"
TRANSFER_FROM_DEVICE = "transfer_from_device"
STEP = "step"
HOOK_ERROR = "hook_error"

FREQUENT = frozenset({STEP, TRANSFER_TO_DEVICE, TRANSFER_FROM_DEVICE})  # the flood kinds


class EventLog:
    """Thread-safe rings of the last ``capacity`` frequent events (steps,
    transfers) and the last ``capacity`` of all other kinds."""

    def __init__(self, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self._frequent: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._notable: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._next_seq = 1
        self._lock = threading.Lock()
        self._built: dict[int, Event] = {}  # Events already made from ring tuples
        # Answers given since the rings last changed, by (seq, limit).
        self._memo: tuple[tuple[int, ...], dict[_Question, _Answer]] = ((-1,), {})
        self._last = 0
        self._clock = clock
        # Called before every read: folds hot-path journals in (the recorder's).
        self.before_read: Callable[[], None] = lambda: None

    def _ring_for(self, kind: str) -> deque[tuple[Any, ...]]:
        return self._frequent if kind in FREQUENT else self._notable

    def emit(
        self,
        kind: str,
        name: str = "",
        graph_hash: str = "",
        detail: str = "",
        location: str | None = None,
        value: float | None = None,
        time_unix: float | None = None,
    ) -> int:
        """Appends one event (at ``time_unix``, default now) and returns its
        sequence number."""
        # A plain tuple, because building the frozen Event costs more than the
        # rest of emit; readers build Events. Numbers are drawn and appended
        # under one lock, so each ring is in sequence order.
        when = self._clock() if time_unix is None else time_unix
        ring = self._ring_for(kind)
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            ring.append((seq, when, kind, name, graph_hash, detail, location, value))
            self._last = seq
        return seq

    def emit_many(
        self,
        kind: str | Sequence[str],
        times_unix: Sequence[float],
        values: Iterable[float | None] | None = None,
    ) -> None:
        """Appends one event per time, of ``kind`` (one, or one per event)
        with the matching value: how folds record a batch of steps or
        transfers at once."""
        n = len(times_unix)
        if not n:
            return
        rep = itertools.repeat
        if isinstance(kind, str):
            kinds: Iterable[str] = rep(kind)
            ring = self._ring_for(kind)
        else:
            kinds = kind
            ring = self._frequent if FREQUENT.issuperset(kind) else None
        vals = rep(None) if values is None else values
        with self._lock:
            first = self._next_seq
            self._next_seq = first + n
            # zip builds the rows in C: no bytecode per event.
            rows = zip(range(first, first + n), times_unix, kinds, rep(""), rep(""),
                       rep(""), rep(None), vals)
            if ring is not None:
                ring.extend(rows)
            else:  # kinds of both sorts in one batch
                for row in rows:
                    self._ring_for(row[2]).append(row)
            self._last = first + n - 1

    def mirror(self, events: Iterable[Event]) -> None:
        """Appends events numbered elsewhere (another process's log), keeping
        their numbers; those not above :attr:`last_seq` are skipped."""
        with self._lock:
            for e in events:
                if e.seq > self._last:
                    self._ring_for(e.kind).append((e.seq, e.time_unix, e.kind, e.name,
                                                   e.graph_hash, e.detail, e.location, e.value))
                    self._last = e.seq
            self._next_seq = self._last + 1

    @property
    def last_seq(self) -> int:
        return self._last

    def since(self, seq: int, limit: int | None = None) -> tuple[tuple[Event, ...], int]:
        """Events with ``seq`` greater than the given one, in order, and how
        many of those the rings already dropped. ``limit`` keeps the newest
        ones, rare kinds first (see the module docstring)."""
        self.before_read()
        with self._lock:  # a consistent pair of copies, made in C
            frequent, notable, last = list(self._frequent), list(self._notable), self._last
        # Nothing appended since the same question was last asked (a watcher
        # polling an idle program, many clients asking for everything): the
        # same answer, without searching and building again.
        state = (len(frequent), frequent[-1][0] if frequent else 0,
                 len(notable), notable[-1][0] if notable else 0)
        memo = self._memo
        if memo[0] != state:
            memo = self._memo = (state, {})
        answer = memo[1].get((seq, limit))
        if answer is not None:
            return answer  # immutable: shared by everyone who asks the same
        part_f = frequent[bisect.bisect_right(frequent, seq, key=_seq_of):]
        part_n = notable[bisect.bisect_right(notable, seq, key=_seq_of):]
        # Numbers run 1..last without gaps, so what is not in a ring was dropped.
        dropped = max(0, last - seq - len(part_f) - len(part_n))
        if limit is not None and len(part_f) + len(part_n) > limit:
            part_n = part_n[-limit:] if limit else []
            room = limit - len(part_n)
            part_f = part_f[-room:] if room else []
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
        if len(memo[1]) < 8:  # a few distinct questions per state
            memo[1][(seq, limit)] = answer
        return answer

    def clear(self) -> None:
        with self._lock:
            self._frequent.clear()
            self._notable.clear()
        self._built = {}
        self._memo = ((-1,), {})
