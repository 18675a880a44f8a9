"""The JAX / PJRT engine adapter: what the hook records inside a JAX program.

What it offers (nothing here imports JAX until it is used):

* :func:`create`: the adapter entry point ``metrics.install()`` calls through
  :mod:`metrics.engines.registry`; returns a :class:`JaxEngine`.
* :class:`JaxEngine` (:mod:`.engine`): installs and removes the hooks and
  answers the scrape-time readings (devices, sites, steps, blind spots).
* :func:`track` (:mod:`.tracking`): ``metrics.track`` for JAX.

The parts, one concern each: compiles and their causes (:mod:`.compiles`,
:mod:`.causes`, :mod:`.explain`), counted calls (:mod:`.calls`, :mod:`.aot`,
:mod:`.executions`, :mod:`.bound`), transfers (:mod:`.explicit`,
:mod:`.to_device`, :mod:`.implicit`, :mod:`.jit_numpy`, :mod:`.sites`), eager ops
(:mod:`.eager`), ``jax.monitoring`` records (:mod:`.monitoring`), inferred
steps (:mod:`.steps`) and devices (:mod:`.devices`). What they share is one
typed object, :class:`~.context.JaxContext` (the engine that is installed,
the compile count, the per-thread compile state), never each other's
module globals.

Example:
    >>> import jax, metrics                         # doctest: +SKIP
    >>> metrics.install()        # loads this adapter: JAX is imported  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from metrics.engines.jax.engine import JaxEngine
    from metrics.recording.recorder import Recorder

__all__ = ["JaxEngine", "create", "track"]

P = ParamSpec("P")
R = TypeVar("R")


def create(recorder: Recorder, explain_cache_misses: bool = True,
           **_: object) -> JaxEngine:
    """The adapter ``metrics.install()`` uses; options other engines take are ignored."""
    from metrics.engines.jax.context import CONTEXT
    from metrics.engines.jax.engine import JaxEngine

    return JaxEngine(recorder, explain_cache_misses=explain_cache_misses, context=CONTEXT)


def track(fn: Callable[P, R], name: str | None = None) -> Callable[P, R]:
    """``metrics.track`` for JAX (:func:`metrics.engines.jax.tracking.track`)."""
    from metrics.engines.jax.context import CONTEXT
    from metrics.engines.jax.tracking import track as track_calls

    return track_calls(fn, CONTEXT, name)


def __getattr__(name: str) -> object:
    if name == "JaxEngine":  # the engine module imports JAX: loaded when asked for
        from metrics.engines.jax.engine import JaxEngine

        return JaxEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
