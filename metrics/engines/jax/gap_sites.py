"""What one site did in the step's gaps (:mod:`~metrics.engines.jax.gaps`),
and a second kind of periodic work told apart inside them
(:mod:`metrics.engines.rare_work`: a gap four times its lead's usual own
time, holding a line fewer than half of the lead's gaps held, is split).
No JAX, no numpy (fold time, in the hook's process)."""

from __future__ import annotations

from typing import Any

from metrics.engines.rare_work import RareWork


class GapSite:
    """What one site (a ``_Site`` of the transfer hook) did in gaps."""

    __slots__ = ("gap_ns", "gaps", "unseen", "work", "within", "pending", "rare")

    def __init__(self) -> None:
        self.gap_ns = 0
        # Gaps that sent device work before their first wait, closed before the
        # step's device time was measured: costed when read (settled_ns).
        self.pending: list[tuple[int, int, int, int, int, int, int]] = []
        self.gaps = 0
        self.unseen = 0  # gaps whose read waited for device work sent in them, unseen
        self.work = ""
        self.within: Any = None  # the _Site whose gaps it sat in (not its own)
        self.rare = RareWork()  # its latest gaps' own ns as lead, the lines they held

    def rare_part(self, own: int, counts: dict[Any, int],
                  lead_key: Any) -> tuple[Any, int] | None:
        """``(record key, ns)`` of other work inside a gap this site led whose own
        time is ``own`` and records ``counts``; None where the gap is one of
        its usual ones (:meth:`RareWork.part`)."""
        return self.rare.part(own, counts, lead_key, self.gaps)
