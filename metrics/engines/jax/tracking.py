"""``metrics.track`` for JAX: count and time calls of a jitted function and
attribute each to the graph it ran.

It goes through the counting wrappers' public seam only
(:func:`metrics.engines.jax.calls.counting`, :func:`metrics.engines.jax.aot.adopt`)
with the context it is given, never the engine.

Example:
    >>> import jax, metrics
    >>> step = metrics.track(jax.jit(lambda x: x + 1))   # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar, cast

from metrics.engines.jax import aot as jax_aot
from metrics.engines.jax.calls import Owner, counting
from metrics.engines.jax.context import JaxContext

if TYPE_CHECKING:
    from jax.stages import Compiled

P = ParamSpec("P")
R = TypeVar("R")


class Tracked(Owner):
    """State of one function wrapped by :func:`metrics.track`: the user named
    it, so it is the step where the hook would otherwise infer one."""

    __slots__ = ()
    explicit = True


def track(fn: Callable[P, R], context: JaxContext, name: str | None = None) -> Callable[P, R]:
    """Wraps ``fn`` so each call counts as an execution of the graph it ran.

    A call costs one journal write, and two clock reads on the calls it
    times: its first 64, then one in 16 (see
    :func:`metrics.engines.jax.calls.counting`). A function the hook already
    counts is counted once: one jitted after install is unwrapped first; an
    AOT-compiled one (``f.lower(x).compile()``) is returned as it is, its
    calls counted as tracked by the hook on ``Compiled.__call__``.
    """
    fn = getattr(fn, "_tpu_info_jitted", fn)
    if jax_aot.counts(fn):
        compiled = cast("Compiled", fn)
        owner = Tracked(name or jax_aot.owner_of(compiled, context).name)
        return cast("Callable[P, R]", jax_aot.adopt(compiled, owner, context))
    owner = Tracked(name or f"jit({getattr(fn, '__name__', 'fn')})")
    return cast("Callable[P, R]", functools.wraps(fn)(counting(fn, owner, context)))
