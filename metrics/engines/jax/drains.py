"""What a device->host read cost: the drain it caused, not the queue it waited for.

A read (``float(loss)``, ``print(loss)``, ``jax.device_get``) waits until the
device has run everything queued before it. That wait holds the device's own
work, which runs whether or not the host waits: the steps, an evaluation
dispatched just before. What the read itself costs is the overlap it
prevents: while the host waited, it could not run its own Python ahead of the
device, so after the read the device idles for as long as the host takes to
queue the next work. That is at most the host's own time between the
previous wait and this one (the work the device could have overlapped), and
at most the wait (a read of a value already computed drains nothing).

So each read's drain is ``min(wait, host time since the previous read's end)``,
folded per site beside its wait, off the hot path (at fold time, from the
records' start and end the hot path already keeps). ``wait - drain`` is the
device's queued work: it belongs to the graphs that ran (the steps, an
evaluation), never to the line that waited.

A print every 20 steps of a device-bound loop: it waits ~20 steps' device
time and drains ~the host's 20 dispatches; a ``float(loss)`` every step of
a host-bound loop drains its whole (short) wait.

Example:
    >>> from metrics.engines.jax.drains import drains
    >>> drains([0, 5], [10, 40], [20, 60], last_end=0)   # (kinds, starts, ends)
    ([10, 20], 60)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from metrics.engines.jax.sites import SYNC
from metrics.engines.jax.startup import take_out

EXPLICIT_D2H = 2  # implicit.EXPLICIT_D2H (a jax.device_get's leaf): a wait too
_WAITS = (SYNC, EXPLICIT_D2H)


def drains(kinds: Sequence[int], starts: Sequence[int], ends: Sequence[int],
           last_end: int) -> tuple[list[int], int]:
    """Per record (``-1`` for a record that is no wait), its drain in ns,
    given the end of the latest wait before them (``last_end``); and the
    latest wait's end after them. Records are in the order they happened."""
    out = [-1] * len(kinds)
    for i, k in enumerate(kinds):
        if k in _WAITS:
            s, e = starts[i], ends[i]
            out[i] = max(0, min(e - s, s - last_end))
            last_end = max(last_end, e)
    return out, last_end


class Drains:
    """Folds each read's drain into its site (``_Site.drain_ns``) after the
    site table's own fold; ``fold`` is the journal's fold function."""

    __slots__ = ("impl", "last_end", "fields")

    def __init__(self, impl: Any, now_ns: int, fields: int) -> None:
        self.impl, self.fields = impl, fields  # fields: implicit.FIELDS a record
        self.last_end = now_ns  # no wait before the hook: the host's time counts from here

    @classmethod
    def around(cls, impl: Any, fields: int) -> Callable[[list[Any]], None]:
        """The journal's fold for ``impl`` (an ``ImplicitTransfers``, records of
        ``fields`` values): its own fold, then the drains."""
        import time

        impl.drains = d = cls(impl, time.monotonic_ns(), fields)  # type: ignore[attr-defined]
        return d.fold

    def fold(self, flat: list[Any]) -> None:
        impl = self.impl
        take_out(flat, self.fields, 4, 5, impl.context.startups)  # opening the device: apart
        impl._fold(flat)
        w = self.fields
        kinds = flat[0::w]
        if SYNC not in kinds and EXPLICIT_D2H not in kinds:
            return
        per, self.last_end = drains(kinds, flat[4::w], flat[5::w], self.last_end)
        sums: dict[tuple[int, int], int] = {}
        codes, offsets = flat[1::w], flat[2::w]
        for i, ns in enumerate(per):
            if ns >= 0 and kinds[i] == SYNC:
                key = (id(codes[i]), offsets[i])
                sums[key] = sums.get(key, 0) + ns
        with impl._lock:
            for (code, offset), ns in sums.items():
                site = impl._sites.get((SYNC, code, offset)) or impl._other.get(SYNC)
                if site is not None:
                    site.drain_ns += ns
