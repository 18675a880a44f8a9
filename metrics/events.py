"""A bounded ring of recent events with monotonic sequence numbers.

Watchers remember the last ``seq`` they saw and ask :meth:`EventLog.since`
for what came after; if the ring dropped some in between, ``since`` says how
many were lost.

Example:
    >>> log = EventLog(capacity=2)
    >>> for i in range(3):
    ...     _ = log.emit("step", value=i)
    >>> [e.seq for e in log.since(0)[0]]
    [2, 3]
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tpu_info.model import Event

_SLACK = 16  # how far out of order concurrent emitters can leave the ring


_Question = tuple[int, "int | None"]  # (since seq, limit)
_Answer = tuple[list[Event], int]  # (events, dropped)


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


class EventLog:
    """Thread-safe ring of the last ``capacity`` events."""

    def __init__(self, capacity: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self._ring: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._next_seq = 1
        self._lock = threading.Lock()
        self._built: dict[int, Event] = {}  # Events already made from ring tuples
        # Answers given since the ring last changed, by (seq, limit).
        self._memo: tuple[tuple[int, int], dict[_Question, _Answer]] = ((-1, -1), {})
        self._last = 0
        self._clock = clock
        # Called before every read: folds hot-path journals in (the recorder's).
        self.before_read: Callable[[], None] = lambda: None

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
        # rest of emit; readers build Events. The lock keeps each batch of
        # emit_many contiguous in sequence numbers and ring order.
        when = self._clock() if time_unix is None else time_unix
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            self._ring.append((seq, when, kind, name, graph_hash, detail, location, value))
            self._last = seq
        return seq

    def emit_many(
        self,
        kind: str | Iterable[str],
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
        kinds = rep(kind) if isinstance(kind, str) else kind
        vals = rep(None) if values is None else values
        with self._lock:
            first = self._next_seq
            self._next_seq = first + n
            # zip builds the rows in C: no bytecode per event.
            self._ring.extend(zip(range(first, first + n), times_unix, kinds, rep(""), rep(""),
                                  rep(""), rep(None), vals))
            self._last = first + n - 1

    @property
    def last_seq(self) -> int:
        return self._last

    def since(self, seq: int, limit: int | None = None) -> tuple[list[Event], int]:
        """Events with ``seq`` greater than the given one, and how many of
        those the ring already dropped. ``limit`` keeps the newest ones."""
        self.before_read()
        ring_view = self._ring
        # Nothing appended since the same question was last asked (a watcher
        # polling an idle program, many clients asking for the whole ring):
        # the same answer, without copying or sorting the ring again.
        state = (len(ring_view), ring_view[-1][0] if ring_view else 0)
        memo = self._memo
        if memo[0] != state:
            memo = self._memo = (state, {})
        answer = memo[1].get((seq, limit))
        if answer is not None:
            return list(answer[0]), answer[1]
        ring = list(ring_view)  # copied in C without releasing the GIL
        last = self._last
        # Sequence numbers are contiguous in the ring, give or take two
        # threads that appended in the other order than they drew numbers:
        # jump near the start, then filter and sort only the tail.
        start = min(len(ring), max(0, seq - ring[0][0] + 1 - _SLACK)) if ring else 0
        part = [t for t in ring[start:] if t[0] > seq]
        first_kept = min((t[0] for t in part[:_SLACK * 2]), default=last + 1)
        dropped = max(0, first_kept - seq - 1)
        if limit is not None and len(part) > limit + _SLACK:
            part = part[-(limit + _SLACK):]
        part.sort(key=_seq_of)
        if limit is not None and len(part) > limit:
            part = part[-limit:]
        built, made = self._built, {}
        out = []
        for t in part:
            e = built.get(t[0])
            if e is None:
                e = Event(*t)
            made[t[0]] = e
            out.append(e)
        self._built = made  # keeps only what the last reader saw
        if len(memo[1]) < 8:  # a few distinct questions per state
            memo[1][(seq, limit)] = (out, dropped)
        return list(out), dropped

    def clear(self) -> None:
        self._ring.clear()
        self._built = {}
        self._memo = ((-1, -1), {})
