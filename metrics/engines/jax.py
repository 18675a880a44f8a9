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
* Transfers: ``jax.device_put`` / ``jax.device_get`` calls, bytes and time;
  implicit ones both ways (``float(x)``, ``print(x)``, ``jnp.asarray(numpy)``,
  numpy arguments sharded per call) with the user's line: see
  :mod:`metrics.engines.jax_transfers` (``sites()``, ``blind_spots()``).
* Calls of functions jitted after install (``jax.jit`` wrapped:
  :mod:`metrics.engines.jax_calls`): executions per graph, host time, the
  inferred step and busy % when the program never marks steps.
* Device memory at scrape time: ``device.memory_stats()`` where it exists,
  else the bytes of live arrays per device with host RAM as the limit.

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
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import operator
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from metrics import events as ev
from metrics import names
from metrics.callstats import MIN_CALLS, CallTimes
from metrics.engines._frames import host_ram, outer_user_call, skip_prefixes, user_location
from metrics.engines._patching import Patches
from metrics.engines.jax_causes import LoweringHistory, param_path
from metrics.engines.jax_describe import (
    EXPLAIN_LOGGERS,
    ExplainFilter,
    LastVariantExplainer,
    format_aval,
    parse_cache_miss,
)
from metrics.engines.jax_transfers import ImplicitTransfers
from metrics.journal import FOLD_AT
from metrics.recorder import Recorder
from tpu_info.model import (
    CALLED_FROM,
    FIRST_CALL,
    STEPS_INFERRED,
    DeviceRecord,
    MemoryReading,
    SiteKind,
    StepsReading,
)

ENGINE = "jax"

_tls = threading.local()
# Bumped by every compile; a tracked call compares it before and after, which
# is cheaper than resetting a thread-local on every call.
_compile_seq = [0]
_active: JaxEngine | None = None
_listeners_registered = False


def _leaf_bytes(tree: Any, host_only: bool) -> int:
    if type(tree) is np.ndarray:  # fast path: the usual batch
        return tree.nbytes
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        if host_only and isinstance(leaf, jax.Array):
            continue
        nbytes = getattr(leaf, "nbytes", None)
        total += int(nbytes) if nbytes is not None else 8
    return total


# Hot paths write each record as its fields, in one ``deque.extend`` (atomic
# under the GIL, like an append): the journal then holds only numbers and
# existing objects, so records waiting to be folded make no new objects for
# the garbage collector to count and trace, and a fold takes each field as
# one slice. Transfers: (to_device, start, end, bytes). Tracked calls:
# (owner, key, start, end, compiled graph or None).
TRANSFER_FIELDS = 4
CALL_FIELDS = 5


class JaxEngine:
    """Installs and removes the JAX hooks; one per process at a time."""

    name = ENGINE

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True) -> None:
        self.rec = recorder
        self.degraded: list[str] = []
        self._patches = Patches(self.degraded)
        self._filters: list[tuple[logging.Logger, logging.Filter]] = []
        self._explain = explain_cache_misses
        self._explain_was_on: bool | None = None
        self._flag_set_by_us = False  # only where the cheap explainer cannot work
        self._skip = skip_prefixes(jax, sys.modules.get("jaxlib"))
        self._peak_live: dict[int, int] = {}
        self._lowerings = LoweringHistory()
        self._compile_patched = False
        dist, counter = recorder.distribution, recorder.counter
        self._compile_time = dist(names.COMPILE_TIME)
        self._trace_time = dist(names.TRACE_TIME)
        self._lowering_time = dist(names.LOWERING_TIME)
        self._uncached = counter(names.UNCACHED_COMPILE)
        self._cached = counter(names.CACHED_COMPILE)
        self._h2d_time = dist(names.TRANSFER_TO_DEVICE_TIME)
        self._d2h_time = dist(names.TRANSFER_FROM_DEVICE_TIME)
        self._outbound = dist(names.OUTBOUND_DATA)
        self._inbound = dist(names.INBOUND_DATA)
        self._exec_count = counter(names.EXECUTE_COUNT)
        self._exec_time = dist(names.EXECUTE_TIME)
        # Hot paths append raw records; folded into the above before reads.
        self.transfers = recorder.journal(self._fold_transfers)
        self.transfers_queue = self.transfers.queue
        self.calls = recorder.journal(self._fold_calls)
        self.calls_queue = self.calls.queue
        self._busy_ns = 0  # time inside tracked calls, for the busy % estimate
        self._inferred_busy_ns = 0  # inside the other jitted calls: used without tracked ones
        self.call_times = CallTimes("jitted function")  # for the inferred step
        recorder.on_reset(self._forget_calls)
        self._jit_hooked = False
        # (monotonic ns, tracked busy ns, inferred busy ns) at recent readings;
        # the window of a reading starts at the newest mark at least a second old.
        self._busy_marks: deque[tuple[int, int, int]] = deque(
            [(time.monotonic_ns(), 0, 0)], maxlen=32)
        self.implicit = ImplicitTransfers(self)  # syncs and transfers nobody asked for

    def _forget_calls(self) -> None:
        self.call_times.clear()
        self._busy_ns = self._inferred_busy_ns = 0
        self._busy_marks.clear()
        self._busy_marks.append((time.monotonic_ns(), 0, 0))

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        global _active
        _register_listeners()
        self._patch_compiler()
        self._patch_transfers()
        from metrics.engines import jax_calls

        self._jit_hooked = self._patches.apply(jax, "jit", jax_calls.hook_jit)
        if self._explain:
            self._capture_explanations()
        _active = self

    def uninstall(self) -> None:
        global _active
        if _active is self:
            _active = None
        self.implicit.uninstall()
        self._patches.restore()
        for logger, flt in self._filters:
            logger.removeFilter(flt)
        self._filters.clear()
        if self._flag_set_by_us:
            jax.config.update("jax_explain_cache_misses", False)
            self._flag_set_by_us = False
        self._compile_patched = False
        self._jit_hooked = False

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
        # that cannot tell them apart.
        self.implicit.install(self._patches)
        if not self.implicit.explicit_puts_counted:
            self._patches.apply(jax, "device_put", lambda orig: _wrap_device_put(orig, self))
        self._patches.apply(jax, "device_get", lambda orig: _wrap_device_get(orig, self))
        self.implicit.counted_by(*[getattr(jax, n) for n in ("device_put", "device_get")
                                   if self._patches.has(n)])

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
        location = cause.location if cause else user_location(self._skip)
        if cause is None and moved is not None:  # JAX explains no device move
            cause = dataclasses.replace(moved, time_unix=time.time(), location=location)
        ledger, events = self.rec.ledger, self.rec.events
        _compile_seq[0] += 1
        _tls.last_compile = (_compile_seq[0], graph_hash)
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
        events.emit(ev.RECOMPILE if real else ev.COMPILE, name, graph_hash, detail, location,
                    seconds)

    def on_duration(self, event: str, seconds: float, fun_name: str | None) -> None:
        if event.endswith("/backend_compile_duration"):
            # JAX emits this after compile_or_get_cached returns; when that is
            # wrapped, the wrapper has already recorded the compile.
            if not self._compile_patched:
                self._uncached.inc()
                self._compile_time.observe(seconds * 1e9)
                name = fun_name or "unknown"
                self.rec.ledger.compiled("name:" + name, name, ENGINE, seconds)
                self.rec.events.emit(ev.COMPILE, name, "", "", None, seconds)
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

    def _fold_transfers(self, flat: list[Any]) -> None:
        """Transfer records (``TRANSFER_FIELDS`` items each) -> times, bytes
        and events (made when read)."""
        to_device, starts = flat[0::TRANSFER_FIELDS], flat[1::TRANSFER_FIELDS]
        ends, sizes = flat[2::TRANSFER_FIELDS], flat[3::TRANSFER_FIELDS]
        if all(to_device):  # the usual batch: every record a device_put
            sides = ((self._h2d_time, self._outbound, starts, ends, sizes),)
        else:
            pick, back = itertools.compress, [not t for t in to_device]
            sides = tuple(
                (time_d, bytes_d, list(pick(starts, mask)), list(pick(ends, mask)),
                 list(pick(sizes, mask)))
                for time_d, bytes_d, mask in ((self._h2d_time, self._outbound, to_device),
                                              (self._d2h_time, self._inbound, back)))
        for time_d, bytes_d, s, e, b in sides:
            if e:
                time_d.observe_many(list(map(operator.sub, e, s)), e)
                bytes_d.observe_many(b, e)
        self.rec.events.emit_batch(len(ends), functools.partial(
            _transfer_rows, flat, self.rec.mono_to_unix))

    def _fold_calls(self, flat: list[Any]) -> None:
        """Tracked calls (``CALL_FIELDS`` items each: owner, key, start, end,
        compiled) -> ExecuteTime and executions of the graph each ran."""
        owners, keys = flat[0::CALL_FIELDS], flat[1::CALL_FIELDS]
        starts, ends, compiled = flat[2::CALL_FIELDS], flat[3::CALL_FIELDS], flat[4::CALL_FIELDS]
        self._exec_count.inc(len(owners))
        durations = list(map(operator.sub, ends, starts))
        self._exec_time.observe_many(durations, ends)
        uniq = set(owners)
        tracked_ns, other_ns = self.call_times.fold(owners, starts, ends, durations, uniq)
        self._busy_ns += tracked_ns
        self._inferred_busy_ns += other_ns
        executed = self.rec.ledger.executed
        if not any(compiled) and keys.count(None) == len(keys):
            # The usual batch: no call compiled and none carries a key, so
            # each ran its function's last graph; counted per function in C
            # (one function, the usual case, needs no count: Counter costs
            # ~60 ns a record).
            per_owner = ({owners[0]: len(owners)} if len(uniq) == 1
                         else collections.Counter(owners))
            for owner, n in per_owner.items():
                if owner.last_hash:
                    executed(owner.last_hash, owner.name, ENGINE, n)
            return
        runs: dict[tuple[Any, str], int] = {}  # (tracked function, graph) -> calls
        for owner, key, graph in zip(owners, keys, compiled, strict=True):
            known = owner.graphs
            if graph:
                if key is not None:
                    known[key] = graph
                graph_hash = graph
            else:
                graph_hash = (known.get(key) if key is not None else None) or owner.last_hash
            if graph_hash:
                owner.last_hash = graph_hash
                runs[(owner, graph_hash)] = runs.get((owner, graph_hash), 0) + 1
        for (owner, graph_hash), n in runs.items():
            executed(graph_hash, owner.name, ENGINE, n)

    # Scrape time -----------------------------------------------------------

    def sites(self) -> list[Any]:
        """Lines that synced or moved data implicitly (``SiteReading``s)."""
        return self.implicit.sites()


    def busy_percent(self) -> tuple[float | None, str]:
        """Host-side busy % over the last second or more: time inside tracked
        calls (``metrics.track``) over wall time, capped at 100; without
        tracked calls, inferred from the calls of jitted functions (the
        reason says so) once one has run ``MIN_CALLS`` times. Dispatch is
        asynchronous, so a step that does not wait for its result reads low.
        Readers close together see the same window."""
        from metrics.engines import jax_calls

        self.calls.flush()
        now, tracked, inferred = time.monotonic_ns(), self._busy_ns, self._inferred_busy_ns
        which, busy, reason = 1, tracked, ""
        if tracked == 0:
            if inferred == 0:
                return None, ("busy % is estimated from calls of jitted functions and tracked "
                              "ones: none counted yet (functions jitted before install are "
                              "not seen; wrap the step with metrics.track(step) to see it)")
            if self.call_times.dominant(False, MIN_CALLS) is None:
                return None, jax_calls.BUSY_TOO_FEW
            which, busy, reason = 2, inferred, jax_calls.BUSY_INFERRED
        marks = self._busy_marks
        start = marks[0]
        for mark in reversed(marks):
            if now - mark[0] >= 1_000_000_000:
                start = mark
                break
        if now - marks[-1][0] >= 250_000_000:
            marks.append((now, tracked, inferred))
        if now <= start[0]:
            return None, "busy % needs a moment of history"
        share = (busy - start[which]) / (now - start[0])
        return min(100.0, max(0.0, 100.0 * share)), reason

    def steps(self) -> StepsReading | None:
        """Steps when the program never marks them: the tracked function
        with the most time, else inferred from the jitted one, else from the
        line that syncs device->host most often (a loop's ``float(loss)``:
        functions jitted before install are not counted, their syncs are);
        None with too little history."""
        self.calls.flush()
        found = self.call_times.steps()
        if found is not None:
            return found
        syncs = [x for x in self.implicit.sites()
                 if x.kind == SiteKind.SYNC.value and ":" in x.location]
        if not syncs:
            return None
        top = max(syncs, key=lambda x: (x.count, x.location))
        if top.count < MIN_CALLS:
            return None
        where = f"{top.detail or 'sync'} at {os.path.basename(top.location)}"
        return StepsReading(count=top.count, source=STEPS_INFERRED, seconds_total=None,
                            basis=f"{where}: the most frequent device->host sync "
                                  f"({top.count:,} times); step time unknown")

    def blind_spots(self) -> list[str]:
        """What the JAX hook cannot see in this process, one sentence each:
        calls the jitted-call count misses, then transfers and syncs."""
        from metrics.engines import jax_calls

        return jax_calls.blind_spots(self._jit_hooked) + self.implicit.blind_spots()

    def devices(self) -> list[DeviceRecord]:
        """One record per local device, memory read now."""
        devs = jax.local_devices()
        busy, busy_reason = self.busy_percent()
        live: dict[int, int] | None = None
        out = []
        for d in devs:
            stats = None
            try:
                stats = d.memory_stats()
            except Exception:  # noqa: BLE001 - some plugins raise instead of None
                stats = None
            if stats:
                mem = MemoryReading(
                    used_bytes=stats.get("bytes_in_use"),
                    peak_bytes=stats.get("peak_bytes_in_use"),
                    limit_bytes=stats.get("bytes_limit"),
                    source="memory_stats",
                )
            else:
                if live is None:
                    live = _live_bytes_by_device()
                used = live.get(d.id, 0)
                peak = max(self._peak_live.get(d.id, 0), used)
                self._peak_live[d.id] = peak
                mem = MemoryReading(
                    used_bytes=used, peak_bytes=peak, limit_bytes=host_ram(),
                    source="live_arrays",
                    reason=f"{d.platform} has no allocator stats: live jax.Array bytes, "
                           "limit is host RAM; peak is the highest seen at a scrape",
                )
            out.append(DeviceRecord(
                id=d.id, kind=getattr(d, "device_kind", d.platform), platform=d.platform,
                memory=mem, busy_percent=busy, busy_reason=busy_reason,
            ))
        return out

    def versions(self) -> dict[str, str]:
        v = {"jax": jax.__version__}
        try:
            import jaxlib

            v["jaxlib"] = jaxlib.__version__
        except (ImportError, AttributeError):
            pass
        return v


def create(recorder: Recorder, explain_cache_misses: bool = True, **_: Any) -> JaxEngine:
    """The adapter ``metrics.install()`` uses; options other engines take are ignored."""
    return JaxEngine(recorder, explain_cache_misses=explain_cache_misses)


def _live_bytes_by_device() -> dict[int, int]:
    out: dict[int, int] = {}
    for arr in jax.live_arrays():
        try:
            devs = list(arr.sharding.addressable_devices)
            if len(devs) == 1:
                out[devs[0].id] = out.get(devs[0].id, 0) + arr.nbytes
                continue
            shard_shape = arr.sharding.shard_shape(arr.shape)
            n = arr.dtype.itemsize
            for dim in shard_shape:
                n *= dim
            for dev in devs:
                out[dev.id] = out.get(dev.id, 0) + n
        except Exception:  # noqa: BLE001 - deleted or exotic arrays are skipped
            continue
    return out


def _register_listeners() -> None:
    global _listeners_registered
    if _listeners_registered:
        return
    import jax.monitoring as mon

    def on_duration(event: str, duration: float, **kw: Any) -> None:
        eng = _active
        if eng is not None:
            try:
                eng.on_duration(event, duration, kw.get("fun_name"))
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    def on_event(event: str, **kw: Any) -> None:
        eng = _active
        if eng is not None:
            try:
                eng.on_event(event)
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    mon.register_event_duration_secs_listener(on_duration)
    mon.register_event_listener(on_event)
    _listeners_registered = True


def _wrap_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_get_cached(backend: Any, computation: Any, devices: Any,
                              compile_options: Any, *args: Any, **kwargs: Any) -> Any:
        eng = _active
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
        eng = _active
        if eng is not None:
            eng.on_lowering(fun_name, api_name, closed_jaxpr, in_shardings)
        return original(closed_jaxpr, api_name, fun_name, in_shardings, *args, **kwargs)

    lower_sharding_computation.__wrapped__ = original  # type: ignore[attr-defined]
    return lower_sharding_computation


def _transfer_rows(flat: list[Any], offset: float, first: int) -> Iterable[tuple[Any, ...]]:
    """Event rows of a folded batch of transfers (made when first read)."""
    w = TRANSFER_FIELDS
    return ev.rows_of(first, [e / 1e9 + offset for e in flat[2::w]],
                      [ev.TRANSFER_TO_DEVICE if t else ev.TRANSFER_FROM_DEVICE for t in flat[0::w]],
                      [float(b) for b in flat[3::w]])


def _record_transfer(eng: JaxEngine, to_device: bool, tree: Any, start: int, end: int) -> None:
    """The general case: pytrees, lists, scalars (walks the leaves)."""
    try:
        nbytes = _leaf_bytes(tree, to_device)
    except Exception as e:  # noqa: BLE001 - a hook never raises into the program
        eng.rec.hook_failed("jax.transfer", e)
        return
    q = eng.transfers_queue
    q.extend((to_device, start, end, nbytes))
    if len(q) >= FOLD_AT * TRANSFER_FIELDS:
        eng.transfers.flush()


def _wrap_device_put(original: Callable[..., Any], engine: JaxEngine) -> Callable[..., Any]:
    # Runs on every batch: names bound once, no calls but the clock's.
    clock, ndarray = time.monotonic_ns, np.ndarray
    queue, flush = engine.transfers_queue, engine.transfers.flush
    extend, fold_at = queue.extend, FOLD_AT * TRANSFER_FIELDS

    # jax.device_put(x, device=None, *, src=..., donate=..., may_alias=...):
    # the common call passes x (and a device) alone, which a plain positional
    # call forwards faster than *args/**kwargs.
    def device_put(x: Any, device: Any = None, **kwargs: Any) -> Any:
        if _active is not engine:
            return original(x, device, **kwargs)
        start = clock()
        out = original(x, device, **kwargs) if kwargs else original(x, device)
        if type(x) is ndarray:  # the usual batch: inline, no walk
            extend((True, start, clock(), x.nbytes))
            if len(queue) >= fold_at:
                flush()
        else:
            _record_transfer(engine, True, x, start, clock())
        return out

    device_put.__wrapped__ = original  # type: ignore[attr-defined]
    device_put.__doc__ = original.__doc__
    return device_put


def _wrap_device_get(original: Callable[..., Any], engine: JaxEngine) -> Callable[..., Any]:
    clock = time.monotonic_ns

    def device_get(x: Any, *args: Any, **kwargs: Any) -> Any:
        if _active is not engine:
            return original(x, *args, **kwargs)
        start = clock()
        out = original(x, *args, **kwargs)
        _record_transfer(engine, False, out, start, clock())
        return out

    device_get.__wrapped__ = original  # type: ignore[attr-defined]
    device_get.__doc__ = original.__doc__
    return device_get


