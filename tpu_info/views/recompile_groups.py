"""A function's recompiles as the findings group and cost them: each its own
compile's time (:func:`own_seconds`), a function "re-created" once taken
for another function passed (:func:`recreated_once`), and how severe
(:func:`recompile_severity`); a graph compiled again with no cause
(:func:`same_graph`).

Example:
    >>> from tpu_info.contract.model import RecompileCause
    >>> own_seconds([RecompileCause(0.0, "x", seconds=0.5), RecompileCause(1.0, "y", seconds=0.25)])
    0.75
    >>> own_seconds([RecompileCause(0.0, "x")]) is None
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import (
    EventKind,
    Finding,
    GraphRecord,
    RecompileCause,
    Severity,
    Snapshot,
)
from tpu_info.contract.phases import Phase, bursts_phase
from tpu_info.views.causes import ADVICE, CauseAdvice
from tpu_info.views.cost import Cost, cost_of, outside_warns, steps_of

G = TypeVar("G")
# A graph compiled again is said from this many seconds or this share of the run.
SAME_GRAPH_SECONDS, SAME_GRAPH_SHARE = 0.5, 0.01


def own_seconds(causes: Iterable[RecompileCause]) -> float | None:
    """What these recompiles took, each its own compile's time as the hook
    measured it at the compile (``RecompileCause.seconds``); None when one of
    them does not say (an older hook, an engine that does not time each)."""
    times = [c.seconds for c in causes]
    return None if None in times else sum(t or 0.0 for t in times)


def changes(causes: Iterable[RecompileCause]) -> int:
    """How many changes these recompiles were: JAX's second graph for one
    change (an eager ``value_and_grad``'s backward pass) carries the first's
    cause, its time included, and is no change of its own."""
    return len({(c.time_unix, c.description, c.location) for c in causes})


def one_per_change(seen: list[tuple[RecompileCause, G]]) -> list[tuple[RecompileCause, G]]:
    """``seen`` with each change's first recompile only (:func:`changes`)."""
    kept: dict[tuple[float, str, str | None], tuple[RecompileCause, G]] = {}
    for c, g in seen:
        kept.setdefault((c.time_unix, c.description, c.location), (c, g))
    return list(kept.values())


def recreated_once(kinds: dict[str, list[tuple[RecompileCause, G]]],
                   ) -> dict[str, list[tuple[RecompileCause, G]]]:
    """Causes grouped by kind name, with a function "re-created" only once
    taken for another function passed: two different functions of one name
    (two lambdas, each made once) read the same without their addresses;
    only the same change again (a function made anew on each call) says the
    same function was re-created."""
    again = kinds.get(ADVICE[CauseKind.FUNCTION_RECREATED][0])
    if again is None or len(again) != 1:
        return kinds
    [(c, g)] = again
    out = {k: v for k, v in kinds.items() if v is not again}
    out.setdefault(ADVICE[CauseKind.STATIC_FUNCTION][0], []).append(
        (replace(c, kind=CauseKind.STATIC_FUNCTION), g))
    return out


def recompile_severity(c: Cost, expected: bool) -> Severity:
    """A recompile's severity (and a compile for each new shape's): info when
    expected, or when it happened outside the step and does not weigh on the
    run (:func:`~tpu_info.views.cost.outside_warns`)."""
    if expected or (c.outside_step and not outside_warns(c)):
        return Severity.INFO
    return Severity.WARNING


def same_graph(s: Snapshot, name: str, graphs: list[GraphRecord]) -> Finding | None:
    """A JAX function's graph compiled again, the same program (its hash),
    with no cause recorded (JAX explains no cache miss of a pmap): its input
    shapes and dtypes did not change, so the cache missed on the inputs'
    placement or on a new jitted object. equinox's bert example (filter_pmap
    over state put with ``device_put_replicated``) compiled its step at step
    0 and again at step 1, 27 s in all, and nothing was said. None where no
    graph compiled twice."""
    again = [g for g in graphs if g.compiles > 1 and g.engine == "jax"]
    if not again:
        return None
    n = sum(g.compiles - 1 for g in again)
    lost = sum(g.compile_seconds_total * (g.compiles - 1) / g.compiles for g in again)
    if lost < SAME_GRAPH_SECONDS and lost < SAME_GRAPH_SHARE * s.uptime_seconds:
        return None  # (JAX's own small helpers: bert's jit(stage), 10 ms again at start-up)
    # The compiles after each graph's first, by their events where the ring
    # still holds them (their time and line), else the graph's last sighting.
    later = [e for g in again for e in sorted(
        (e for e in s.events if e.kind == EventKind.COMPILE and e.graph_hash == g.hash),
        key=lambda e: e.time_unix)[1:]]
    phase, _ = bursts_phase([e.time_unix for e in later]
                            or [g.last_seen_unix for g in again], steps_of(s))
    c = cost_of(s, lost, n, phase=phase)
    at = next((e.location for e in reversed(later) if e.location), None)
    why = ("no input shape or dtype changed, so the cache missed on where its inputs live (an "
           "array put on one device or replicated at the first call, the step's own sharded "
           "output after it) or on a new jitted object. Give the first call inputs placed as "
           "the step returns them (put them with its output's sharding), and create the "
           "jitted function once.")
    if name in _CONTROL_FLOW:  # (a loop or branch JAX jits itself when called eagerly)
        why = (f"no input shape or dtype changed: a {_CONTROL_FLOW[name]} called outside jit "
               "compiles its body each time the body is a new function (a closure or lambda "
               "made for that call: once an epoch, in a library's un-jitted update). Jit the "
               "function that calls it, so it compiles once per shape, or make the body "
               "function once and pass what changes as arguments.")
    return Finding(
        f"{name} compiled the same graph again {n} time{'s' if n > 1 else ''} ({c.tail()}): "
        + why,
        recompile_severity(c, expected=False), at, kind="recompile_same_graph",
        **c.fields())


# JAX's control flow run eagerly is jitted by JAX under these names, keyed on
# the body function: numpyro's CVAE example ran lax.fori_loop over each epoch
# outside jit with a body made per epoch (jit(scan) compiled again every
# epoch, ~5.5 s each); optax's un-jitted reduce_on_plateau update, jit(cond).
_CONTROL_FLOW = {"jit(scan)": "lax.scan or lax.fori_loop",
                 "jit(while)": "lax.while_loop or lax.fori_loop", "jit(cond)": "lax.cond",
                 "jit(switch)": "lax.switch"}

# A leading size met once in the loop and kept (diffrax's neural ODE example
# fits the first tenth of each series, then all of it: 10 -> 100, once) is
# no size that varies: padding would cost every step to save one compile.
GROWN_ONCE = ("Once, not every step: a size met for the first time compiles once and is "
              "cached after (a curriculum's longer inputs). Only if sizes keep changing, "
              "pad or bucket them to a few fixed sizes.")
# A second caller's size first met inside the loop (diffrax's latent ODE
# example samples at its own size after the first step): the loop waited.
WARM_FIRST = (" Or call it once at that size before the loop, so the loop does not wait "
              "for its compile.")


def once_advice(k: CauseAdvice, phase: Phase) -> str:
    """The advice for a recompile of kind ``k`` that happened in ``phase``:
    a one-off one in the step loop is no size that varies."""
    if phase != Phase.ONCE:
        return k.advice
    if k.kind == "batch size varies":
        return GROWN_ONCE
    if k.kind.startswith("second batch size"):
        return k.advice + WARM_FIRST
    return k.advice

