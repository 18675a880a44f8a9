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
    >>> "counters" in gens.compare("a", g, s).unchanged
    True
    >>> gens.compare("restarted", g, s) is None
    True
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tpu_info.contract.errors import WireError
from tpu_info.contract.model import TRANSFER_KINDS, Event, EventKind, Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.codec import MAX_DISTRIBUTIONS, MAX_GRAPHS, DecodeCache
from tpu_info.wire.decoding import MAX_NOTES, Decoding, text
from tpu_info.wire.fillers import Stamp

__all__ = ["PARTS", "Follower", "Generations", "Stamp", "merge_events", "stamp_of"]

# The parts an answer may leave out, by Snapshot field (and tpu_info.v1
# field) name, and what stands in their place on the wire.
PARTS: tuple[str, ...] = ("process", "devices", "counters", "distributions", "graphs",
                          "sites", "steps", "blind_spots")
_EMPTY: dict[str, Any] = {"process": None, "steps": None}
_parts_of = operator.attrgetter(*PARTS)
# Parts sent record by record, and each record's key (unique within the part).
KEYED: dict[str, Callable[[Any], str]] = {"graphs": operator.attrgetter("hash"),
                                           "distributions": operator.attrgetter("name")}
KEYED_BOUNDS = {"graphs": MAX_GRAPHS, "distributions": MAX_DISTRIBUTIONS}  # as decoded

GENERATIONS_KEPT = 32  # answers a cursor may name (builds live 50 ms: 1.6 s at a flood)
EVENTS_KEPT = 1_000  # events a whole snapshot holds (the hook's answers: 1,000)
# The flood kinds (as the hook's event rings: metrics.recording.events.FREQUENT).
FREQUENT_KINDS = frozenset({EventKind.STEP}) | TRANSFER_KINDS
MAX_INSTANCE = 64  # characters of a server's instance id (the hook's: 16)
MAX_UNCHANGED = 64  # names of parts left out (the hook has 8)
MAX_KEYS = 4_096  # records of a part sent record by record (as the decoder's bounds)


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
        self.instance = instance or os.urandom(8).hex()  # as secrets.token_hex(8), without hmac
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

    def compare(self, instance: str, generation: int, s: Snapshot) -> Stamp | None:
        """What ``s`` shares with the cursor's generation: the parts equal to
        its (``unchanged``), and of the other keyed parts those records that
        are the very same objects (``kept``: only the others are sent). No
        part is shared when this server no longer holds the generation;
        None when the cursor is another instance's (its event numbers mean
        nothing here either). The stamp's generation is left 0."""
        if instance != self.instance:
            return None
        held = self._held.get(generation)
        if held is None:
            return Stamp(self.instance)
        unchanged, kept = [], []
        for name, a, b in zip(PARTS, held, _parts_of(s), strict=True):
            if _same(a, b):
                unchanged.append(name)
            elif name in KEYED and a and b:
                ids = set(map(id, a))  # alive: ``held`` holds them
                sent = tuple(i for i, r in enumerate(b) if id(r) not in ids)
                if len(sent) < len(b):
                    kept.append((name, tuple(map(KEYED[name], b)), sent))
        return Stamp(self.instance, 0, tuple(unchanged), tuple(kept))

    def answer(self, s: Snapshot, generation: int, shared: Stamp | None,
               **replace: Any) -> tuple[Snapshot, Stamp]:
        """``s`` as sent (the parts ``shared`` names unchanged left out,
        ``replace``'s fields replaced) and its stamp at ``generation``."""
        if shared is None:
            return dataclasses.replace(s, **replace), Stamp(self.instance, generation)
        gone = {name: _EMPTY.get(name, ()) for name in shared.unchanged}
        return (dataclasses.replace(s, **gone, **replace),
                shared._replace(generation=generation))


def stamp_of(m: pb.Snapshot, dec: Decoding | None = None) -> Stamp:
    """The stamp of an answer from the wire, bounded and cleaned (an older
    server's: empty)."""
    dec = dec or Decoding()
    kept = tuple((text(k.part), tuple(dec.bounded(k.keys, MAX_KEYS, "kept keys")), ())
                 for k in dec.bounded(m.kept, MAX_UNCHANGED, "kept"))
    return Stamp(text(m.instance[:MAX_INSTANCE]), m.generation,
                 dec.strings(m.unchanged, MAX_UNCHANGED, "unchanged"), kept)


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
            for name, keys, _ in stamp.kept:
                if name in KEYED and name not in fill:
                    fill[name] = _assemble(keys, getattr(base, name), getattr(answer, name),
                                           KEYED[name], KEYED_BOUNDS[name])
            notes = answer.left_out
            if fill and base.left_out:  # the kept parts' reasons still hold
                notes = tuple(dict.fromkeys(notes + base.left_out))[:MAX_NOTES]
            whole = dataclasses.replace(answer, **fill, left_out=notes,
                                        events=merge_events(base.events, answer.events))
        elif stamp.unchanged or stamp.kept:
            self.held = None
            left = stamp.unchanged + tuple(k[0] for k in stamp.kept)
            raise WireError(f"the answer leaves out {', '.join(left[:8])}, which this client "
                            "does not hold from that server")
        elif len(whole.events) > EVENTS_KEPT:
            whole = dataclasses.replace(whole, events=merge_events((), whole.events))
        self.held = (whole, stamp) if stamp.instance else None  # an older server: no cursor
        return whole


def _assemble(keys: tuple[str, ...], held: tuple[Any, ...], sent: tuple[Any, ...],
              key: Callable[[Any], str], bound: int) -> tuple[Any, ...]:
    """A part sent record by record: for each key in order, the record this
    answer carries, else the reader's (a key neither has is a record this
    reader kept out when it came, with its reason: left out again)."""
    if len(held) == len(keys) and tuple(map(key, held)) == keys:
        # The usual case: the same records in the same order, a few changed.
        out = list(held)
        try:
            for r in sent:
                out[keys.index(key(r))] = r
            return tuple(out)
        except ValueError:  # a new key: assembled below
            pass
    keys = tuple(dict.fromkeys(keys))[:bound]  # a stranger's list: no record twice, bounded
    by_key = dict(zip(map(key, held), held, strict=True))
    by_key.update(zip(map(key, sent), sent, strict=True))
    return tuple(r for r in map(by_key.get, keys) if r is not None)
