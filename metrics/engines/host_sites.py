"""The read-time half of :mod:`metrics.engines.host_lines`: its lines as
``host_work`` readings (:func:`work_sites`), and the median per interval
they stand on.

Example:
    >>> median_ns([(0, 10), (1, 30), (2, 20)], 3)
    20
"""

from __future__ import annotations

import os
from types import CodeType
from typing import Any

from metrics.engines._frames import via_words
from tpu_info.contract.model import Phase, SiteKind, SiteReading

CALLEE_SHARE = 0.2  # of a line's time, for a call to be named in its detail
KEEP = 64  # intervals a line's median stands on, at most (the latest)


def work_sites(lines: Any, mono_to_unix: float) -> list[SiteReading]:
    """One ``host_work`` reading per line of ``lines`` (a
    :class:`~metrics.engines.host_lines.HostLines`) with time in at least
    half the latest sampled intervals (its module's docstring says how)."""
    from metrics.engines.generators import in_generator

    n = lines.intervals  # (the training thread adds to the lines before it counts)
    # (torch's intervals, from an optimizer's step to the next, hold nearly all
    # of the step; JAX's leave out the step's call, so no share of them is one
    # of the step)
    lengths = dict(list(getattr(lines, "lengths", ()))) if getattr(lines, "loops", False) else {}
    rows = [(r.code, r.line, median_ns(list(r.recent), n), r.intervals, r.ns,
             list(r.callees.items()), median_share(list(r.recent), lengths, n))
            for r in list(lines.lines.values())]
    first, last = lines.first, lines.last
    if not n:
        return []
    out = []
    for code, line, median, intervals, total, callees, share in rows:
        if median <= 0:  # in fewer than half the latest intervals: no step's work
            continue
        path, function = where(code)
        # What most of the line's time went into (not a library's private
        # helper: numpy's dispatchers).
        top = sorted(((_words(c), t) for c, t in callees
                      if t >= CALLEE_SHARE * total
                      and not _words(c).rsplit(" ", 1)[-1].rsplit(".", 1)[-1]
                      .startswith("_")), key=lambda kv: -kv[1])
        out.append(SiteReading(
            kind=SiteKind.HOST_WORK.value, location=f"{path.rsplit(':', 1)[0]}:{line}",
            count=intervals, seconds=median * n / 1e9, function=function,
            detail=", ".join(dict.fromkeys(name for name, _ in top[:4])),
            first_seen_unix=first / 1e9 + mono_to_unix,
            last_seen_unix=last / 1e9 + mono_to_unix,
            phase=Phase.STEP.value, occurrences=intervals, timed=n,
            in_generator=in_generator(code), interval_share=share))
    return out


def where(code: CodeType) -> tuple[str, str]:
    """``("/abs/file.py:FIRSTLINE", function)`` of a code object (read time)."""
    path = code.co_filename
    if not path.startswith("<"):
        path = os.path.abspath(path)
    return f"{path}:{code.co_firstlineno}", getattr(code, "co_qualname", code.co_name)


def median_ns(recent: list[tuple[int, int]], n: int) -> int:
    """The median ns a line took per interval over the latest ``KEEP`` of the
    ``n`` intervals (0 in those it had no time in): robust to an interval a
    collection or the OS stretched.

    >>> median_ns([(0, 10), (1, 30), (2, 20)], 3), median_ns([(2, 20)], 3)
    (20, 0)
    """
    since = max(0, n - KEEP)
    values = sorted(ns for i, ns in recent if i >= since)
    values = [0] * (min(n, KEEP) - len(values)) + values
    if not values:
        return 0
    m = len(values)
    return values[m // 2] if m % 2 else (values[m // 2 - 1] + values[m // 2]) // 2


def median_share(recent: list[tuple[int, int]], lengths: dict[int, int],
                 n: int) -> float | None:
    """The median share of its interval's wall time a line took over the
    latest ``KEEP`` of the ``n`` intervals (0 in those it had no time in);
    None where the intervals' lengths are not all known.

    >>> median_share([(0, 10), (2, 50)], {0: 100, 1: 100, 2: 100}, 3)
    0.1
    """
    since = max(0, n - KEEP)
    known = [i for i in range(since, n) if i in lengths]
    if not known or len(known) < min(n, KEEP):
        return None
    took = {i: ns for i, ns in recent if i >= since}
    values = sorted(took.get(i, 0) / lengths[i] for i in known)
    m = len(values)
    return values[m // 2] if m % 2 else (values[m // 2 - 1] + values[m // 2]) / 2


def _words(callee: str | CodeType) -> str:
    """A callee in a few words: a C function's qualified name
    (``RandomState.choice``), a library's function (``numpy stack``)."""
    return via_words(callee) if isinstance(callee, CodeType) else str(callee)
