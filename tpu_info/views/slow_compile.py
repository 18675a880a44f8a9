"""One graph that took seconds to compile (``slow_compile``), with advice
chosen from what was recorded: the line of the user's that filled it (a
Python loop unrolled into it), the backend cache's hits, and the time the
compiled steps ran in against the compile's. And one function compiled for
many shapes, each graph a first compile (``compile_per_shape``: equinox's
diffusion example built 11 ``jit(_uniform)`` graphs at start-up, one per
parameter shape, 3.6 s): none is a recompile, so the whole time is its cost.

A graph is called large only where its size was measured (``loop_ops``);
a cache is offered only where the cache did not already answer; dropping
the compile is offered only where compiling took longer than every step
that ran compiled (it cannot pay back unless eager steps would be that much
slower, which the hook did not measure).

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> list(slow_compiles(Snapshot(taken_at_unix=0.0)))
    []
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_info.contract.model import (
    FIRST_CALL,
    EventKind,
    Finding,
    GraphRecord,
    Phase,
    RecompileCause,
    Severity,
    Snapshot,
)
from tpu_info.contract.phases import bursts_phase, phase_of
from tpu_info.views.compile_parts import (
    CACHE_ADVICE,
    JAX_CACHE_MIN_S,
    NO_CACHE,
    RULE,
    cache_words,
)
from tpu_info.views.cost import (
    WHEN,
    cost_of,
    duration,
    engine_of,
    outside_warns,
    share_words,
    short_location,
    size_words,
    steps_of,
)
from tpu_info.views.eager import single_op
from tpu_info.views.recompile_groups import recompile_severity

# Arrays closed over (compiled in as constants) from this many bytes are
# named as the graph's likely weight: a jit's closure over a model's weights.
CONST_BYTES = 1 << 20

# One compile this long and this large a share of the time the user waits for
# the work (the step loop's wall time, its compiles left out; the run's where
# the steps were not timed) is news on its own: not of the process's uptime,
# whose imports and set-up a longer loop does not grow. A second is JAX's own
# bar for keeping a compile in its persistent cache
# (jax_persistent_cache_min_compile_time_secs, 1 s by default).
SLOW_COMPILE_S = 1.0
SLOW_COMPILE_SHARE = 0.1
# A graph whose calls are at least this many per step runs in the steps:
# their wall time holds all of its runs in the loop.
PER_STEP_CALLS = 0.9
# A function compiled to this many graphs with no cause told (the recompile
# rule's bar for a function with no cause recorded): fewer are a model's set-up.
PER_SHAPE_GRAPHS = 10


def _steps_time(s: Snapshot, g: GraphRecord) -> tuple[int, float] | None:
    """``(steps, seconds)``: the steps the graph ran in (at least once each)
    and their wall time, compiles inside the loop left out; None when the
    graph is not the steps' or they were not timed."""
    steps = steps_of(s)
    if (steps is None or not steps.count or steps.seconds_total is None
            or (g.executions or 0) < PER_STEP_CALLS * steps.count):
        return None
    return steps.count, max(0.0, steps.seconds_total - steps.compile_seconds)


def _loop_seconds(s: Snapshot) -> float | None:
    """The step loop's wall time, the compiles inside it left out: the
    time the user waits for the work a compile is weighed against; None
    when the steps were not timed."""
    steps = steps_of(s)
    if steps is None or not steps.count or steps.seconds_total is None:
        return None
    loop = steps.seconds_total - steps.compile_seconds
    return loop if loop > 0 else None


def _advice(s: Snapshot, g: GraphRecord, seconds: float) -> str:
    """What to do, from what was recorded (see the module's words)."""
    engine = g.engine or engine_of(s)
    cache = CACHE_ADVICE.get(engine, NO_CACHE).replace(" loads them.", " loads it.")
    if engine == "jax" and seconds < 2 * JAX_CACHE_MIN_S:
        cache += (f" By default it keeps only compiles of {duration(JAX_CACHE_MIN_S)} or more "
                  f"by JAX's own clock ({RULE}): lower that if this one is not kept.")
    hits = g.cache_hits
    if g.loop_line:  # the hook saw one line fill the graph (a Python loop unrolled)
        return (f"a large graph: {g.loop_ops:,} of its operations come from "
                f"{short_location(g.loop_line)}, a Python loop unrolled into it. Do the "
                f"work over the whole axis at once (jnp ops, jax.vmap) or as lax.fori_loop / "
                f"lax.scan, which compile the body once"
                + (f"; or: {cache[0].lower()}{cache[1:]}" if not hits else "."))
    if g.const_bytes >= CONST_BYTES:  # arrays the traced function closed over
        return (f"its graph holds {size_words(g.const_bytes)} of arrays the function closed "
                "over (not passed as arguments), compiled into the program as constants: XLA "
                "may fold them while compiling (its 'Constant folding an instruction is "
                "taking > 1s' alarms say so), and they never change between calls (weights "
                "closed over do not train). Pass them as arguments (in flax nnx, as nnx.Param "
                "or nnx.Variable attributes of a Module the jitted function takes)"
                + (f"; or: {cache[0].lower()}{cache[1:]}" if not hits else "."))
    warm = (f"the backend cache answered it already ({hits} cache hit{'s' * (hits > 1)}), "
            "so a warm cache will not cut this further" if hits else "")
    ran = _steps_time(s, g)
    if ran is not None and seconds > ran[1]:
        count, loop = ran
        even = (seconds + loop) / count  # an eager step this long breaks even
        head = (f"that is more than all {count:,} steps that ran it took "
                f"({duration(loop)}, {duration(loop / count)} each), so it pays back only if "
                f"eager steps would take over {duration(even)} each")
        if engine == "torch_compile":
            cut = ("; with a warm FX graph cache (TORCHINDUCTOR_CACHE_DIR kept across runs) "
                   "later runs compile faster" if not hits else f"; {warm}")
            return (f"{head}. In a run this short, run it eagerly (no torch.compile), or "
                    f"torch.compile only the part where the time goes{cut}.")
        return f"{head}; {warm}." if hits else f"{head}. {cache}"
    if hits:
        return f"{warm}: it is paid once per process start, and a longer run spreads it out."
    return cache


def _slow(s: Snapshot, loop: float | None) -> Iterable[tuple[GraphRecord, RecompileCause,
                                                               float]]:
    """``(graph, its first call, one compile's seconds)`` of each graph
    :func:`slow_compiles` speaks of."""
    for g in s.graphs:
        first = next((c for c in g.causes if c.description == FIRST_CALL), None)
        if not g.compiles or single_op(g.name) or first is None or not first.location:
            continue
        seconds = g.compile_seconds_total / g.compiles  # one compile of this graph
        if seconds < SLOW_COMPILE_S or s.uptime_seconds <= 0 or (
                seconds < SLOW_COMPILE_SHARE * (loop or s.uptime_seconds)):
            continue
        yield g, first, seconds


def slow_graphs(s: Snapshot) -> frozenset[str]:
    """The hashes of the graphs a ``slow_compile`` finding names."""
    return frozenset(g.hash for g, _, _ in _slow(s, _loop_seconds(s)))


def slow_compiles(s: Snapshot) -> Iterable[Finding]:
    """A single graph whose compile took a second or more and a tenth of the
    step loop's own time (of the run's where the steps were not timed: a
    large model, a Python loop unrolled into it): one-off work, named
    with its function, its line and its phase. Only a function's first graph
    compiled from the program's own line: a recompile is its cause's finding,
    and a library's own set-up graph (no line of the program) is not news."""
    steps = steps_of(s)
    loop = _loop_seconds(s)
    # The graphs one line compiled in one phase are one finding: a
    # torch.compile'd model's graphs split by graph breaks, each a first
    # compile (PyG's GAT: 39 s of first step said as six findings, the
    # largest 14.5 s), the costliest graph's advice.
    by_line: dict[tuple[str | None, Phase, Phase], list[tuple[GraphRecord, float]]] = {}
    for g, first, seconds in _slow(s, loop):
        when = first.time_unix
        told = phase_of(when, when, 1, steps)
        phase = told if told in (Phase.SETUP, Phase.TEARDOWN) else Phase.ONCE  # one-off
        by_line.setdefault((first.location, phase, told), []).append((g, seconds))
    for (location, phase, told), slow in by_line.items():
        slow.sort(key=lambda gs: -gs[1])
        g, top = slow[0]
        parts = slow + _same_line(s, location, {x.hash for x, _ in slow}) if len(slow) > 1 else slow
        seconds = sum(t for _, t in parts)
        c = cost_of(s, seconds, 1, phase=phase)
        at = f", {WHEN[phase]}" if told != Phase.UNKNOWN else ""
        against = "" if not loop else (
            f"as long as {share_words(seconds / loop)} of the step loop, {duration(loop)} "
            "without its compiles; " if seconds < loop else
            f"{seconds / loop:.1f}x the step loop's {duration(loop)} without its compiles; ")
        what = (g.name if len(parts) == 1 else
                f"{len(parts)} graphs ({', '.join(dict.fromkeys(x.name for x, _ in parts[:3]))}"
                f"{', ...' if len(parts) > 3 else ''}; the largest {duration(top)})")
        yield Finding(
            f"{what} at {short_location(location)} took {duration(seconds)} to "
            f"compile once{at} ({against}{share_words(seconds / s.uptime_seconds)} of run "
            f"time so far, measured): {_advice(s, g, seconds)}",
            Severity.WARNING if outside_warns(c) else Severity.INFO,
            location, kind="slow_compile", **c.fields())


def _same_line(s: Snapshot, location: str | None,
               told: set[str]) -> list[tuple[GraphRecord, float]]:
    """The other graphs first compiled from ``location`` (not single ops, not
    in ``told``): the rest of what that line compiled, each one compile."""
    out = []
    for g in s.graphs:
        first = next((c for c in g.causes if c.description == FIRST_CALL), None)
        if (g.hash not in told and g.compiles and first is not None
                and first.location == location and not single_op(g.name)):
            out.append((g, g.compile_seconds_total / g.compiles))
    return out


def _first_line(s: Snapshot, first: GraphRecord) -> tuple[str | None, str]:
    """``(line, via)`` of ``first``'s compile: its compile event's, else its
    first call's; ``(None, "")`` where neither is known (the ring moved on)."""
    e = next((e for e in s.events if e.kind == EventKind.COMPILE and e.location
              and e.graph_hash == first.hash), None)
    if e is not None:
        return e.location, e.via
    return next((c.location for c in first.causes if c.location), None), ""


def per_shape(s: Snapshot, name: str, graphs: list[GraphRecord]) -> Finding | None:
    """``name`` compiled to many graphs, each once and none for a cause the
    hook told (a library's jitted function called at a new shape each time:
    ``jax.random.uniform`` per parameter): each is a first compile, so no
    recompile cost leaves them out; the cost is their whole compile time,
    at the line of the first one, severe by the recompile findings' rule.
    The advice: fewer shapes, and the cache across runs in compile_share's
    words. None where ``graphs`` are not that."""
    compiled = [g for g in graphs if g.compiles]
    if (len(compiled) < PER_SHAPE_GRAPHS or single_op(name) or any(
            g.compiles > 1 or any(c.description != FIRST_CALL for c in g.causes)
            for g in compiled)):
        return None
    total = sum(g.compile_seconds_total for g in compiled)
    line, via = _first_line(s, min(compiled, key=lambda g: g.first_seen_unix))
    phase, _ = bursts_phase(sorted(g.first_seen_unix for g in compiled), steps_of(s))
    c = cost_of(s, total, len(compiled), phase=phase)
    cache = cache_words(compiled[0].engine or engine_of(s), compiled,
                        sum(1 for g in s.graphs if g.cache_hits))
    at = f" from {short_location(line)}" + (f" (via {via})" if via else "") if line else ""
    return Finding(
        f"{name} compiled {len(compiled)} graphs{at}, one per shape it was called with, each "
        f"its first compile ({duration(total)} compiling, {c.tail()}): pad or bucket those "
        f"shapes to a few sizes so fewer graphs compile; {cache}.",
        recompile_severity(c, expected=False), line, kind="compile_per_shape", **c.fields())
