"""Decoding one reply from the wire: cleaned strings, values kept out with
their reasons, and the deadline a decode must meet.

Shared by :mod:`tpu_info.wire.codec` and its section codecs
(:mod:`tpu_info.wire.sites`).

Example:
    >>> dec = Decoding()
    >>> dec.num(float("nan"), "counter 'x'") is None, dec.summary()[0][0]
    (True, "counter 'x'")
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from tpu_info.contract.errors import TimedOut
from tpu_info.contract.safe import MAX_WIRE_TEXT, clean

T = TypeVar("T")

MAX_NOTES = 64  # left_out reasons kept per snapshot
MAX_UNIX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last second datetime shows


def text(value: str) -> str:
    """A string from the wire, cleaned (:func:`tpu_info.contract.safe.clean`)."""
    if len(value) <= MAX_WIRE_TEXT and value.isprintable():  # most strings, at C speed
        return value
    return clean(value, MAX_WIRE_TEXT)


def _at(where: str, field: str) -> str:
    return f"{where} {field}" if field else where


class Decoding:
    """One reply being decoded: the reasons for what was kept out, and the
    deadline the decode must meet.

    Args:
        deadline: ``time.monotonic()`` by which decoding must end (None: none).
        seconds: the whole allowance, for the error message.
    """

    __slots__ = ("deadline", "notes", "seconds")

    def __init__(self, deadline: float | None = None, seconds: float | None = None) -> None:
        self.deadline = deadline
        self.seconds = seconds
        self.notes: list[tuple[str, str]] = []

    def left_out(self, where: str, why: str) -> None:
        """Records that a value at ``where`` was kept out, and why."""
        self.notes.append((where, why))

    def check(self) -> None:
        """Raises :class:`TimedOut` when the deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            within = f" within {self.seconds:.3g}s" if self.seconds is not None else ""
            raise TimedOut(f"the reply could not be decoded{within} (too large)")

    # ``where`` and ``field`` name a value; they are joined only when it is kept out.

    def num(self, value: float, where: str, field: str = "") -> float | None:
        """``value`` if finite, else None with the reason kept."""
        if math.isfinite(value):
            return value
        self.left_out(_at(where, field), f"not a finite number ({value!r}); shown as N/A")
        return None

    def num0(self, value: float, where: str, field: str = "") -> float:
        """``value`` if finite, else 0.0 with the reason kept."""
        if math.isfinite(value):
            return value
        self.left_out(_at(where, field), f"not a finite number ({value!r}); shown as 0")
        return 0.0

    def when(self, value: float, where: str, field: str = "") -> float:
        """A unix time: ``value`` if a clock can show it (years 1970 to 9999),
        else 0.0 with the reason kept."""
        if 0.0 <= value <= MAX_UNIX_TIME:  # False for NaN too
            return value
        self.left_out(_at(where, field), f"not a time ({value!r}); shown as 0")
        return 0.0

    def opt(self, m: Any, field: str, where: str) -> float | None:
        """An ``optional double`` field: None when unset or not finite."""
        return self.num(getattr(m, field), where, field) if m.HasField(field) else None

    def bounded(self, items: Sequence[T], bound: int, where: str, field: str = "",
                newest: bool = False) -> Sequence[T]:
        """The first (or, with ``newest``, the last) ``bound`` of ``items``."""
        n = len(items)
        if n <= bound:
            return items
        self.left_out(_at(where, field), f"the target sent {n:,}, more than the {bound:,} a "
                      f"real program sends; the {'last' if newest else 'first'} {bound:,} "
                      "are kept")
        return items[n - bound:] if newest else items[:bound]

    def strings(self, items: Sequence[str], bound: int, where: str,
                field: str = "") -> tuple[str, ...]:
        """The first ``bound`` strings of ``items``, cleaned."""
        return tuple(map(text, self.bounded(items, bound, where, field)))

    def summary(self) -> tuple[tuple[str, str], ...]:
        """The reasons, at most :data:`MAX_NOTES` of them."""
        notes = list(dict.fromkeys(self.notes))
        if len(notes) > MAX_NOTES:
            more = len(notes) - MAX_NOTES + 1
            notes = notes[: MAX_NOTES - 1] + [("snapshot", f"{more:,} more values kept out")]
        return tuple(notes)
