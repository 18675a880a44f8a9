"""What one site did in the step's gaps (:mod:`~metrics.engines.jax.gaps`),
and a second kind of periodic work told apart inside them.

A gap is charged to the line that led it (an evaluation's call, else a
``device_get``, else a read). Work of a longer period that falls in the same
gaps (a test-sheet image every 500 steps inside the accuracy every 10) would
be the lead's: its time averaged over the lead's gaps (ais_vizmetrics,
evaluation of JAX programs s11: the accuracy said as 16 ms every 10 steps
where it took 5 ms, the 1.5 s sheets unsaid). A gap :data:`RARE_FACTOR`
times its lead's usual own time (the median of its latest gaps), holding a
line that fewer than half of the lead's gaps held, is split: the lead keeps its usual
time, the line with the most records of those new ones gets the rest, a gap
of its own. No JAX, no numpy (fold time, in the hook's process)."""

from __future__ import annotations

from collections import deque
from typing import Any

RARE_AFTER = 3  # the lead's own gaps known before one can be told apart
RARE_FACTOR = 4  # a gap this many times the lead's usual holds other work...
RARE_MIN_NS = 5_000_000  # ... of at least this much
KEYS_KEPT = 64  # lines the lead's gaps held, counted
RECENT = 15  # the lead's latest own gap times its usual is the median of


class GapSite:
    """What one site (a ``_Site`` of the transfer hook) did in gaps."""

    __slots__ = ("gap_ns", "gaps", "unseen", "work", "within", "pending", "recent", "keys")

    def __init__(self) -> None:
        self.gap_ns = 0
        # Gaps that sent device work before their first wait, closed before the
        # step's device time was measured: costed when read (settled_ns).
        self.pending: list[tuple[int, int, int, int, int, int, int]] = []
        self.gaps = 0
        self.unseen = 0  # gaps whose read waited for device work sent in them, unseen
        self.work = ""
        self.within: Any = None  # the _Site whose gaps it sat in (not its own)
        self.recent: deque[int] = deque(maxlen=RECENT)  # its latest gaps' own ns, as lead
        self.keys: dict[Any, int] = {}  # record key -> gaps it led that held it

    def rare_part(self, own: int, counts: dict[Any, int],
                  lead_key: Any) -> tuple[Any, int] | None:
        """``(record key, ns)`` of other work inside a gap this site led whose own
        time is ``own`` and records ``counts`` (see the module's words); None
        where the gap is one of its usual ones (then learnt as such)."""
        keys, led = self.keys, len(self.recent)
        for k in counts:
            if k in keys or len(keys) < KEYS_KEPT:
                keys[k] = keys.get(k, 0) + 1
        usual = sorted(self.recent)[led // 2] if led >= RARE_AFTER else None
        if usual is not None and own > RARE_FACTOR * usual + RARE_MIN_NS:
            rare = [k for k in counts if k != lead_key and 2 * keys.get(k, 0) <= self.gaps + 1]
            if rare:
                return max(rare, key=counts.__getitem__), own - usual
        self.recent.append(own)
        return None
