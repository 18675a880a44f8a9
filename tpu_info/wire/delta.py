"""Answers that repeat nothing the reader has: cursors, both sides.

A reader that passes its cursor (``tpu_info.v1.Cursor``: the server's
instance and the generation of the answer whose parts it holds, with
``events_since`` its last event) gets only the events after it and none of
the parts that did not change since that generation; the answer names the
parts it left out (``Snapshot.unchanged``).

* The server side, :class:`Generations`: the parts of the server's recent
  answers by generation, and which of them a new answer shares with a
  cursor's. Unchanged records are the very same objects
  (:mod:`tpu_info.contract.reuse`), so comparing a part costs one identity
  test per record; other records compare by value (equal is unchanged too).
  A cursor of another instance (the server restarted) or of a generation
  the server no longer holds gets a full answer.
* The reader side, :class:`Follower`: one source's last whole snapshot; an
  answer is decoded (only its new events and changed parts: nothing the
  reader has is decoded again) and merged into it, so callers still get
  whole :class:`~tpu_info.contract.model.Snapshot` objects.

The cursor is not part of the model: :class:`Stamp` says what one answer
is (instance, generation, parts left out), on the wire and in the
:class:`Follower`, never in a :class:`~tpu_info.contract.model.Snapshot`.

Example:
    >>> from tpu_info.contract.model import CounterReading, Snapshot
    >>> gens = Generations(instance="a")
    >>> s = Snapshot(taken_at_unix=1.0, counters=(CounterReading("MarkStep", 3),))
    >>> g = gens.add(s)
    >>> "counters" in gens.unchanged("a", g, s)
    True
    >>> gens.unchanged("restarted", g, s) is None
    True
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
import secrets
from collections import OrderedDict
from typing import Any

from tpu_info.contract.errors import WireError
from tpu_info.contract.model import TRANSFER_KINDS, Event, EventKind, Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.codec import DecodeCache
from tpu_info.wire.decoding import MAX_NOTES, Decoding, text
from tpu_info.wire.fillers import Stamp

__all__ = ["PARTS", "Follower", "Generations", "Stamp", "merge_events", "stamp_of"]

# The parts an answer may leave out, by Snapshot field (and tpu_info.v1
# field) name, and what stands in their place on the wire.
PARTS: tuple[str, ...] = ("process", "devices", "counters", "distributions", "graphs",
                          "sites", "steps", "blind_spots")
_EMPTY: dict[str, Any] = {"process": None, "steps": None}
_parts_of = operator.attrgetter(*PARTS)

GENERATIONS_KEPT = 32  # answers a cursor may name (builds live 50 ms: 1.6 s at a flood)
EVENTS_KEPT = 1_000  # events a whole snapshot holds (the hook's answers: 1,000)
# The flood kinds (as the hook's event rings: metrics.recording.events.FREQUENT).
FREQUENT_KINDS = frozenset({EventKind.STEP}) | TRANSFER_KINDS
MAX_INSTANCE = 64  # characters of a server's instance id (the hook's: 16)
MAX_UNCHANGED = 64  # names of parts left out (the hook has 8)


def _same(a: Any, b: Any) -> bool:
    # Tuples compare element by element with an identity test first (in C):
    # the reuse rule makes that the common case.
    return a is b or a == b


class Generations:
    """The server side: the parts of recent answers, by generation.

    Not locked: the server calls it under its build lock.

    Args:
        instance: this server's id (default: random, new at each start).
        keep: generations a cursor may name.
    """

    __slots__ = ("instance", "keep", "_held", "_numbers")

    def __init__(self, instance: str | None = None, keep: int = GENERATIONS_KEPT) -> None:
        self.instance = instance or secrets.token_hex(8)
        self.keep = keep
        self._held: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._numbers = itertools.count(1)

    def add(self, s: Snapshot) -> int:
        """Holds ``s``'s parts (references, not copies); returns their generation."""
        generation = next(self._numbers)
        self._held[generation] = _parts_of(s)
        while len(self._held) > self.keep:
            self._held.popitem(last=False)
        return generation

    def unchanged(self, instance: str, generation: int, s: Snapshot) -> tuple[str, ...] | None:
        """The parts of ``s`` equal to those of the cursor's generation; ()
        when this server no longer holds it; None when the cursor is another
        instance's (its event numbers mean nothing here either)."""
        if instance != self.instance:
            return None
        held = self._held.get(generation)
        if held is None:
            return ()
        return tuple(name for name, a, b in zip(PARTS, held, _parts_of(s), strict=True)
                     if _same(a, b))

    def answer(self, s: Snapshot, generation: int, unchanged: tuple[str, ...],
               **replace: Any) -> tuple[Snapshot, Stamp]:
        """``s`` as sent (the ``unchanged`` parts left out, ``replace``'s
        fields replaced) and its stamp."""
        gone = {name: _EMPTY.get(name, ()) for name in unchanged}
        return (dataclasses.replace(s, **gone, **replace),
                Stamp(self.instance, generation, unchanged))


def stamp_of(m: pb.Snapshot, dec: Decoding | None = None) -> Stamp:
    """The stamp of an answer from the wire, bounded and cleaned (an older
    server's: empty)."""
    dec = dec or Decoding()
    return Stamp(text(m.instance[:MAX_INSTANCE]), m.generation,
                 dec.strings(m.unchanged, MAX_UNCHANGED, "unchanged"))


def _seq(e: Event) -> int:
    return e.seq


def merge_events(held: tuple[Event, ...], new: tuple[Event, ...],
                 bound: int = EVENTS_KEPT) -> tuple[Event, ...]:
    """``held`` then those of ``new`` after them, the newest ``bound`` kept,
    rare kinds first (as the hook cuts an answer: a flood of steps never
    pushes a recompile out)."""
    if held:
        new = new[bisect.bisect_right(new, held[-1].seq, key=_seq):]
    if not new:
        return held
    events = held + new
    if len(events) <= bound:
        return events
    rare = [e for e in events if e.kind not in FREQUENT_KINDS][-bound:]
    room = bound - len(rare)
    frequent = [e for e in events if e.kind in FREQUENT_KINDS][-room:] if room else []
    return tuple(sorted(rare + frequent, key=_seq))


Held = tuple[Snapshot, Stamp]  # a reader's last whole snapshot and the stamp of its answer


class Follower:
    """The reader side: one source's decode cache and last whole snapshot.

    A client keeps one per source, between calls (fan-out rounds, exporter
    polls, a stream's messages). Shared between threads, a race costs only
    a full answer, never a wrong merge: each call takes what is held and
    puts back the whole snapshot it made.
    """

    __slots__ = ("parts", "held")

    def __init__(self) -> None:
        self.parts = DecodeCache()
        self.held: Held | None = None

    @property
    def whole(self) -> Snapshot | None:
        """The last whole snapshot, if any."""
        return self.held[0] if self.held is not None else None

    def forget(self) -> None:
        """Holds nothing: the next answer is a full one."""
        self.held = None

    def apply(self, answer: Snapshot, stamp: Stamp, held: Held | None) -> Snapshot:
        """The whole snapshot of ``answer`` (decoded from a reply to a request
        with ``held``'s cursor): the parts it left out and the events before
        it taken from ``held``. Holds the result for the next cursor.

        Raises:
            WireError: it leaves out parts ``held`` does not have (another
                instance, or an answer going back in time).
        """
        whole = answer
        if (held is not None and stamp.instance == held[1].instance
                and answer.last_seq >= held[0].last_seq):
            base = held[0]
            fill = {name: getattr(base, name) for name in stamp.unchanged if name in PARTS}
            notes = answer.left_out
            if fill and base.left_out:  # the kept parts' reasons still hold
                notes = tuple(dict.fromkeys(notes + base.left_out))[:MAX_NOTES]
            whole = dataclasses.replace(answer, **fill, left_out=notes,
                                        events=merge_events(base.events, answer.events))
        elif stamp.unchanged:
            self.held = None
            raise WireError(f"the answer leaves out {', '.join(stamp.unchanged[:8])}, which "
                            "this client does not hold from that server")
        elif len(whole.events) > EVENTS_KEPT:
            whole = dataclasses.replace(whole, events=merge_events((), whole.events))
        self.held = (whole, stamp) if stamp.instance else None  # an older server: no cursor
        return whole
