"""torch.compile (Dynamo) engine hook.

``torch.compile(model)`` with any backend; the hook watches Dynamo from outside:

* Each graph Dynamo hands to the backend (``UncachedCompile``, or
  ``CachedCompile`` when the backend answered from its cache), the backend's
  compile time (``CompileTime``) and Dynamo's own tracing time
  (``TraceTime``); per graph in the ledger, the whole frame's compile time.
* The graph hash: sha256 over the backend's name, the FX graph's code and the
  input signature (symbolic sizes included), so it is stable across runs and
  when the source moves. The signature lists the user's inputs
  (``x: f32[s77,3]``); parameters and buffers count in the hash only.
* Recompile causes: Dynamo's guard failures parsed into argument / before /
  after (:mod:`metrics.engines.torch.compile.guards`), with the user's call site.
  Dynamo checks every cached graph and its metrics keep the first failure
  only; the hook sees them all and keeps the first that is not a
  global-state change (after an eval graph under ``no_grad``, a training
  call at a new size is a size change).
* A backend (Inductor FX/AOT) cache hit is still a Dynamo (re)compile: in the
  ledger with its time and cause, and a cache hit (``CachedCompile``).
* The backward compiled at the first ``backward()`` adds to its forward's
  time (:mod:`metrics.engines.torch.compile.backward`).
* Graph breaks (``GraphBreaks``, and a ``graph_break`` event with the reason
  and the user's line); the Python time across a break Dynamo resumes from,
  and the eager time of a frame it gave up on
  (:mod:`metrics.engines.torch.compile.breaks`).
* Steps: the optimizer's (:mod:`metrics.engines.torch.optim`), else compiled
  calls with gradients on (:mod:`metrics.engines.torch.compile.steps`).
* Executions of each compiled graph and their time (``ExecuteComputation``,
  ``ExecuteTime``): the backend's callable is wrapped (forward graphs only;
  backward runs inside autograd).
* Device memory at scrape time from ``torch.cuda`` where CUDA is in use,
  else a CPU record that says why there is none; device traces: torch.profiler.

If ``torch._dynamo`` is not imported yet at install time (importing it costs
about a second), ``torch.compile`` is wrapped and the Dynamo hooks go in on
its first call.

Private APIs used (each behind a check that degrades the feature, never
crashes; ``TorchCompileEngine.degraded`` lists what was unavailable):

* ``torch._dynamo.output_graph.OutputGraph.call_user_compiler`` (wrapped:
  one backend compile; ``self.root_tx.f_code``, ``self.compiler_fn``,
  ``self.package``; placeholders' ``_dynamo_source`` and
  ``meta["example_value"]``)
* ``torch._dynamo.utils.log_compilation_event`` (wrapped: receives each
  ``CompilationMetrics`` record; needs ``config.log_compilation_metrics``)
* ``torch._dynamo.symbolic_convert.InstructionTranslatorBase.log_graph_break``
  (wrapped: one graph break; ``exc.gb_type``, ``exc.real_stack``)
* ``torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons``
  (wrapped: every cached graph's guard failure and the frame's locals)
* ``torch.fx._lazy_graph_module._LazyGraphModule`` (resolved before wrapping)
"""

from __future__ import annotations

import collections
import functools
import hashlib
import operator
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from metrics.engines import device_profilers, ranks
from metrics.engines._frames import skip_prefixes
from metrics.engines._patching import Patches
from metrics.engines.base import EngineBase
from metrics.engines.torch import devices
from metrics.engines.torch import optim as torch_optim
from metrics.engines.torch import syncs as torch_syncs
from metrics.engines.torch.compile import breaks as brk
from metrics.engines.torch.compile import graphs as tu
from metrics.engines.torch.compile.backward import BackwardCompiles
from metrics.engines.torch.compile.guards import (
    TypesByCompile,
    choose_reason,
    frame_values,
    parse_recompile_reason,
    source_name,
)
from metrics.engines.torch.compile.steps import GradModeSteps
from metrics.recording.journal import FOLD_AT
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names
from tpu_info.contract.model import (
    FIRST_CALL,
    DeviceRecord,
    EventKind,
    SiteReading,
    StepsReading,
)

ENGINE = "torch_compile"
CALL_FIELDS = 3  # a compiled graph's call in the journal: (graph, start, end)
UNRESUMABLE = brk.UNRESUMABLE

_tls = threading.local()
_active: TorchCompileEngine | None = None


class _Graph:
    """One backend compile waiting for its frame's compilation metrics."""

    __slots__ = ("hash", "name", "signature", "types", "backend_ns", "qualname", "function",
                 "resume_line", "break_key", "grad", "partial")

    def __init__(self, graph_hash: str, code: Any, signature: tuple[str, ...],
                 types: dict[str, str], backend_ns: int, grad: bool = True) -> None:
        self.hash = graph_hash
        self.qualname = getattr(code, "co_qualname", code.co_name)
        self.name = brk.display_name(self.qualname)
        # The user's function and the line this part resumes at (None: its start).
        self.function, self.resume_line = brk.function_of(code)
        # The break this part follows (BreakGaps pairs its calls), None for the start.
        self.break_key = None if self.resume_line is None else (self.function, self.resume_line)
        self.signature = signature
        self.types = types
        self.backend_ns = backend_ns
        # Compiled for calls with gradients on (Dynamo guards on grad mode: a
        # no_grad call runs a graph of its own): training, not evaluation.
        self.grad = grad
        # The compiled part of a frame whose rest runs eagerly (brk.outside_graphs).
        self.partial = brk.is_partial(code)


class TorchCompileEngine(EngineBase):
    """Installs and removes the Dynamo hooks; one active per process."""

    name = ENGINE
    device_trace_kind = device_profilers.TorchTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True) -> None:
        self.rec = recorder
        self.degraded: list[str] = []
        self._patches = Patches(self.degraded)
        self._dynamo_hooked = False
        self._lock = threading.Lock()
        self._types = TypesByCompile()
        self._skip = skip_prefixes(torch)
        dist, counter = recorder.distribution, recorder.counter
        self._compile_time = dist(names.COMPILE_TIME)
        self._trace_time = dist(names.TRACE_TIME)
        self._uncached = counter(names.UNCACHED_COMPILE)
        self._cached = counter(names.CACHED_COMPILE)
        self._exec_count = counter(names.EXECUTE_COUNT)
        self._exec_time = dist(names.EXECUTE_TIME)
        self._graph_breaks = counter(names.GRAPH_BREAKS)
        self._eager_time = dist(names.EAGER_FALLBACK_TIME)
        # Calls of compiled graphs: one append each, folded before reads.
        self.calls = recorder.journal(self._fold_calls)
        self.calls_queue = self.calls.queue
        self.call_times = GradModeSteps(to_unix=recorder.mono_to_unix)  # steps from calls
        self.gaps = brk.BreakGaps()  # Python across resumable graph breaks
        self._resumes = False  # a resume function compiled: pair calls at fold time
        self.syncs: torch_syncs.SyncReads | None = None  # tensor reads, while installed
        self.optimizer = torch_optim.OptimizerSteps(recorder)  # the training step, if any
        recorder.on_reset(self.call_times.clear)
        recorder.on_reset(self.gaps.clear)
        self.backward = BackwardCompiles(recorder)  # compiled lazily, at backward()

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        global _active
        _active = self
        brk.watch(self._eager_time, self.rec.hook_failed, self.calls_queue)
        self.syncs = torch_syncs.attach(self)
        self.optimizer.install(self.degraded)
        if "torch._dynamo" in sys.modules:
            self.hook_dynamo()
        # Hooks Dynamo on first use, and times what it returns once Dynamo
        # gives up on that frame (an unresumable graph break).
        self._patches.apply(torch, "compile", _wrap_torch_compile)

    def uninstall(self) -> None:
        global _active
        if _active is self:
            _active = None
            brk.unwatch()
        torch_syncs.detach(self)
        self.syncs = None
        self.optimizer.uninstall()
        self._patches.restore()
        self._dynamo_hooked = False

    def hook_dynamo(self) -> None:
        """Puts the Dynamo hooks in (idempotent); imports ``torch._dynamo``."""
        with self._lock:
            if self._dynamo_hooked:
                return
            self._dynamo_hooked = True
            try:
                import torch._dynamo  # noqa: F401
                from torch._dynamo import config, output_graph, symbolic_convert
                from torch._dynamo import utils as dynamo_utils
            except Exception as e:  # noqa: BLE001 - a broken Dynamo must not break the program
                self.degraded.append(f"torch._dynamo unavailable: {e}")
                return
            hidden = torch_syncs.hide_from_dynamo()
            if hidden is not None:
                self.degraded.append(hidden)
            patch = self._patches.apply
            patch(output_graph.OutputGraph, "call_user_compiler", _wrap_call_user_compiler,
                  ("self", "gm", "example_inputs"))
            if patch(dynamo_utils, "log_compilation_event", _wrap_log_compilation_event):
                if not getattr(config, "log_compilation_metrics", True):
                    self.degraded.append("torch._dynamo.config.log_compilation_metrics is off: "
                                         "no recompile causes, graphs recorded without them")
            self._patches.apply(symbolic_convert.InstructionTranslatorBase, "log_graph_break",
                        _wrap_log_graph_break, ("self", "code_options", "reason", "exc"))
            try:
                from torch._dynamo import convert_frame
            except Exception as e:  # noqa: BLE001
                self.degraded.append(f"torch._dynamo.convert_frame unavailable: {e}")
            else:
                # Every cached graph's guard failure (metrics keep only the first).
                patch(convert_frame, "get_and_maybe_log_recompilation_reasons",
                      _wrap_recompilation_reasons, ("cache_entries", "frame"))

    # Callbacks (each runs inside the user's program: guarded) --------------

    def on_backend_compiled(self, output: Any, gm: Any, fn: Any, backend_ns: int) -> Any:
        """A backend returned ``fn`` for ``gm``: remember the graph, wrap ``fn``."""
        try:
            graph = self._describe(output, gm, backend_ns)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_compile.graph", e)
            return fn
        pending = getattr(_tls, "pending", None)
        if pending is None:
            pending = _tls.pending = []
        pending.append(graph)
        try:
            from torch._dynamo import config

            if not getattr(config, "log_compilation_metrics", True):
                self._record([graph], None, None, backend_ns / 1e9, False, None)
                pending.clear()
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_compile.graph", e)
        if getattr(output, "package", None) is not None:
            return fn  # precompile packages serialize the callable: leave it alone
        try:
            return _runner(tu.resolve_lazy(fn), graph)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_compile.wrap", e)
            return fn

    def _describe(self, output: Any, gm: Any, backend_ns: int) -> _Graph:
        code = output.root_tx.f_code
        backend = output.compiler_fn
        backend_name = (getattr(backend, "compiler_name", None)
                        or getattr(backend, "__name__", None) or type(backend).__name__)
        sig: list[str] = []
        types: dict[str, str] = {}
        hashed: list[str] = [str(backend_name), gm.code]
        for node in gm.graph.find_nodes(op="placeholder"):
            value = node.meta.get("example_value")
            src = getattr(node, "_dynamo_source", None)
            src_name = source_name(str(src.name)) if src is not None else node.name
            t = tu.tensor_type(value)
            hashed.append(f"{src_name}:{t if t is not None else type(value).__name__}")
            if t is None:
                continue  # SymInts: their symbols already show in the shapes
            if isinstance(value, torch.nn.Parameter) or "._parameters[" in str(
                    getattr(src, "name", "")) or "._buffers[" in str(getattr(src, "name", "")):
                continue
            sig.append(f"{src_name}: {t}")
            types[src_name] = t
        digest = hashlib.sha256("\n".join(hashed).encode()).hexdigest()[:32]
        # Dynamo compiles under the calling frame's grad mode (a guard of the graph).
        graph = _Graph(digest, code, tuple(sig), types, backend_ns, torch.is_grad_enabled())
        if graph.resume_line is not None:
            self._resumes = True
        self.call_times.compiled(graph.grad)
        return graph

    def on_compilation_metrics(self, m: Any) -> None:
        try:
            self.gaps.compiled(time.monotonic_ns())
            if m.is_forward is False and not m.is_runtime:
                return self.backward.compiled(m.compile_id, (m.duration_us or 0) / 1e6)
            if m.is_forward is False or m.is_runtime:
                return  # runtime records: no Dynamo graph of their own
            pending = getattr(_tls, "pending", None)
            if not pending:
                return
            graphs = list(pending)
            pending.clear()
            hits = (m.inductor_fx_local_cache_hit_count or 0) + (
                m.inductor_fx_remote_cache_hit_count or 0)
            misses = (m.inductor_fx_local_cache_miss_count or 0) + (
                m.inductor_fx_remote_cache_miss_count or 0)
            cache_hit = hits > 0 and misses == 0
            frame_s = m.entire_frame_compile_time_s
            reason, values = m.recompile_reason, None
            seen = getattr(_tls, "reasons", None)
            _tls.reasons = None
            if reason and seen and seen[0][0] == reason:
                reason, values = choose_reason(seen[0]), seen[1]
            self._record(graphs, reason, m.compile_id, frame_s, cache_hit,
                         brk.call_site(graphs[0].function, graphs[0].resume_line,
                                       self._skip), values)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_compile.metrics", e)

    def _record(self, graphs: list[_Graph], reason: str | None, compile_id: str | None,
                frame_s: float | None, cache_hit: bool, location: str | None,
                values: dict[str, str] | None = None) -> None:
        now = time.time()
        before_types = self._types.before(reason, compile_id) if reason else None
        cause = parse_recompile_reason(reason or "", now, location, before_types, values)
        backend_total = sum(g.backend_ns for g in graphs) / 1e9
        trace_s = max(0.0, (frame_s if frame_s is not None else backend_total) - backend_total)
        if trace_s:
            self._trace_time.observe(trace_s * 1e9)
        ledger, events = self.rec.ledger, self.rec.events
        for g in graphs:
            if compile_id:
                self._types.remember(str(compile_id), g.types)
                self.backward.remember(str(compile_id), g.hash)
            seconds = g.backend_ns / 1e9 + trace_s / len(graphs)
            # A backend cache hit is still a Dynamo (re)compile: Dynamo traced the
            # frame again (its time, its guard failure); only the backend was loaded.
            ledger.compiled(g.hash, g.name, ENGINE, seconds, g.signature, cause)
            detail = "" if cause.description == FIRST_CALL else cause.description
            if cache_hit:
                self._cached.inc()
                ledger.cache_hit(g.hash, g.name, ENGINE, g.signature)
                detail = f"{detail}; backend cache hit" if detail else "backend cache hit"
            else:
                self._uncached.inc()
                self._compile_time.observe(g.backend_ns)
            kind = EventKind.COMPILE if cause.description == FIRST_CALL else EventKind.RECOMPILE
            events.emit(kind, g.name, g.hash, detail, location, seconds)

    def on_graph_break(self, tx: Any, reason: str, exc: Any) -> None:
        try:
            location = brk.break_location(exc, self._skip)
            detail, unresumable = brk.break_detail(reason, exc)
            root = getattr(getattr(tx, "output", None), "root_tx", None) or tx
            if unresumable:  # Dynamo runs the frame (or its rest) eagerly from now on
                brk.gave_up_on(root, rest_only=unresumable == brk.UNRESUMABLE_REST)
            elif getattr(root, "f_code", None) is not None and isinstance(
                    getattr(root, "lineno", None), int):
                # The rest of the frame resumes at the root's current line.
                function, _ = brk.function_of(root.f_code)
                self.gaps.located(function, root.lineno, location, f"compile({function[1]})")
            self._graph_breaks.inc()
            self.rec.events.emit(EventKind.GRAPH_BREAK, brk.break_name(tx, self._skip), "",
                                 detail[:500], location)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_compile.graph_break", e)

    def _fold_calls(self, flat: list[Any]) -> None:
        """Calls of compiled graphs (``CALL_FIELDS`` items each: graph,
        start, end) -> ExecuteTime, executions per graph, and (once a resume
        function compiled) the Python run across graph breaks."""
        graphs, starts, ends = flat[0::CALL_FIELDS], flat[1::CALL_FIELDS], flat[2::CALL_FIELDS]
        self._exec_count.inc(len(ends))
        durations = list(map(operator.sub, ends, starts))
        self._exec_time.observe_many(durations, ends)
        uniq = set(graphs)
        self.call_times.fold(graphs, starts, ends, durations, uniq)
        executed = self.rec.ledger.executed
        per_graph = {graphs[0]: len(graphs)} if len(uniq) == 1 else collections.Counter(graphs)
        for graph, n in per_graph.items():
            executed(graph.hash, graph.name, ENGINE, n)
        if self._resumes:
            self.gaps.fold(graphs, starts, ends)

    # Scrape time -----------------------------------------------------------

    def steps(self) -> StepsReading | None:
        """Optimizer steps, else compiled graph calls (:mod:`.steps`)."""
        self.calls.flush()
        return self.call_times.beside(self.optimizer.steps(), self.optimizer.step_time_note)

    def sites(self) -> list[SiteReading]:
        """Resumable graph breaks with the Python time across them (measured),
        and the program's reads of tensor values (:mod:`~metrics.engines.torch.syncs`)."""
        self.calls.flush()
        syncs = self.syncs
        return self.gaps.sites() + (syncs.sites(self) if syncs is not None else [])

    def blind_spots(self) -> list[str]:
        """The tensor reads the sync hook does not count (:mod:`~metrics.engines.torch.syncs`)."""
        syncs = self.syncs
        return syncs.blind_spots(self) if syncs is not None else []

    def devices(self) -> list[DeviceRecord]:
        """CUDA devices, or a CPU record with the reason (none when torch_xla
        is loaded: its adapter lists the devices the program uses)."""
        if "torch_xla" in sys.modules and not torch.cuda.is_available():
            return []
        return devices.torch_devices(torch)

    def rank(self) -> ranks.Rank | None:
        return ranks.from_torch_distributed()

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


def create(recorder: Recorder, explain_cache_misses: bool = True, **_: Any) -> TorchCompileEngine:
    """The adapter ``metrics.install()`` uses; other engines' options are ignored."""
    return TorchCompileEngine(recorder, explain_cache_misses=explain_cache_misses)


# Module-level wrappers: they look up the active engine at call time, so
# uninstall() only has to restore attributes and clear ``_active``.

def _runner(fn: Callable[..., Any], graph: _Graph) -> Callable[..., Any]:
    clock = time.monotonic_ns  # the distributions' clock

    def compiled_graph(*args: Any, **kwargs: Any) -> Any:
        eng = _active
        if eng is None:
            return fn(*args, **kwargs)
        start = clock()
        out = fn(*args, **kwargs)
        q = eng.calls_queue
        q.extend((graph, start, clock()))  # a record as its fields: no object kept
        if len(q) >= FOLD_AT * CALL_FIELDS:
            eng.calls.flush()
        return out

    compiled_graph.__wrapped__ = fn  # type: ignore[attr-defined]
    return compiled_graph


def _wrap_call_user_compiler(original: Callable[..., Any]) -> Callable[..., Any]:
    def call_user_compiler(self: Any, gm: Any, example_inputs: Any, *args: Any,
                           **kwargs: Any) -> Any:
        eng = _active
        if eng is None:
            return original(self, gm, example_inputs, *args, **kwargs)
        start = time.perf_counter_ns()
        fn = original(self, gm, example_inputs, *args, **kwargs)
        return eng.on_backend_compiled(self, gm, fn, time.perf_counter_ns() - start)

    return call_user_compiler


def _wrap_log_compilation_event(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_compilation_event(metrics: Any, *args: Any, **kwargs: Any) -> Any:
        eng = _active
        if eng is not None:
            eng.on_compilation_metrics(metrics)
        return original(metrics, *args, **kwargs)

    return log_compilation_event


def _wrap_log_graph_break(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_graph_break(self: Any, code_options: Any, reason: Any, exc: Any, *args: Any,
                        **kwargs: Any) -> Any:
        eng = _active
        new = eng is not None and not getattr(exc, "logged", False)
        out = original(self, code_options, reason, exc, *args, **kwargs)
        if new:
            eng.on_graph_break(self, reason, exc)  # type: ignore[union-attr]
        return out

    return log_graph_break


def _wrap_recompilation_reasons(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_and_maybe_log_recompilation_reasons(cache_entries: Any, frame: Any, *args: Any,
                                                **kwargs: Any) -> Any:
        reasons = original(cache_entries, frame, *args, **kwargs)
        if _active is not None and reasons:
            try:
                _tls.reasons = (list(reasons), frame_values(frame))
            except Exception as e:  # noqa: BLE001
                _active.rec.hook_failed("torch_compile.reasons", e)
        return reasons

    return get_and_maybe_log_recompilation_reasons


def _wrap_torch_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's own name
        eng = _active
        if eng is not None:
            eng.hook_dynamo()
        out = original(*args, **kwargs)
        model = args[0] if args else kwargs.get("model")
        if model is None:  # torch.compile(backend=...) used as a decorator factory
            return brk.time_decorated(out) if callable(out) else out
        return brk.time_compiled(model, out)

    return compile
