"""A function's recompiles as the findings group and cost them: each its own
compile's time (:func:`own_seconds`), a function "re-created" once taken
for another function passed (:func:`recreated_once`), and how severe
(:func:`recompile_severity`).

Example:
    >>> from tpu_info.contract.model import RecompileCause
    >>> own_seconds([RecompileCause(0.0, "x", seconds=0.5), RecompileCause(1.0, "y", seconds=0.25)])
    0.75
    >>> own_seconds([RecompileCause(0.0, "x")]) is None
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import RecompileCause, Severity
from tpu_info.views.causes import ADVICE
from tpu_info.views.cost import Cost, outside_warns

G = TypeVar("G")


def own_seconds(causes: Iterable[RecompileCause]) -> float | None:
    """What these recompiles took, each its own compile's time as the hook
    measured it at the compile (``RecompileCause.seconds``); None when one of
    them does not say (an older hook, an engine that does not time each)."""
    times = [c.seconds for c in causes]
    return None if None in times else sum(t or 0.0 for t in times)


def recreated_once(kinds: dict[str, list[tuple[RecompileCause, G]]],
                   ) -> dict[str, list[tuple[RecompileCause, G]]]:
    """Causes grouped by kind name, with a function "re-created" only once
    taken for another function passed: two different functions of one name
    (two lambdas, each made once) read the same without their addresses;
    only the same change again (a function made anew on each call) says the
    same function was re-created."""
    again = kinds.get(ADVICE[CauseKind.FUNCTION_RECREATED][0])
    if again is None or len(again) != 1:
        return kinds
    [(c, g)] = again
    out = {k: v for k, v in kinds.items() if v is not again}
    out.setdefault(ADVICE[CauseKind.STATIC_FUNCTION][0], []).append(
        (replace(c, kind=CauseKind.STATIC_FUNCTION), g))
    return out


def recompile_severity(c: Cost, expected: bool) -> Severity:
    """A recompile's severity (and a compile for each new shape's): info when
    expected, or when it happened outside the step and does not weigh on the
    run (:func:`~tpu_info.views.cost.outside_warns`)."""
    if expected or (c.outside_step and not outside_warns(c)):
        return Severity.INFO
    return Severity.WARNING
