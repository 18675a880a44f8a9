"""``metrics.track`` for JAX: count and time calls of a jitted function and
attribute each to the graph it ran.

Example:
    >>> import jax, metrics
    >>> step = metrics.track(jax.jit(lambda x: x + 1))   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from metrics.engines import jax as engine_module
from metrics.journal import FOLD_AT


class Tracked:
    """State of one function wrapped by :func:`metrics.track`."""

    __slots__ = ("name", "graphs", "last_hash", "compiles")

    def __init__(self, name: str) -> None:
        self.name = name
        self.graphs: dict[tuple[Any, ...], str] = {}
        self.last_hash: str | None = None
        self.compiles = 0  # seen during its calls; from two on, calls carry a key


def track(fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """Wraps ``fn`` so each call counts as an execution of the graph it ran.

    A call costs two clock reads and one journal write. While the function has one
    graph, calls are attributed to it; once it has compiled twice, each call
    also records the shapes and dtypes of its top-level arguments, which pick
    the graph (a call that compiled teaches the mapping).
    """
    owner = Tracked(name or f"jit({getattr(fn, '__name__', 'fn')})")

    clock, seqs, tls = time.monotonic_ns, engine_module._compile_seq, engine_module._tls
    fold_at = FOLD_AT * engine_module.CALL_FIELDS

    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        eng = engine_module._active
        if eng is None:
            return fn(*args, **kwargs)
        seq = seqs[0]
        start = clock()
        out = fn(*args, **kwargs) if kwargs else fn(*args)
        end = clock()
        compiled = None
        if seqs[0] != seq:
            last = getattr(tls, "last_compile", None)
            if last is not None and last[0] > seq:
                compiled = last[1]
                owner.compiles += 1
        key = None
        if compiled is not None or owner.compiles > 1:
            key = tuple((getattr(a, "shape", None), getattr(a, "dtype", None)) for a in args)
        q = eng.calls_queue
        q.extend((owner, key, start, end, compiled))  # fields: see engine_module.CALL_FIELDS
        if len(q) >= fold_at:
            eng.calls.flush()
        return out

    return tracked
