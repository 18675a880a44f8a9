"""The one rule for reuse: **a record that did not change is the same object.**

Producers (a counter's reading, a distribution's reading, the graph
ledger's snapshot, the event log's answer, a decoded part of a reply) hand
out the very object they handed out before while nothing it describes
changed, and a new object as soon as anything did. Records are frozen, so
the same object always means the same contents.

Consumers may therefore keep what they derive from a record (its encoding,
its rows, its decoded form) by the record's identity, and reuse it while
the same object comes back. Both sides of the rule live here, once:

* :class:`Kept` - the producer side: the object built at a version, handed
  out again while the version (anything that changes whenever the record
  would: a count, a change counter, a state tuple) stays the same.
* :class:`ByIdentity` - the consumer side: values derived from objects,
  reused while the very same objects come back. It holds the objects, so
  no new object can take one of their ids while the value is kept.

Producers that follow the rule are tested once, together
(``tests/tpu_info/contract/test_reuse.py``): a changed record yields a new object, an
unchanged one the same.

Example:
    >>> kept = Kept()
    >>> a = kept.get(1, lambda: ["built at 1"])
    >>> kept.get(1, lambda: ["built again"]) is a
    True
    >>> memo = ByIdentity(bound=8)
    >>> record = ("frozen", 1)
    >>> memo.get((record,), lambda: len(record)), memo.get((record,), lambda: -1)
    (2, 2)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
V = TypeVar("V")

_UNSET: Any = object()


class Kept(Generic[T]):
    """The producer side: one object, built at a version, handed out again
    while the version compares equal (and only then: any change of version
    builds a new object). Not locked: callers that build under their own
    lock call it there; elsewhere a race only builds twice. A read path that
    runs per record may test ``version`` and take ``value`` in place (no
    call); it must :meth:`put` what it builds."""

    __slots__ = ("version", "value")

    def __init__(self) -> None:
        self.version: Any = _UNSET
        self.value: T | None = None

    def get(self, version: Hashable, build: Callable[[], T]) -> T:
        """The object kept at ``version``, or ``build()``'s, kept from now on."""
        if self.version is not _UNSET and self.version == version:
            return self.value  # type: ignore[return-value]
        return self.put(version, build())

    def at(self, version: Hashable) -> T | None:
        """The object kept at ``version``, or None."""
        if self.version is not _UNSET and self.version == version:
            return self.value
        return None

    def put(self, version: Hashable, value: T) -> T:
        """Keeps ``value`` as the object of ``version`` (for producers that
        learn the version while building) and returns it."""
        self.version, self.value = version, value
        return value

    def peek(self) -> T | None:
        """The object kept last (whatever its version), or None."""
        return self.value

    def forget(self) -> None:
        """Builds anew at the next :meth:`get`, whatever the version."""
        self.version, self.value = _UNSET, None


class ByIdentity(Generic[V]):
    """The consumer side: values derived from records, by the records'
    identity (the rule above makes that safe: the same record is the same
    contents). At most ``bound`` values are kept; when full, all are
    forgotten at once (a burst of new records costs one re-derivation each,
    never unbounded memory). Not locked: a race only derives twice.
    """

    __slots__ = ("bound", "_kept")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        # ids of the objects -> (the objects, held so their ids stay theirs; the value)
        self._kept: dict[tuple[int, ...], tuple[tuple[Any, ...], V]] = {}

    def get(self, objects: tuple[Any, ...], derive: Callable[[], V]) -> V:
        """``derive()``'s value for these very objects, derived once."""
        key = tuple(map(id, objects))
        hit = self._kept.get(key)
        if hit is not None:
            return hit[1]
        value = derive()
        if len(self._kept) >= self.bound:
            self._kept.clear()
        self._kept[key] = (objects, value)
        return value

    def __len__(self) -> int:
        return len(self._kept)


def each(records: tuple[Any, ...], derive: Callable[[Any], V],
         last: tuple[tuple[Any, ...], list[V]] | None) -> tuple[tuple[Any, ...], list[V]]:
    """``derive`` of every record, reusing ``last``'s value (what this gave
    for the previous round of records) for records that are the very same
    objects; returns this round, to pass as ``last`` next time. Costs in
    proportion to what changed: while the records keep their positions (the
    usual case) one identity comparison in C per record finds the changed
    ones. Only this round's records are kept, so memory follows the data.
    """
    if last is not None and len(last[0]) == len(records):
        values = list(last[1])
        for i, same in enumerate(map(operator.is_, records, last[0])):
            if not same:
                values[i] = derive(records[i])
        return records, values
    # Records added or gone: match by identity. ``last`` still holds its
    # records, so no new object can carry one of their ids.
    by_id = {id(r): v for r, v in zip(*last, strict=True)} if last is not None else {}
    out = []
    for r in records:
        v = by_id.get(id(r), _UNSET)
        out.append(derive(r) if v is _UNSET else v)
    return records, out

