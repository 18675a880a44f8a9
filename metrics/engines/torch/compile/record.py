"""What Dynamo's events become in the recorder: a backend compile (the graph,
its wrapped callable), a frame's compilation metrics (the ledger's compile
with its cause, CompileTime, cache hits, its span for the loop's compile
steps), a graph break (GraphBreaks and its
event), and the folded calls of compiled graphs (ExecuteTime, executions per
graph, steps, the Python across breaks).

Each function takes the engine's :class:`~.context.CompileContext`; the ones
Dynamo's patches call (:mod:`.dynamo`) run inside the user's program, so a
failure is counted and swallowed, never raised.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metrics.engines.torch.compile import breaks as brk
from metrics.engines.torch.compile import eager
from metrics.engines.torch.compile.context import ACTIVE, CALL_FIELDS, ENGINE, CompileContext
from metrics.engines.torch.compile.graphs import Graph, describe, resolve_lazy
from metrics.engines.torch.compile.guards import choose_reason, parse_recompile_reason
from metrics.engines.torch.compile.steps import CompiledCall
from metrics.recording.journal import FOLD_AT
from tpu_info.contract.model import FIRST_CALL, EventKind

if TYPE_CHECKING:
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.utils import CompilationMetrics
    from torch.fx import GraphModule

__all__ = ["backend_compiled", "compilation_metrics", "graph_break", "fold_calls"]


def backend_compiled(ctx: CompileContext, output: OutputGraph, gm: GraphModule,
                     fn: Callable[..., Any], backend_ns: int) -> Callable[..., Any]:
    """A backend returned ``fn`` for ``gm``: remember the graph, wrap ``fn``."""
    try:
        graph = describe(output, gm, backend_ns)
        if graph.resume_line is not None:
            ctx.resumes = True
        ctx.call_times.compiled(graph.grad)
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.graph", e)
        return fn
    pending = ctx.thread.pending
    pending.append(graph)
    try:
        from torch._dynamo import config

        if not getattr(config, "log_compilation_metrics", True):
            _record(ctx, [graph], None, None, backend_ns / 1e9, False, None)
            pending.clear()
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.graph", e)
    if getattr(output, "package", None) is not None:
        return fn  # precompile packages serialize the callable: leave it alone
    try:
        return _runner(resolve_lazy(fn), graph)
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.wrap", e)
        return fn


def compilation_metrics(ctx: CompileContext, m: CompilationMetrics) -> None:
    """Dynamo's record of one frame's compile: the graphs its backend
    compiled meanwhile go to the ledger with the frame's cause."""
    try:
        now = time.monotonic_ns()
        ctx.gaps.compiled(now)
        if not m.is_runtime:  # a frame's compile, or its backward's: the loop's compile steps
            ctx.timeline.add(now - _compile_ns(m), now)
        if m.is_forward is False and not m.is_runtime:
            return ctx.backward.compiled(m.compile_id, (m.duration_us or 0) / 1e6)
        if m.is_forward is False or m.is_runtime:
            return None  # runtime records: no Dynamo graph of their own
        pending = ctx.thread.pending
        if not pending:
            return None
        graphs = list(pending)
        pending.clear()
        hits = (m.inductor_fx_local_cache_hit_count or 0) + (
            m.inductor_fx_remote_cache_hit_count or 0)
        misses = (m.inductor_fx_local_cache_miss_count or 0) + (
            m.inductor_fx_remote_cache_miss_count or 0)
        cache_hit = hits > 0 and misses == 0
        frame_s = m.entire_frame_compile_time_s
        reason, values = m.recompile_reason, None
        seen = ctx.thread.reasons
        ctx.thread.reasons = None
        if reason and seen and seen[0][0] == reason:
            reason, values = choose_reason(seen[0]), seen[1]
        _record(ctx, graphs, reason, m.compile_id, frame_s, cache_hit,
                brk.call_site(graphs[0].function, graphs[0].resume_line, ctx.skip), values)
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.metrics", e)
    return None


def _compile_ns(m: CompilationMetrics) -> int:
    """The wall time of one compile record (it is logged as the compile ends)."""
    if m.start_time_us is not None and m.end_time_us is not None:
        return max(0, m.end_time_us - m.start_time_us) * 1000
    if m.duration_us is not None:
        return m.duration_us * 1000
    return int((m.entire_frame_compile_time_s or 0.0) * 1e9)


def _record(ctx: CompileContext, graphs: list[Graph], reason: str | None,
            compile_id: object, frame_s: float | None, cache_hit: bool,
            location: str | None, values: dict[str, str] | None = None) -> None:
    now = time.time()
    compile_id = str(compile_id) if compile_id else None
    before_types = ctx.types.before(reason, compile_id) if reason else None
    # The recompiled graph's own input types (a part's first: the frame's inputs).
    after_types = {k: v for g in reversed(graphs) for k, v in g.types.items()} if reason \
        else None
    cause = parse_recompile_reason(reason or "", now, location, before_types, values,
                                   after_types)
    backend_total = sum(g.backend_ns for g in graphs) / 1e9
    trace_s = max(0.0, (frame_s if frame_s is not None else backend_total) - backend_total)
    if trace_s:
        ctx.trace_time.observe(trace_s * 1e9)
    ledger, events = ctx.rec.ledger, ctx.rec.events
    for g in graphs:
        if compile_id:
            ctx.types.remember(compile_id, g.types)
            ctx.backward.remember(compile_id, g.hash)
        seconds = g.backend_ns / 1e9 + trace_s / len(graphs)
        # A backend cache hit is still a Dynamo (re)compile: Dynamo traced the
        # frame again (its time, its guard failure); only the backend was loaded.
        # The cause carries this compile's own time: a recompile is charged
        # what it took, never a share of the graph's total.
        ledger.compiled(g.hash, g.name, ENGINE, seconds, g.signature,
                        dataclasses.replace(cause, seconds=seconds))
        detail = "" if cause.description == FIRST_CALL else cause.description
        if cache_hit:
            ctx.cached.inc()
            ledger.cache_hit(g.hash, g.name, ENGINE, g.signature)
            detail = f"{detail}; backend cache hit" if detail else "backend cache hit"
        else:
            ctx.uncached.inc()
            ctx.compile_time.observe(g.backend_ns)
        kind = EventKind.COMPILE if cause.description == FIRST_CALL else EventKind.RECOMPILE
        events.emit(kind, g.name, g.hash, detail, location, seconds)


def graph_break(ctx: CompileContext, tx: object, reason: object,
                exc: BaseException | None) -> None:
    """Dynamo broke the graph of ``tx`` (an instruction translator)."""
    try:
        location = brk.break_location(exc, ctx.skip)
        detail, unresumable = brk.break_detail(reason, exc)
        root = getattr(getattr(tx, "output", None), "root_tx", None) or tx
        if unresumable:  # Dynamo runs the frame (or its rest) eagerly from now on
            eager.gave_up_on(root, rest_only=unresumable == brk.UNRESUMABLE_REST)
        else:
            code, line = getattr(root, "f_code", None), getattr(root, "lineno", None)
            if code is not None and isinstance(line, int):
                # The rest of the frame resumes at the root's current line.
                function, _ = brk.function_of(code)
                ctx.gaps.located(function, line, location, f"compile({function[1]})")
        ctx.graph_breaks.inc()
        ctx.rec.events.emit(EventKind.GRAPH_BREAK, brk.break_name(tx, ctx.skip), "",
                            detail[:500], location, via=brk.library_break(exc, ctx.skip))
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.graph_break", e)


def fold_calls(ctx: CompileContext, flat: list[Any]) -> None:
    """Calls of compiled graphs (``CALL_FIELDS`` items each: graph, start,
    end) -> ExecuteTime, executions per graph, and (once a resume function
    compiled) the Python run across graph breaks."""
    graphs: list[Graph] = flat[0::CALL_FIELDS]
    starts: list[int] = flat[1::CALL_FIELDS]
    ends: list[int] = flat[2::CALL_FIELDS]
    ctx.exec_count.inc(len(ends))
    durations = list(map(operator.sub, ends, starts))
    ctx.exec_time.observe_many(durations, ends)
    uniq: set[CompiledCall] = set(graphs)
    ctx.call_times.fold(graphs, starts, ends, durations, uniq)
    executed = ctx.rec.ledger.executed
    per_graph = {graphs[0]: len(graphs)} if len(uniq) == 1 else collections.Counter(graphs)
    for graph, n in per_graph.items():
        executed(graph.hash, graph.name, ENGINE, n)
    if ctx.resumes:
        ctx.gaps.fold(graphs, starts, ends)


def _off_grad(ctx: CompileContext, graph: Graph, start: int) -> None:
    """A call of a graph compiled for gradients off: the first after each
    optimizer step is noted at the user's call of the compiled model (the
    compiled frame and its resumed parts passed over)."""
    try:
        ctx.optimizer.gaps.call_off_grad(
            ctx.optimizer.steps_so_far(),
            lambda: brk.call_site(graph.function, graph.resume_line or 0, ctx.skip),
            graph.name, start)
    except Exception as e:  # noqa: BLE001
        ctx.failed("torch_compile.gaps", e)


def _runner(fn: Callable[..., Any], graph: Graph) -> Callable[..., Any]:
    """``fn`` (a compiled graph) with each call appended to the installed
    context's journal: one clock read each side and one append."""
    clock = time.monotonic_ns  # the distributions' clock
    grad = graph.grad

    def compiled_graph(*args: Any, **kwargs: Any) -> Any:
        ctx = ACTIVE.ctx
        if ctx is None:
            return fn(*args, **kwargs)
        start = clock()
        out = fn(*args, **kwargs)
        q = ctx.calls_queue
        q.extend((graph, start, clock()))  # a record as its fields: no object kept
        if len(q) >= FOLD_AT * CALL_FIELDS:
            ctx.calls.flush()
        if not grad:  # an evaluation's forward: the gap between steps it ran in
            _off_grad(ctx, graph, start)
        return out

    compiled_graph.__wrapped__ = fn  # type: ignore[attr-defined]
    return compiled_graph
