"""Compiles, as JAX's compiler does them: counted, timed, hashed, signed, explained.

Three private JAX functions are wrapped at install (each behind a check that
degrades the feature, never crashes):

* ``jax._src.compiler.compile_or_get_cached``: one compile request, timed;
  its result is the executable AOT-compiled calls find their graph by;
* ``jax._src.compiler._cache_read``: reads the cache key JAX made (the
  graph hash; ``compilation_cache.get_cache_key`` computes it otherwise);
* ``jax._src.interpreters.pxla.lower_sharding_computation``: the input
  signature, and an input that moved device (:class:`~.causes.LoweringHistory`).

What one compile's pieces tell each other travels in the context's
per-thread state (:class:`~.context.CompileLocal`), never in module globals.
:class:`Compiles` turns a compile into ``CompileTime``, ``UncachedCompile``
/ ``CachedCompile``, the ledger's graph with its signature and cause, and a
compile or recompile event at the user's line. ``jax.monitoring`` durations
give ``TraceTime`` and ``LoweringTime`` (and the compile itself where the
compiler could not be wrapped).

Example:
    >>> import jax, metrics                                   # doctest: +SKIP
    >>> metrics.install(); jax.jit(lambda x: x + 1)(1.0)      # doctest: +SKIP
    >>> metrics.snapshot().graphs[0].name                     # doctest: +SKIP
    'jit(<lambda>)'
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from metrics.engines._frames import outer_user_call, user_line
from metrics.engines._patching import Patches
from metrics.engines.compile_steps import CompileTimeline
from metrics.engines.jax.causes import LoweringHistory, param_path, parse_cache_miss
from metrics.engines.jax.context import ENGINE, CompileInProgress, JaxContext, Lowering
from metrics.engines.jax.explain import format_aval
from metrics.engines.jax.loops import loop_line
from metrics.engines.jax.startup import patch_backends
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import CALLED_FROM, FIRST_CALL, EventKind, RecompileCause

FIRST = CauseKind.FIRST_CALL
MAX_NAMES = 4096  # function names remembered as compiled (beyond: JAX's word stands)
SAME_CHANGE_NS = 2_000_000_000  # a recompile's second graph begins within this of its end

if TYPE_CHECKING:
    import numpy as np
    from jax._src.core import ClosedJaxpr
    from jax._src.lib.mlir import ir
    from jaxlib._jax import Client, CompileOptions


class Compiles:
    """The compiles of one engine: what the compiler wrappers and the
    ``jax.monitoring`` durations report, recorded."""

    def __init__(self, recorder: Recorder, context: JaxContext,
                 skip: tuple[str, ...]) -> None:
        self.rec = recorder
        self.context = context
        self._skip = skip  # library frames: the user's line is past them
        self._lowerings = LoweringHistory()
        self.patched = False  # compile_or_get_cached is wrapped (it records the compile)
        dist, counter = recorder.distribution, recorder.counter
        self._compile_time = dist(names.COMPILE_TIME)
        self._trace_time = dist(names.TRACE_TIME)
        self._lowering_time = dist(names.LOWERING_TIME)
        self._uncached = counter(names.UNCACHED_COMPILE)
        self._cached = counter(names.CACHED_COMPILE)
        self._startup_time = dist(names.BACKEND_START_TIME)
        # Spans of compile work and the start-up: the step loop's compile steps.
        self.timeline = CompileTimeline()
        # The names of the functions compiled so far (up to MAX_NAMES): a cache
        # miss JAX explains for a name never compiled is its first compile.
        self._compiled: set[str] = set()
        # The latest compile: (name, line, its recompile's cause or None, its end ns).
        self._last: tuple[str, str | None, RecompileCause | None, int] | None = None

    def install(self, patches: Patches) -> None:
        """Wraps the compiler's functions (restored with ``patches``)."""
        try:
            from jax._src import compiler
            from jax._src.interpreters import pxla
        except ImportError as e:
            patches.degraded.append(f"compiler hooks unavailable: {e}")
            return
        ctx = self.context
        patch_backends(patches, ctx)
        patches.apply(compiler, "compile_or_get_cached", lambda orig: _wrap_compile(orig, ctx),
                      ("backend", "computation", "devices", "compile_options"))
        self.patched = patches.has("compile_or_get_cached")
        patches.apply(compiler, "_cache_read", lambda orig: _wrap_cache_read(orig, ctx),
                      ("module_name", "cache_key"))
        patches.apply(pxla, "lower_sharding_computation", lambda orig: _wrap_lowering(orig, ctx),
                      ("closed_jaxpr", "api_name", "fun_name", "in_shardings"))

    # Callbacks (each runs inside the user's program: guarded) --------------

    def on_startup(self, start: int, end: int, platforms: list[str]) -> None:
        """The backends opened between ``start`` and ``end`` (monotonic ns):
        a start-up, never the cost of the operation that asked first."""
        self._startup_time.observe(end - start)
        self.context.startups.append((start, end))
        self.timeline.add(start, end)

    def on_cache_miss(self, message: str, fun: Callable[..., object] | None = None) -> None:
        """One explain-cache-miss record (:mod:`.explain`): the cause the
        next compile of its function gets."""
        try:
            func, cause = parse_cache_miss(message, time.time(),
                                           functools.partial(param_path, fun))
            local = self.context.local
            pending = local.causes
            if pending is None:
                pending = local.causes = {}
            pending[func] = cause
        except Exception as e:  # noqa: BLE001
            self.on_explain_failed(e)

    def on_explain_failed(self, error: Exception) -> None:
        self.rec.hook_failed("jax.explain", error)

    def on_lowering(self, fun_name: str, api_name: str, closed_jaxpr: ClosedJaxpr,
                    in_shardings: Sequence[object] | None) -> None:
        """A lowering: the signature (and an input that moved device) its compile gets."""
        try:
            jaxpr = closed_jaxpr.jaxpr
            dbg = getattr(jaxpr, "_debug_info", None) or getattr(jaxpr, "debug_info", None)
            arg_names: list[str | None] = list(getattr(dbg, "arg_names", None) or ())
            avals = closed_jaxpr.in_avals
            if len(arg_names) != len(avals):
                arg_names = [None] * len(avals)
            shardings = list(in_shardings) if in_shardings is not None else []
            shardings += [None] * (len(avals) - len(shardings))
            sig = tuple(format_aval(n, a, s) for n, a, s in zip(arg_names, avals, shardings))
            moved = self._lowerings.moved((fun_name, getattr(dbg, "func_src_info", None)),
                                          avals, shardings, arg_names)
            consts = sum(int(getattr(c, "nbytes", 0) or 0) for c in closed_jaxpr.consts)
            self.context.local.lowering = Lowering(f"{api_name}({fun_name})", fun_name, sig,
                                                   moved, loop_line(jaxpr), consts)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("jax.lowering", e)

    def on_compiled(self, ctx: CompileInProgress, computation: ir.Module,
                    devices: np.ndarray, options: CompileOptions, backend: Client,
                    wall_ns: int) -> None:
        """A compile request done (``wall_ns`` long): recorded, guarded."""
        try:
            self._on_compiled(ctx, computation, devices, options, backend, wall_ns)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("jax.compile", e)

    def _on_compiled(self, ctx: CompileInProgress, computation: ir.Module,
                     devices: np.ndarray, options: CompileOptions, backend: Client,
                     wall_ns: int) -> None:
        key = ctx.cache_key
        if key is None:
            from jax._src import compilation_cache

            key = compilation_cache.get_cache_key(computation, devices, options, backend)
        graph_hash = key.rsplit("-", 1)[-1]
        local = self.context.local
        lowering, local.lowering = local.lowering, None
        moved = loop = None
        consts = 0
        if lowering is not None:
            name, fun_name, sig, moved, loop, consts = lowering
        else:
            name = str(computation.operation.attributes["sym_name"])
            fun_name, sig = name, ()
        causes = local.causes or {}
        cause = causes.pop(fun_name, None)
        # The user's line, past installed libraries (JAX's own explanation
        # stops at the first frame outside jax: flax's jit wrapper).
        here = user_line(self._skip)
        location = here.location if here else cause.location if cause else None
        via = here.via if here else ""
        if cause is None and moved is not None:  # JAX explains no device move
            cause = dataclasses.replace(moved, time_unix=time.time(), location=location, via=via)
        elif cause is not None and name not in self._compiled and cause.kind != FIRST:
            # JAX explained a miss against a trace made inside another jitted
            # function (``loss`` the step calls, evaluated at the top level):
            # never compiled, so its first compile, not a recompile (neural_sde's
            # 8 s evaluation compile said only as a share, at no line).
            cause = RecompileCause(time.time(), FIRST_CALL, location, via=via, kind=FIRST)
        elif cause is not None and (cause.location, cause.via) != (location, via):
            cause = dataclasses.replace(cause, location=location, via=via)
        last, now = self._last, time.monotonic_ns()
        if (cause is None and last is not None and last[2] is not None and last[0] == name
                and last[1] == location and now - wall_ns - last[3] < SAME_CHANGE_NS):
            # A graph JAX explains nothing for, right after a recompile of the
            # same function at the same line: its other graph for the same change
            # (an eager value_and_grad of jit(loss) compiles its backward pass
            # next: d2l's short last batch, 0.68 + 1.06 s, was said as 0.68).
            cause = last[2]  # (its time too: one change, said once)
        if len(self._compiled) < MAX_NAMES:
            self._compiled.add(name)
        ledger, events = self.rec.ledger, self.rec.events
        self.context.note_compile(graph_hash)
        self.timeline.add(now - wall_ns, now)
        seconds = wall_ns / 1e9
        loaded = ctx.cache_hit
        if loaded:  # traced and lowered again; only the backend compile was loaded
            self._cached.inc()
        else:
            self._uncached.inc()
            self._compile_time.observe(wall_ns)
        if cause is not None and cause.description != FIRST_CALL:
            cause = dataclasses.replace(cause, seconds=seconds)  # its own compile's time
        ledger.compiled(graph_hash, name, ENGINE, seconds, sig, cause, loop, consts)
        if loaded:
            ledger.cache_hit(graph_hash, name, ENGINE, sig)
        real = cause is not None and cause.description != FIRST_CALL
        detail = cause.description if cause is not None and real else ""
        if not real and (outer := outer_user_call(self._skip)):
            # eager code compiles op by op at its innermost line; name the call to jit too
            detail = f"{CALLED_FROM}{outer}"
        if loaded:
            detail = f"{detail}; backend cache hit" if detail else "backend cache hit"
        kind = EventKind.RECOMPILE if real else EventKind.COMPILE
        self._last = (name, location, cause if real else None, now)
        events.emit(kind, name, graph_hash, detail, location, seconds, via=via)
        self.context.remember_executable(ctx.executable, graph_hash, name)

    def on_duration(self, event: str, seconds: float, fun_name: str | None) -> None:
        """A ``jax.monitoring`` duration: trace and lowering times (and the
        compile, where the compiler is not wrapped)."""
        now = time.monotonic_ns()
        if event.endswith(("/jaxpr_trace_duration", "/jaxpr_to_mlir_module_duration")) or (
                event.endswith("/backend_compile_duration") and not self.patched):
            self.timeline.add(now - int(seconds * 1e9), now)
        if event.endswith("/backend_compile_duration"):
            # JAX emits this after compile_or_get_cached returns; when that is
            # wrapped, the wrapper has already recorded the compile.
            if not self.patched:
                self._uncached.inc()
                self._compile_time.observe(seconds * 1e9)
                name = fun_name or "unknown"
                self.rec.ledger.compiled("name:" + name, name, ENGINE, seconds)
                self.rec.events.emit(EventKind.COMPILE, name, "", "", None, seconds)
        elif event.endswith("/jaxpr_trace_duration"):
            self._trace_time.observe(seconds * 1e9)
        elif event.endswith("/jaxpr_to_mlir_module_duration"):
            self._lowering_time.observe(seconds * 1e9)

    def on_event(self, event: str) -> None:
        """A ``jax.monitoring`` event: a persistent-cache hit."""
        if event == "/jax/compilation_cache/cache_hits":
            ctx = self.context.local.compile
            if ctx is not None:
                ctx.cache_hit = True
            else:
                self._cached.inc()


# The wrappers (each runs inside the user's program) ---------------------------

def _wrap_compile(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    local = context.local

    def compile_or_get_cached(backend: Client, computation: ir.Module, devices: np.ndarray,
                              compile_options: CompileOptions, *args: Any, **kwargs: Any) -> Any:
        eng = context.active
        if eng is None:
            return original(backend, computation, devices, compile_options, *args, **kwargs)
        outer = local.compile
        ctx = local.compile = CompileInProgress()
        start = time.perf_counter_ns()
        try:
            result = original(backend, computation, devices, compile_options, *args, **kwargs)
        finally:
            local.compile = outer
        ctx.executable = result  # AOT-compiled calls find their graph by it
        eng.compiles.on_compiled(ctx, computation, devices, compile_options, backend,
                                 time.perf_counter_ns() - start)
        return result

    compile_or_get_cached.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_or_get_cached


def _wrap_cache_read(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    local = context.local

    def _cache_read(module_name: str, cache_key: str, *args: Any, **kwargs: Any) -> Any:
        ctx = local.compile
        if ctx is not None:
            ctx.cache_key = cache_key
        return original(module_name, cache_key, *args, **kwargs)

    _cache_read.__wrapped__ = original  # type: ignore[attr-defined]
    return _cache_read


def _wrap_lowering(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    def lower_sharding_computation(closed_jaxpr: ClosedJaxpr, api_name: str, fun_name: str,
                                   in_shardings: Sequence[object] | None, *args: Any,
                                   **kwargs: Any) -> Any:
        eng = context.active
        if eng is not None:
            eng.compiles.on_lowering(fun_name, api_name, closed_jaxpr, in_shardings)
        return original(closed_jaxpr, api_name, fun_name, in_shardings, *args, **kwargs)

    lower_sharding_computation.__wrapped__ = original  # type: ignore[attr-defined]
    return lower_sharding_computation
