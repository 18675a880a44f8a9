"""A second kind of periodic work told apart inside the gaps one line leads
(engine-agnostic: JAX's :mod:`~metrics.engines.jax.gap_sites`, torch's
:mod:`~metrics.engines.torch.gaps`).

A gap is charged to the line that led it. Work of a longer period that falls
in the same gaps (a test-sheet image every 500 steps inside the accuracy
every 10; nGPT's generation every 50 steps after its validation every 10)
would be the lead's: its time averaged over the lead's gaps (the accuracy
said as 16 ms every 10 steps where it took 5 ms, the 1.5 s sheets unsaid;
the validation's 50 ms said as 2.2 s each). A gap :data:`RARE_FACTOR` times
its lead's usual own time (the median of its latest gaps), holding a line
that fewer than half of the lead's gaps held, is split: the lead keeps its
usual time, the line with the most records of those new ones gets the
rest, a gap of its own.

Example:
    >>> r = RareWork()
    >>> [r.part(5_000_000, {"val": 1}, "val", gaps) for gaps in range(3)]
    [None, None, None]
    >>> r.part(900_000_000, {"val": 1, "gen": 1}, "val", 3)
    ('gen', 895000000)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)  # a line's key: the engine's own

RARE_AFTER = 3  # the lead's own gaps known before one can be told apart
RARE_FACTOR = 4  # a gap this many times the lead's usual holds other work...
RARE_MIN_NS = 5_000_000  # ... of at least this much
KEYS_KEPT = 64  # lines the lead's gaps held, counted
RECENT = 15  # the lead's latest own gap times its usual is the median of


class RareWork:
    """One lead's latest own gap times and the lines its gaps held."""

    __slots__ = ("recent", "keys")

    def __init__(self) -> None:
        self.recent: deque[int] = deque(maxlen=RECENT)  # its latest gaps' own ns, as lead
        self.keys: dict[Hashable, int] = {}  # line key -> gaps it led that held it

    def part(self, own: int, counts: dict[K, int], lead_key: K,
             gaps: int) -> tuple[K, int] | None:
        """``(line key, ns)`` of other work inside a gap the lead led (its
        ``gaps``-th before this one) whose own time is ``own`` and lines
        ``counts`` (records each); None where the gap is one of its usual
        ones (then learnt as such)."""
        keys, led = self.keys, len(self.recent)
        for k in counts:
            if k in keys or len(keys) < KEYS_KEPT:
                keys[k] = keys.get(k, 0) + 1
        usual = sorted(self.recent)[led // 2] if led >= RARE_AFTER else None
        if usual is not None and own > RARE_FACTOR * usual + RARE_MIN_NS:
            rare = [k for k in counts if k != lead_key and 2 * keys.get(k, 0) <= gaps + 1]
            if rare:
                return max(rare, key=counts.__getitem__), own - usual
        self.recent.append(own)
        return None
