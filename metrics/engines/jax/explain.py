"""How the JAX hook describes a compile: the cause JAX's
``jax_explain_cache_misses`` gives (captured from its logger; parsed by
:mod:`metrics.engines.jax.causes`) and the input signature from the
lowering step.

With the flag on, JAX compares every tracing-cache miss against every cached
variant of every function (O(variants) per compile: 200 variants made a
compile-heavy program 1.35x slower). :class:`LastVariantExplainer` leaves the
flag off and runs JAX's own explanation on a miss against only the
function's previous variant: the same text, O(1) per compile.

Example:
    >>> format_aval("lr", type("A", (), {"str_short": lambda s, short_dtypes: "f32[]",
    ...                                  "weak_type": True})(), None)
    'lr: f32[]{weak}'
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from metrics.engines._patching import Patches

if TYPE_CHECKING:
    from jax._src.config import State
    from jax._src.core import AbstractValue
    from jax._src.linear_util import DebugInfo

__all__ = ["EXPLAIN_LOGGERS", "ExplainFilter", "Explanations", "LastVariantExplainer",
           "format_aval"]

# Where JAX logs its explanations (0.10: partial_eval; older: pjit).
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.pjit")


class _Listener(Protocol):
    """Who is told of each explanation (the engine's :class:`~.compiles.Compiles`)."""

    def on_cache_miss(self, message: str, fun: Callable[..., object] | None = None) -> None: ...

    def on_explain_failed(self, error: Exception) -> None: ...


class Explanations:
    """Recompile explanations for one engine, captured from JAX's loggers,
    with the user's ``jax_explain_cache_misses`` flag left as it was where
    :class:`LastVariantExplainer` can work (else the flag is turned on, and
    back off at uninstall)."""

    def __init__(self, listener: _Listener, skip: tuple[str, ...]) -> None:
        self._listener = listener
        self._skip = skip  # the hook's own directory first: not the user's call site
        self._filters: list[tuple[logging.Logger, logging.Filter]] = []
        self._was_on: bool | None = None
        self._flag_set_by_us = False  # only where the cheap explainer cannot work

    def install(self, patches: Patches) -> None:
        """Wraps JAX's tracing cache (restored with ``patches``) and filters its loggers."""
        try:
            from jax._src import config as jax_config
            from jax._src import source_info_util
            from jax._src.interpreters import partial_eval as pe

            flag = jax_config.explain_cache_misses
            self._was_on = bool(flag.value)
        except (ImportError, AttributeError):
            patches.degraded.append("jax_explain_cache_misses unavailable: no recompile causes")
            return
        try:  # our wrappers are library frames, not the user's call site
            source_info_util.register_exclusion(self._skip[0])
        except AttributeError:
            patches.degraded.append("call sites may point into the hook")
        ours = threading.local()
        current: Callable[[], Callable[..., object] | None] = _nothing  # no explainer
        why_not = LastVariantExplainer.usable(pe)
        if why_not is None:
            explainer = LastVariantExplainer(pe, flag, jax_config.trace_context,
                                             source_info_util.is_user_filename, self._listener)
            patches.apply(pe, "trace_to_jaxpr", explainer.wrap)
            ours, current = explainer.ours, explainer.current
        elif not self._was_on:
            import jax

            # The slow way: JAX compares each miss with every cached variant.
            patches.degraded.append(f"recompile causes cost O(variants) per compile: {why_not}")
            jax.config.update("jax_explain_cache_misses", True)
            self._flag_set_by_us = True

        def users_own() -> bool:  # JAX's records go on only when the user turned the flag on
            return bool(flag.value) and not self._flag_set_by_us

        flt = ExplainFilter(self._listener, users_own, ours, current)
        for lname in EXPLAIN_LOGGERS:
            logger = logging.getLogger(lname)
            logger.addFilter(flt)
            self._filters.append((logger, flt))

    def uninstall(self) -> None:
        """Removes the filters; turns the flag back off where the hook turned it on."""
        for logger, flt in self._filters:
            logger.removeFilter(flt)
        self._filters.clear()
        if self._flag_set_by_us:
            import jax

            jax.config.update("jax_explain_cache_misses", False)
            self._flag_set_by_us = False


class ExplainFilter(logging.Filter):
    """Captures explain-cache-miss records; lets through only those the user
    asked for (``passthrough()``), never the ones the hook made itself."""

    def __init__(self, engine: _Listener, passthrough: Callable[[], bool],
                 ours: threading.local,
                 current: Callable[[], Callable[..., object] | None] = lambda: None) -> None:
        super().__init__()
        self.engine = engine
        self.passthrough = passthrough
        self._ours = ours
        self._current = current  # the function being traced, for its parameter names

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            return True
        if not msg.startswith("TRACING CACHE MISS"):
            return True
        self.engine.on_cache_miss(msg, self._current())
        return not getattr(self._ours, "active", False) and self.passthrough()


class LastVariantExplainer:
    """Explains tracing-cache misses like ``jax_explain_cache_misses``, with
    the flag left off, against the missing function's previous variant only.

    Wraps ``partial_eval.trace_to_jaxpr`` (JAX's tracing cache, called during
    tracing only, never on a cached jit call). A call missed the cache when
    the cache's miss count grew by more than the calls nested in it did; then
    JAX's own ``partial_eval.explain`` runs with a one-key list (the previous
    variant of that function) and logs the usual record, which
    :class:`ExplainFilter` captures and drops. While the flag is on (the user
    turned it on) JAX explains by itself and this stands aside.
    """

    def __init__(self, pe: ModuleType, flag: State[bool], trace_context: Callable[[], object],
                 is_user_file: Callable[[str], bool], listener: _Listener) -> None:
        self._pe, self._flag = pe, flag
        self._trace_context, self._is_user_file = trace_context, is_user_file
        self._listener = listener
        self.enabled = True
        self.ours = threading.local()  # .active while our explanation logs
        self._nested = threading.local()  # .misses: misses of calls nested in the current one
        self._tracing = threading.local()  # .fun: the function whose trace may miss now
        self._last: weakref.WeakKeyDictionary[object, tuple[object, ...]] = (
            weakref.WeakKeyDictionary())

    def current(self) -> Any:
        """The function JAX is explaining now (it explains while this wrapper runs)."""
        return getattr(self._tracing, "fun", None)

    @staticmethod
    def usable(pe: ModuleType) -> str | None:
        """Why this JAX cannot be explained this way, or None."""
        for name in ("trace_to_jaxpr", "explain", "diff_tracing_cache_keys"):
            if not hasattr(pe, name):
                return f"partial_eval.{name} missing"
        if not callable(getattr(pe.trace_to_jaxpr, "cache_info", None)):
            return "partial_eval.trace_to_jaxpr has no cache_info"
        return None

    def wrap(self, original: Any) -> Callable[..., Any]:  # JAX's cache: has cache_info
        misses = original.cache_info
        nested, flag = self._nested, self._flag

        tracing = self._tracing

        def trace_to_jaxpr(fun: object, in_avals: object, debug_info: DebugInfo, *context: Any,
                           **kwargs: Any) -> Any:
            if not self.enabled:
                return original(fun, in_avals, debug_info, *context, **kwargs)
            if flag.value:  # JAX explains, inside this call: say whose parameters
                outer_fun, tracing.fun = getattr(tracing, "fun", None), fun
                try:
                    return original(fun, in_avals, debug_info, *context, **kwargs)
                finally:
                    tracing.fun = outer_fun
            outer = getattr(nested, "misses", None)
            nested.misses = 0
            before = misses().misses
            try:
                out = original(fun, in_avals, debug_info, *context, **kwargs)
            finally:
                total = misses().misses - before
                own = total - nested.misses
                nested.misses = None if outer is None else outer + total
            if own > 0:
                self._explain(fun, in_avals, debug_info, context)
            return out

        for attr in ("cache_info", "cache_clear", "cache_keys", "evict_weakref"):
            if hasattr(original, attr):
                setattr(trace_to_jaxpr, attr, getattr(original, attr))
        trace_to_jaxpr.__wrapped__ = original  # type: ignore[attr-defined]
        return trace_to_jaxpr

    def _explain(self, fun: object, in_avals: object, debug_info: DebugInfo,
                 context: tuple[object, ...]) -> None:
        try:
            filename = debug_info.func_filename
            if filename and not self._is_user_file(filename):
                return  # JAX explains only the user's functions
            key: tuple[object, ...] = (self._trace_context(), (in_avals, debug_info, *context),
                                       {})
            previous = self._last.get(fun)
            self._last[fun] = key
            keys = [] if previous is None else [(lambda: fun, *previous)]
            self.ours.active, self._tracing.fun = True, fun
            try:
                self._pe.explain(keys, fun, in_avals, debug_info, *context)
            finally:
                self.ours.active, self._tracing.fun = False, None
        except Exception as e:  # noqa: BLE001 - never into the program
            self._listener.on_explain_failed(e)


def _nothing() -> None:
    return None


def format_aval(name: str | None, aval: AbstractValue, sharding: object) -> str:
    try:
        s = aval.str_short(short_dtypes=True)
    except Exception:  # noqa: BLE001
        s = str(aval)
    if getattr(aval, "weak_type", False):
        s += "{weak}"
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        s += f" sharded{tuple(spec)}"
    return f"{name}: {s}" if name else s
