"""Graphs first compiled inside the step loop (``compile_share``'s words):
the loop, its first evaluation or its first step waited for each.

A graph's first compile (its end, ``first_seen_unix``, less one compile's
time) in the step loop is the loop's, as slow_compile places it
(:func:`~tpu_info.contract.phases.phase_of`); the steps' own graphs (the
one the steps are counted by, and those run in nearly every step outside
any recurring work) are left out: every loop compiles its step first.
Work that recurs in the loop but began before its first step (an
evaluation at ``step % 100 == 0`` ahead of the step at step 0) ended its
compile just before the loop's start: a graph whose first call's line is
that recurring work's, compiled within :data:`STEP0_S` of the loop's
start, is step 0's. The work is named where the hook told it (the line
that led the gap, ``work``, and the lines ``within`` it).

haiku's LSTM example compiled ``jit(loss)`` (0.5 s) at its first
validation, step 0; optax's adversarial_training example ``jit(pgd_attack)``
(1.9 s, 7 % of a 27 s loop, under slow_compile's bar) at its first
evaluation: both were among compile_share's "other graphs", or in no
finding, with nothing saying the loop paid them. Said from
:data:`MIN_SECONDS` and :data:`MIN_SHARE` of the loop's time even where
compiling as a whole is a small share of the run.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> first_in_loop(Snapshot(taken_at_unix=0.0), [])
    []
"""

from __future__ import annotations

from collections.abc import Sequence

from tpu_info.contract.model import FIRST_CALL, GraphRecord, Phase, SiteReading, Snapshot
from tpu_info.contract.phases import loop_of, phase_of
from tpu_info.views.compile_parts import JAX_CACHE_MIN_S, RULE, cache_words
from tpu_info.views.cost import duration, engine_of, short_location, steps_of
from tpu_info.views.eager import single_op

STEP_GRAPH_CALLS = 0.9  # calls per step from which a graph is the steps' (slow_compile's)
STEP0_S = 1.0  # recurring work's compile this close before the loop's start: step 0's
MIN_SECONDS = 0.5  # said on its own (compiling a small share of the run) from here
MIN_SHARE = 0.02  # ... and this share of the step loop's wall time
_WHY = ": by default it keeps only compiles of "


def _leader(s: Snapshot, location: str) -> SiteReading | None:
    """The site that led the recurring work ``location`` ran in: the line's
    own where it led a gap, else the line its sites sat ``within``."""
    at = [x for x in s.sites if x.location == location]
    led = next((x for x in at if x.work), None)
    within = next((x.within for x in at if x.within), "")
    return led or next((x for x in s.sites if within and x.location == within and x.work),
                       None)


def first_in_loop(s: Snapshot, graphs: Sequence[GraphRecord]) -> list[tuple[GraphRecord, str]]:
    """``(graph, where)`` of each of ``graphs`` whose first compile fell in
    the step loop (see the module's words); ``where`` names the step or the
    work ("" where neither is known)."""
    steps = steps_of(s)
    loop = loop_of(steps)
    if steps is None or loop is None:
        return []
    out = []
    for g in graphs:
        if not g.compiles or single_op(g.name) or not g.first_seen_unix:
            continue
        first = next((c for c in g.causes if c.description == FIRST_CALL), None)
        lead = _leader(s, first.location) if first and first.location else None
        if g.name in steps.basis or (lead is None and (g.executions or 0)
                                     >= STEP_GRAPH_CALLS * steps.count):
            continue  # the step's own graph: its first compile is the first step's
        start = g.first_seen_unix - g.compile_seconds_total / g.compiles
        phase = phase_of(start, start, 1, steps)
        if phase in (Phase.ONCE, Phase.PERIODIC, Phase.STEP):
            out.append((g, f"in the {lead.work} led by {short_location(lead.location)}"
                        if lead else ""))
        elif (phase == Phase.SETUP and lead is not None and lead.phase == Phase.PERIODIC.value
              and g.first_seen_unix >= loop[0] - STEP0_S):
            out.append((g, f"at step 0: the {lead.work} at {short_location(lead.location)}, "
                           "before the first step"))
    return out


def worth_saying(s: Snapshot, found: Sequence[tuple[GraphRecord, str]]) -> bool:
    """The first compiles in the loop took :data:`MIN_SECONDS` and
    :data:`MIN_SHARE` of its wall time: news even where compiling as a whole
    is a small share of the run."""
    steps = steps_of(s)
    seconds = sum(g.compile_seconds_total / g.compiles for g, _ in found)
    loop = steps.seconds_total if steps is not None else None
    return bool(loop) and seconds >= MIN_SECONDS and seconds >= MIN_SHARE * (loop or 0.0)


def in_loop_part(s: Snapshot, found: Sequence[tuple[GraphRecord, str]]) -> tuple[str, str]:
    """``found`` in words: each graph with its time and where, then the
    advice (warm it before the loop, or the cache across runs); in full, and
    brief (the cache's bar without its reason) for a message near its length."""
    ranked = sorted(found, key=lambda x: -x[0].compile_seconds_total)
    wheres = {w for _, w in ranked}
    one = len(wheres) == 1
    items = [f"{g.name} {duration(g.compile_seconds_total / g.compiles)}"
             + (f" ({w})" if w and not one else "") for g, w in ranked[:2]]
    if len(ranked) > 2:
        items.append(f"{len(ranked) - 2} more")
    where = f" ({next(iter(wheres))})" if one and next(iter(wheres)) else ""
    them = "them" if len(ranked) > 1 else "it"
    said = (f"{', '.join(items)} first compiled inside the step loop{where}, so the loop "
            f"waited for {them}: call {them} once before the loop on inputs of the same "
            f"shapes, or {_cache(s, [g for g, _ in ranked])}")
    short, why, _ = said.partition(_WHY)
    return said, f"{short})" if why else said


def _cache(s: Snapshot, graphs: Sequence[GraphRecord]) -> str:
    """The cache across runs, in few words (JAX's: with its bar where any
    compile is under it)."""
    cache_on = sum(1 for g in s.graphs if g.cache_hits)
    engine = engine_of(s)
    if engine != "jax" or cache_on:
        return cache_words(engine, graphs, cache_on)
    under = any(g.compile_seconds_total / g.compiles < JAX_CACHE_MIN_S for g in graphs)
    return ("enable the persistent compilation cache (jax_compilation_cache_dir"
            + (f", and set {RULE} to 0{_WHY}{duration(JAX_CACHE_MIN_S)} or more)" if under
               else ")"))
