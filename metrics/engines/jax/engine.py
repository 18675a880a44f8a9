"""JAX / PJRT engine hook.

What it records:

* ``CompileTime`` (backend compile), ``TraceTime``, ``LoweringTime`` from
  ``jax.monitoring`` duration events; ``UncachedCompile`` per real compile and
  ``CachedCompile`` per persistent-cache hit: in the graph ledger a hit is a
  compile whose backend was loaded (it was traced and lowered, and has a
  cause), so a warm cache does not hide a recompile.
* The graph hash: JAX's compilation-cache key (sha256 over the module with
  debug info stripped, plus compile options and platform: stable across
  processes and when the source moves), taken from the key JAX computes
  anyway, or computed with JAX's own function when the cache is off.
* The input signature of each compiled graph (argument names, shapes,
  dtypes, weak types, shardings) from the lowering step.
* Recompile causes: ``jax_explain_cache_misses`` records, captured from JAX's
  logger and parsed (which argument changed, by its parameter name, old and
  new value, the user's call site), and the recompiles JAX does not explain
  (an input moved to another device), from the previous lowering. The
  flag stays as the user left it: with it off, JAX's own explanation runs
  on each tracing-cache miss against the function's previous variant only
  (``LastVariantExplainer``: O(1) per compile, where the flag costs
  O(variants)) and nothing is printed.
* Transfers: ``jax.device_put`` / ``jax.device_get`` calls, bytes and time
  (:mod:`metrics.engines.jax.explicit`); implicit ones both ways
  (``float(x)``, ``print(x)``, ``jnp.asarray(numpy)``, numpy arguments
  sharded per call) with the user's line: see
  :mod:`metrics.engines.jax.implicit` (``sites()``, ``blind_spots()``).
* Calls of functions jitted or pmapped after install (``jax.jit`` and
  ``jax.pmap`` wrapped: :mod:`metrics.engines.jax.calls`) and of AOT-compiled
  ones (:mod:`metrics.engines.jax.aot`): executions per graph and host time
  (:mod:`metrics.engines.jax.executions`); the inferred step and busy % when
  the program never marks steps (:mod:`metrics.engines.jax.steps`).
* Device memory at scrape time (:mod:`metrics.engines.jax.devices`).

What the hooks share (the installed engine, the compile count, the
thread-local compile state) is :mod:`metrics.engines.jax.state`: the
wrappers import it, never this module.

Private JAX APIs used (each behind a check that degrades the feature, never
crashes; ``JaxEngine.degraded`` lists what was unavailable):

* ``jax._src.compiler.compile_or_get_cached`` (wrapped: one compile request)
* ``jax._src.compiler._cache_read`` (wrapped: reads the cache key JAX made)
* ``jax._src.compilation_cache.get_cache_key`` (fallback hash)
* ``jax._src.interpreters.pxla.lower_sharding_computation`` (wrapped: signature)
* ``jax._src.interpreters.partial_eval.trace_to_jaxpr`` (wrapped: misses, by
  its ``cache_info``), ``.explain`` (called with one key); without them the
  flag is turned on instead (every variant compared: slower compiles)
* the loggers ``jax._src.interpreters.partial_eval`` and ``jax._src.pjit``
  (explain-cache-miss records)
* ``jax._src.stages.Compiled.__call__`` (wrapped on the class: AOT calls) and
  ``Compiled._executable.xla_executable.fingerprint`` (their graph)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from metrics.engines import device_profilers, ranks
from metrics.engines._frames import outer_user_call, skip_prefixes, user_line
from metrics.engines._patching import Patches
from metrics.engines.base import EngineBase
from metrics.engines.jax import aot as jax_aot
from metrics.engines.jax import calls as jax_calls
from metrics.engines.jax import monitoring as jax_monitoring
from metrics.engines.jax import state
from metrics.engines.jax.causes import LoweringHistory, param_path
from metrics.engines.jax.devices import DeviceMemory
from metrics.engines.jax.eager import EagerOps
from metrics.engines.jax.executions import Executions
from metrics.engines.jax.explain import (
    EXPLAIN_LOGGERS,
    ExplainFilter,
    LastVariantExplainer,
    format_aval,
    parse_cache_miss,
)
from metrics.engines.jax.explicit import ExplicitTransfers
from metrics.engines.jax.implicit import ImplicitTransfers
from metrics.engines.jax.monitoring import MonitoringRecords
from metrics.engines.jax.state import ENGINE
from metrics.engines.jax.steps import StepWatch
from metrics.recording import native
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names
from tpu_info.contract.model import (
    CALLED_FROM,
    FIRST_CALL,
    DeviceRecord,
    EventKind,
    SiteReading,
    StepsReading,
)

_tls = state.local
_listeners_registered = False
_listeners_missing: list[str] = []  # jax.monitoring kinds not listened to, in words


class JaxEngine(EngineBase):
    """Installs and removes the JAX hooks; one per process at a time."""

    name = ENGINE
    device_trace_kind = device_profilers.JaxTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True) -> None:
        self.rec = recorder
        self.degraded: list[str] = []
        self._patches = Patches(self.degraded)
        self._filters: list[tuple[logging.Logger, logging.Filter]] = []
        self._explain = explain_cache_misses
        self._explain_was_on: bool | None = None
        self._flag_set_by_us = False  # only where the cheap explainer cannot work
        self._skip = skip_prefixes(jax, sys.modules.get("jaxlib"))
        self._memory = DeviceMemory()
        self._lowerings = LoweringHistory()
        self._compile_patched = False
        dist, counter = recorder.distribution, recorder.counter
        self._compile_time = dist(names.COMPILE_TIME)
        self._trace_time = dist(names.TRACE_TIME)
        self._lowering_time = dist(names.LOWERING_TIME)
        self._uncached = counter(names.UNCACHED_COMPILE)
        self._cached = counter(names.CACHED_COMPILE)
        # Hot paths append raw records to these journals, folded before reads.
        self.explicit = ExplicitTransfers(recorder)  # device_put / device_get
        self.runs = Executions(recorder)  # counted calls: executions per graph
        self.calls, self.calls_queue = self.runs.journal, self.runs.queue  # the wrappers write
        self.implicit = ImplicitTransfers(self)  # syncs and transfers nobody asked for
        self.eager = EagerOps(self)  # primitives run outside jit (into implicit's sites)
        self.monitoring = MonitoringRecords(recorder)  # every jax.monitoring record, by name
        self.step_watch = StepWatch(self.runs, self.implicit)
        recorder.on_reset(self._forget_calls)
        self._hooked: dict[str, bool] = {}  # "jit", "pmap", "aot": whether each is counted

    def _forget_calls(self) -> None:
        self.runs.forget()
        self.step_watch.forget()

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        _register_listeners()
        self.degraded.extend(_listeners_missing)
        if native.native() is None:  # a cost, not a blind spot: every count is the same
            self.degraded.append(f"hooked calls cost more: {native.status()}")
        self._patch_compiler()
        self._patch_transfers()
        self._patch_calls()
        self.eager.install(self._patches)
        if self._explain:
            self._capture_explanations()
        state.active = self

    def uninstall(self) -> None:
        if state.active is self:
            state.active = None
        self.implicit.uninstall()
        self._patches.restore()
        for logger, flt in self._filters:
            logger.removeFilter(flt)
        self._filters.clear()
        if self._flag_set_by_us:
            jax.config.update("jax_explain_cache_misses", False)
            self._flag_set_by_us = False
        self._compile_patched = False
        self._hooked.clear()

    def _patch_compiler(self) -> None:
        try:
            from jax._src import compiler
            from jax._src.interpreters import pxla
        except ImportError as e:
            self.degraded.append(f"compiler hooks unavailable: {e}")
            return
        self._patches.apply(compiler, "compile_or_get_cached", _wrap_compile,
                    ("backend", "computation", "devices", "compile_options"))
        self._compile_patched = self._patches.has("compile_or_get_cached")
        self._patches.apply(compiler, "_cache_read", _wrap_cache_read, ("module_name", "cache_key"))
        self._patches.apply(pxla, "lower_sharding_computation", _wrap_lowering,
                    ("closed_jaxpr", "api_name", "fun_name", "in_shardings"))

    def _patch_transfers(self) -> None:
        # Explicit device_puts of host data are counted by the numpy shard
        # handler (one hook per put); jax.device_put is wrapped only where
        # that cannot tell them apart (with the C hot path it runs in the C
        # ExplicitScope, which counts nothing: it spares the handler asking
        # JAX's transfer state).
        self.implicit.install(self._patches)
        put = not self.implicit.explicit_puts_counted
        self.implicit.counted_by(*self.explicit.install(self._patches, self, put=put))

    def _patch_calls(self) -> None:
        """Counts calls without wiring: ``jax.jit`` and ``jax.pmap`` wrap what
        they return; AOT-compiled calls are counted by ``Compiled.__call__``."""
        apply = self._patches.apply
        self._hooked["jit"] = apply(jax, "jit", jax_calls.hook_jit)
        self._hooked["pmap"] = apply(jax, "pmap", jax_calls.hook_pmap)
        self._hooked["aot"] = jax_aot.install(self._patches)

    def _capture_explanations(self) -> None:
        try:
            from jax._src import config as jax_config
            from jax._src import source_info_util
            from jax._src.interpreters import partial_eval as pe

            flag = jax_config.explain_cache_misses
            self._explain_was_on = bool(flag.value)
        except (ImportError, AttributeError):
            self.degraded.append("jax_explain_cache_misses unavailable: no recompile causes")
            return
        try:  # our wrappers are library frames, not the user's call site
            source_info_util.register_exclusion(self._skip[0])
        except AttributeError:
            self.degraded.append("call sites may point into the hook")
        ours = threading.local()
        current: Callable[[], Any] = type(None)  # no explainer: no function to name
        why_not = LastVariantExplainer.usable(pe)
        if why_not is None:
            explainer = LastVariantExplainer(pe, flag, jax_config.trace_context,
                                             source_info_util.is_user_filename, self)
            self._patches.apply(pe, "trace_to_jaxpr", explainer.wrap)
            ours, current = explainer.ours, explainer.current
        elif not self._explain_was_on:
            # The slow way: JAX compares each miss with every cached variant.
            self.degraded.append(f"recompile causes cost O(variants) per compile: {why_not}")
            jax.config.update("jax_explain_cache_misses", True)
            self._flag_set_by_us = True

        def users_own() -> bool:  # JAX's records go on only when the user turned the flag on
            return bool(flag.value) and not self._flag_set_by_us

        flt = ExplainFilter(self, users_own, ours, current)
        for lname in EXPLAIN_LOGGERS:
            logger = logging.getLogger(lname)
            logger.addFilter(flt)
            self._filters.append((logger, flt))

    # Callbacks (each runs inside the user's program: guarded) --------------

    def on_cache_miss(self, message: str, fun: Any = None) -> None:
        try:
            func, cause = parse_cache_miss(message, time.time(),
                                           functools.partial(param_path, fun))
            pending = getattr(_tls, "causes", None)
            if pending is None:
                pending = _tls.causes = {}
            pending[func] = cause
        except Exception as e:  # noqa: BLE001
            self.on_explain_failed(e)

    def on_explain_failed(self, error: Exception) -> None:
        self.rec.hook_failed("jax.explain", error)

    def on_lowering(self, fun_name: str, api_name: str, closed_jaxpr: Any,
                    in_shardings: Any) -> None:
        try:
            dbg = getattr(closed_jaxpr.jaxpr, "_debug_info", None) or getattr(
                closed_jaxpr.jaxpr, "debug_info", None)
            arg_names = list(getattr(dbg, "arg_names", None) or ())
            avals = closed_jaxpr.in_avals
            if len(arg_names) != len(avals):
                arg_names = [None] * len(avals)
            shardings = list(in_shardings) if in_shardings is not None else []
            shardings += [None] * (len(avals) - len(shardings))
            sig = tuple(format_aval(n, a, s) for n, a, s in zip(arg_names, avals, shardings))
            moved = self._lowerings.moved((fun_name, getattr(dbg, "func_src_info", None)),
                                          avals, shardings, arg_names)
            _tls.lowering = (f"{api_name}({fun_name})", fun_name, sig, moved)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("jax.lowering", e)

    def on_compiled(self, ctx: dict[str, Any], computation: Any, devices: Any,
                    options: Any, backend: Any, wall_ns: int) -> None:
        try:
            self._on_compiled(ctx, computation, devices, options, backend, wall_ns)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("jax.compile", e)

    def _on_compiled(self, ctx: dict[str, Any], computation: Any, devices: Any,
                     options: Any, backend: Any, wall_ns: int) -> None:
        key = ctx.get("cache_key")
        if key is None:
            from jax._src import compilation_cache

            key = compilation_cache.get_cache_key(computation, devices, options, backend)
        graph_hash = key.rsplit("-", 1)[-1]
        lowering = getattr(_tls, "lowering", None)
        _tls.lowering = None
        moved = None
        if lowering is not None:
            name, fun_name, sig, moved = lowering
        else:
            name = ctx.get("fun_name") or str(computation.operation.attributes["sym_name"])
            fun_name, sig = name, ()
        causes = getattr(_tls, "causes", None) or {}
        cause = causes.pop(fun_name, None)
        # The user's line, past installed libraries (JAX's own explanation
        # stops at the first frame outside jax: flax's jit wrapper).
        here = user_line(self._skip)
        location = here.location if here else cause.location if cause else None
        via = here.via if here else ""
        if cause is None and moved is not None:  # JAX explains no device move
            cause = dataclasses.replace(moved, time_unix=time.time(), location=location, via=via)
        elif cause is not None and (cause.location, cause.via) != (location, via):
            cause = dataclasses.replace(cause, location=location, via=via)
        ledger, events = self.rec.ledger, self.rec.events
        state.note_compile(graph_hash)
        seconds = wall_ns / 1e9
        loaded = bool(ctx.get("cache_hit"))
        if loaded:  # traced and lowered again; only the backend compile was loaded
            self._cached.inc()
        else:
            self._uncached.inc()
            self._compile_time.observe(wall_ns)
        ledger.compiled(graph_hash, name, ENGINE, seconds, sig, cause)
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
        events.emit(kind, name, graph_hash, detail, location, seconds, via=via)
        jax_aot.remember(ctx.get("executable"), graph_hash, name)

    def on_duration(self, event: str, seconds: float, fun_name: str | None) -> None:
        if event.endswith("/backend_compile_duration"):
            # JAX emits this after compile_or_get_cached returns; when that is
            # wrapped, the wrapper has already recorded the compile.
            if not self._compile_patched:
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
        if event == "/jax/compilation_cache/cache_hits":
            ctx = getattr(_tls, "compile", None)
            if ctx is not None:
                ctx["cache_hit"] = True
            else:
                self._cached.inc()

    # Scrape time -----------------------------------------------------------

    def sites(self) -> list[SiteReading]:
        """Lines that synced or moved data implicitly, or ran eager ops."""
        return self.implicit.sites()

    def busy_percent(self) -> tuple[float | None, str]:
        """Host-side busy % and its reason (:meth:`StepWatch.busy_percent`)."""
        return self.step_watch.busy_percent()

    def steps(self) -> StepsReading | None:
        """Steps when the program never marks them (:mod:`metrics.engines.jax.steps`)."""
        return self.step_watch.steps()

    def blind_spots(self) -> list[str]:
        """What the JAX hook cannot see in this process, one sentence each:
        calls the executions count misses, then transfers and syncs."""
        return (jax_calls.blind_spots(self._hooked) + self.implicit.blind_spots()
                + self.eager.blind_spots())

    def devices(self) -> list[DeviceRecord]:
        """One record per local device, memory read now."""
        return self._memory.records(self.busy_percent())

    def rank(self) -> ranks.Rank | None:
        return ranks.from_jax()

    def versions(self) -> dict[str, str]:
        v = {"jax": jax.__version__}
        try:
            import jaxlib

            v["jaxlib"] = jaxlib.__version__
        except (ImportError, AttributeError):
            pass
        return v


def _register_listeners() -> None:
    global _listeners_registered
    if _listeners_registered:
        return
    import jax.monitoring as mon

    def on_duration(event: str, duration: float, **kw: Any) -> None:
        eng = state.active
        if eng is not None:
            try:
                eng.monitoring.duration(event, duration)
                eng.on_duration(event, duration, kw.get("fun_name"))
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    def on_event(event: str, **kw: Any) -> None:
        eng = state.active
        if eng is not None:
            try:
                eng.monitoring.event(event)
                eng.on_event(event)
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    mon.register_event_duration_secs_listener(on_duration)
    mon.register_event_listener(on_event)
    _listeners_missing.extend(jax_monitoring.register(mon, lambda: state.active))
    _listeners_registered = True


def _wrap_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_get_cached(backend: Any, computation: Any, devices: Any,
                              compile_options: Any, *args: Any, **kwargs: Any) -> Any:
        eng = state.active
        if eng is None:
            return original(backend, computation, devices, compile_options, *args, **kwargs)
        outer = getattr(_tls, "compile", None)
        ctx: dict[str, Any] = {}
        _tls.compile = ctx
        start = time.perf_counter_ns()
        try:
            result = original(backend, computation, devices, compile_options, *args, **kwargs)
        finally:
            _tls.compile = outer
        ctx["executable"] = result  # AOT-compiled calls find their graph by it
        eng.on_compiled(ctx, computation, devices, compile_options, backend,
                        time.perf_counter_ns() - start)
        return result

    compile_or_get_cached.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_or_get_cached


def _wrap_cache_read(original: Callable[..., Any]) -> Callable[..., Any]:
    def _cache_read(module_name: Any, cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = getattr(_tls, "compile", None)
        if ctx is not None:
            ctx["cache_key"] = cache_key
        return original(module_name, cache_key, *args, **kwargs)

    _cache_read.__wrapped__ = original  # type: ignore[attr-defined]
    return _cache_read


def _wrap_lowering(original: Callable[..., Any]) -> Callable[..., Any]:
    def lower_sharding_computation(closed_jaxpr: Any, api_name: Any, fun_name: Any,
                                   in_shardings: Any, *args: Any, **kwargs: Any) -> Any:
        eng = state.active
        if eng is not None:
            eng.on_lowering(fun_name, api_name, closed_jaxpr, in_shardings)
        return original(closed_jaxpr, api_name, fun_name, in_shardings, *args, **kwargs)

    lower_sharding_computation.__wrapped__ = original  # type: ignore[attr-defined]
    return lower_sharding_computation
