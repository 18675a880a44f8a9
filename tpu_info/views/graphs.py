"""What each compiled graph costs per step, whose it is, and whether it recompiled.

One place for the judgements a graph table makes (the dashboard's Graphs
panel reads them; the CLI can): :func:`graph_cost` is the time a graph cost
the run, compiling plus running it, per step (the same
:class:`~tpu_info.views.cost.Cost` the findings state);
:func:`own_hashes` splits the program's own functions from the library's
set-up graphs; :func:`is_recompile` says whether a graph is a recompile.

The rule for "the library's set-up": a graph whose record names no line of
the program's (the hooks record a compile cause with a source line for every
function the program jitted or compiled), that ran at most once, and that
was compiled before the program's first such function: JAX's own
``jit(_normal)``, ``jit(_threefry_split)``, ``jit(broadcast_in_dim)`` ...
compiled while it builds PRNG keys and initial arrays. Every other graph is
the program's own, including eager single ops compiled later (an un-jitted
``accuracy()`` in the loop: the ``eager_ops`` finding names them). When no
graph of a snapshot names a line (an engine that records no causes), every
graph counts as the program's: the rule cannot tell, so it does not split.

Example:
    >>> from tpu_info.contract.model import GraphRecord, Snapshot, StepsReading
    >>> g = GraphRecord("ab" * 32, "jit(step)", "jax", 0.0, 1.0, compiles=1,
    ...                 compile_seconds_total=2.0, executions=100)
    >>> s = Snapshot(1.0, graphs=(g,), steps=StepsReading(100, "marked"))
    >>> graph_cost(s, g).seconds_per_step
    0.02
    >>> per_step_cell(graph_cost(s, g))
    '20 ms'
"""

from __future__ import annotations

from collections.abc import Sequence

from tpu_info.contract.catalog import EXECUTE_TIME
from tpu_info.contract.model import FIRST_CALL, GraphRecord, Snapshot
from tpu_info.views.cost import Cost, duration, steps_of

NO_STEPS = "steps are not known (nothing marks or infers a step), so no per-step figure"


def mean_execute_seconds(s: Snapshot) -> float | None:
    """The process's mean time per execution of a compiled graph (None: not timed)."""
    ex = s.distribution(EXECUTE_TIME)
    if ex is None or not ex.count or ex.total <= 0:
        return None
    return ex.total / 1e9 / ex.count


def graph_cost(s: Snapshot, g: GraphRecord, mean_s: float | None = None) -> Cost:
    """What ``g`` cost the run: its compile time (measured) plus its executions
    times the process's mean execution time (estimated: the engines time
    executions per process, not per graph), per step when steps are known.
    ``mean_s``: :func:`mean_execute_seconds` of ``s``, when the caller has it."""
    return graph_costs(s, (g,), mean_s)[0]


def graph_costs(s: Snapshot, graphs: Sequence[GraphRecord] | None = None,
                mean_s: float | None = None) -> list[Cost]:
    """:func:`graph_cost` of each of ``graphs`` (default: all of ``s``'s), the
    steps and the mean execution time looked up once."""
    mean = mean_s if mean_s is not None else mean_execute_seconds(s)
    steps = steps_of(s)
    how = ("" if mean is None else "estimated: compile time plus executions at this "
           f"process's mean execution time, {duration(mean)}")
    out = []
    for g in (s.graphs if graphs is None else graphs):
        if g.executions and mean is not None:
            out.append(Cost(g.compile_seconds_total + g.executions * mean, g.executions, True,
                            how, steps, capped=True))
        else:
            out.append(Cost(max(0.0, g.compile_seconds_total), g.executions, False, "", steps,
                            capped=True))
    return out


def per_step_cell(c: Cost) -> str:
    """A graph's cost in a table cell: ``2.1 ms`` per step, ``~`` marking an
    estimate; empty when steps are not known (:data:`NO_STEPS` says why)."""
    if c.seconds_per_step is None:
        return ""
    return ("~" if c.estimated else "") + duration(c.seconds_per_step)


def own_hashes(s: Snapshot) -> frozenset[str]:
    """The hashes of the program's own graphs (the module docstring's rule)."""
    named = {g.hash: g.first_seen_unix for g in s.graphs if any(c.location for c in g.causes)}
    if not named:
        return frozenset(g.hash for g in s.graphs)
    first = min(named.values())
    return frozenset(g.hash for g in s.graphs
                     if g.hash in named or (g.executions or 0) >= 2 or g.first_seen_unix >= first)


def is_recompile(g: GraphRecord) -> bool:
    """``g`` is a recompile: it compiled more than once, or a cause other than
    the first call made it (a second graph of a function, for a new shape,
    dtype, static value ...). A function's first graph is not one."""
    return g.compiles > 1 or any(c.description != FIRST_CALL for c in g.causes)
