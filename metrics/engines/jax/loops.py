"""The user's line that put most of a traced graph's operations into it: a
Python loop unrolled into the jitted function (``for i in range(100):
out.append(x[i].T)`` traces 100 slices and transposes at one line), which a
slow compile's advice can then name (vectorize it, or ``lax.fori_loop`` /
``lax.scan``), instead of only "a large graph".

Read at lowering, once per compile (never on a call): each top-level
equation's user frame from its source info (~0.6 us an equation on the CPU
here; at most :data:`MAX_EQUATIONS` looked at, evenly spread).

Example:
    >>> loop_line(jax.make_jaxpr(f)(x).jaxpr)                # doctest: +SKIP
    ('/w/train.py:66', 400)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

MAX_EQUATIONS = 20_000  # looked at per graph (a larger one: every n-th)
LOOP_OPS = 64  # operations from one line before it counts as a loop...
LOOP_SHARE = 0.25  # ...that are at least this share of the graph's


def loop_line(jaxpr: Any) -> tuple[str, int] | None:
    """(``file:line``, its operations) of the user's line that put the most
    top-level operations into ``jaxpr``, when they are at least LOOP_OPS and
    LOOP_SHARE of them; None otherwise."""
    from jax._src import source_info_util

    eqns = jaxpr.eqns
    total = len(eqns)
    if total < LOOP_OPS:
        return None
    stride = max(1, total // MAX_EQUATIONS)
    lines: Counter[tuple[str, int]] = Counter()
    for e in eqns[::stride]:
        frame = source_info_util.user_frame(e.source_info.traceback)
        if frame is not None:
            lines[(frame.file_name, frame.start_line)] += 1
    if not lines:
        return None
    (path, line), seen = lines.most_common(1)[0]
    ops = seen * stride
    if ops < LOOP_OPS or ops < LOOP_SHARE * total:
        return None
    return f"{path}:{line}", ops
