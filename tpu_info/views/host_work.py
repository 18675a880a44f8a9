"""The user's own host code between the steps, where the device waits for it
(``host_work`` sites: :mod:`metrics.engines.jax.host_lines`).

A data loader that draws each batch on the host (``np.random.choice`` and
numpy indexing, a Python loop over rows) calls no JAX: without this, its
time is the step's "other". The hook times sampled intervals between the
step's calls on the training thread and puts their time at the user's lines;
a line's figure is its median per interval (one interval is one step's gap).

What it costs the loop: in eager PyTorch on the CPU (:func:`torch_on_cpu`)
every op is host time, so all of it; where the host set the pace (the training thread
on the CPU nearly all of the loop, :func:`~tpu_info.views.breakdown.host_paced`)
the device waits for all of it, so it is step time; elsewhere at most the
step's time the device was idle (the step less the device's measured time
per step, an upper bound, so the idle time is a lower bound: as a copy's
:func:`~tpu_info.views.breakdown.copy_bound`), the rest having run beside
the device's queued steps. On a device-bound loop that leaves nothing: not
raised, nor where the device was busy more than ``1 - HOST_BOUND_IDLE`` of
the step (its idle time there is within its samples' spread). Always at
most the steady step's host time no other measured part took
(:func:`~tpu_info.views.breakdown.host_left`), the lines together: costliest
first, each at most what the ones before it left. The lines of one generator
(a data loader) are one finding, at its costliest line. Said from
:data:`MIN_SHARE` of the steady step on :data:`MIN_INTERVALS` intervals (a
warning from :data:`WARN_SHARE`).

Example:
    >>> from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
    >>> s = Snapshot(0.0, uptime_seconds=4.0,
    ...              steps=StepsReading(10000, "inferred", "jit(step)", 3.0))
    >>> [f.kind for f in host_work(s)]
    []
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tpu_info.contract.model import Finding, Phase, Severity, SiteKind, SiteReading, Snapshot
from tpu_info.views.breakdown import Breakdown, breakdown, host_left, host_paced, line_per_step
from tpu_info.views.cost import (
    Cost,
    below_bar,
    cost_of,
    duration,
    eager_leads,
    engine_of,
    share_words,
    short_location,
    steps_of,
)
from tpu_info.views.eager import eager_site_advice
from tpu_info.views.slack import busy_cpu_words, on_cpu, one_core

MIN_SHARE = 0.05  # of the steady step: said from here
WARN_SHARE = 0.10  # a warning from here
MIN_INTERVALS = 8  # sampled intervals a median stands on, at least
_KINDS = (SiteKind.HOST_WORK.value, SiteKind.EAGER_WORK.value)
# Where the host did not set the pace, the loop is host-bound when the device
# was idle this share of the step or more by its measured time (an upper
# bound: the watcher waits for the interpreter lock on a host-bound loop).
HOST_BOUND_IDLE = 0.3


@dataclass(frozen=True, slots=True)
class Work:
    """A line's host work, or a generator's lines': per step (their medians
    summed), the intervals that stands on, the lines costliest first."""

    location: str
    function: str
    generator: bool
    per_step: float
    intervals: int
    lines: tuple[SiteReading, ...]
    eager: bool = False  # JAX's own time at the lines (``eager_work``): all of them, one


def works(s: Snapshot) -> list[Work]:
    """``s``'s host work, a generator's lines together, costliest first."""
    steps = steps_of(s)
    steady = steps.steady_seconds_total if steps is not None else None
    step = steady / steps.count if steady and steps is not None and steps.count else None
    groups: dict[str, list[SiteReading]] = {}
    eager = {x.location for x in s.sites if x.kind == SiteKind.EAGER_WORK.value}
    for x in s.sites:
        if x.kind not in _KINDS or x.timed <= 0 or x.seconds <= 0:
            continue
        # (the un-jitted step's lines, their library's Python with them: one)
        key = ("" if x.kind == SiteKind.EAGER_WORK.value or x.location in eager
               else f"{x.location.rsplit(':', 1)[0]}:{x.function}" if x.in_generator
               else x.location)
        groups.setdefault(key, []).append(x)
    # An optimizer's jitted helper called every step from an eager line: its
    # gaps' time is that line's eager work too.
    helpers = sum(x.gap_seconds or 0.0 for x in eager_leads(s).values()) / (
        steps.count if steps is not None and steps.count else 1)
    out = []
    for key, lines in groups.items():
        lines.sort(key=lambda x: -line_per_step(x, step))
        top = lines[0]
        out.append(Work(top.location, top.function, top.in_generator,
                        sum(line_per_step(x, step) for x in lines) + (0.0 if key else helpers),
                        max(x.timed for x in lines), tuple(lines), eager=not key))
    out.sort(key=lambda w: -w.per_step)
    return out


def host_bound(s: Snapshot, b: Breakdown) -> tuple[str, float | None]:
    """Why the loop waits for the host, in words, and the most of a step the
    device waited for it (None: all of it, the host set the pace); ("", 0)
    where the device's time is not known."""
    if torch_on_cpu(s):
        return "eager PyTorch on the CPU: the step's every part is the host's time", None
    paced = host_paced(s)
    if paced is not None:
        return (f"the training thread was on the CPU {paced[0]:.0f}% of the loop (median "
                f"of {paced[1]} readings)"), None
    if one_core(s):
        return ("the process runs on one core, which the CPU backend's device work shares: "
                "the host's work between steps and the device's take turns on it"), None
    w, d = b.step_seconds, b.device
    if not w or d is None:
        return "", 0.0
    idle = max(0.0, w - d)
    return (f"the device idle {share_words(idle / w)} of the step or more (its measured "
            f"{duration(d)} a step, {b.device_basis}, is an upper bound)"), idle


def torch_on_cpu(s: Snapshot) -> bool:
    """A torch program computing on the host's CPU: its ops are host time,
    so the host work between its steps is step time, all of it."""
    return engine_of(s).startswith("torch") and on_cpu(s)


def work_costs(s: Snapshot, b: Breakdown, ws: list[Work]) -> list[Cost]:
    """Each of ``ws``' (costliest first) time per step, together at most the
    step's host time no other part took and, where the host did not set the
    pace, the step's time the device was idle (the rest ran beside the
    device's queued steps): each at most what the ones before it left (jraph's
    five lines, each capped alone, summed 131 % of the step)."""
    steps = steps_of(s)
    n = steps.count if steps is not None else 0
    left = host_left(b)
    _, idle = host_bound(s, b)
    cap = left if idle is None else min(left, idle)
    whole = (f"{duration(left)} of host time no other part took" if cap == left
             else f"{duration(cap)} the device was idle: the rest ran beside its queued steps")
    out, spare = [], cap
    for w in ws:
        per_step = min(w.per_step, spare)
        note = f"median of {w.intervals:,} sampled intervals between steps"
        if per_step < w.per_step:
            note += (f"; its {duration(w.per_step)}/step, at most the step's {whole}"
                     if spare == cap else
                     f"; its {duration(w.per_step)}/step, at most the {duration(spare)} the "
                     f"costlier lines left of the step's {whole}")
        spare -= per_step
        out.append(replace(cost_of(s, per_step * n, n or None, phase=Phase.STEP, note=note),
                           capped=True))
    return out


def _why_not(s: Snapshot, b: Breakdown | None, w: Work, c: Cost | None) -> str:
    if b is None or not b.step_seconds or c is None:
        return "the steady step's time is not known"
    if w.intervals < MIN_INTERVALS:
        return f"{w.intervals} sampled intervals (said from {MIN_INTERVALS})"
    why, idle = host_bound(s, b)
    if not why:
        return "the device's time per step was not measured: whether it waited is not known"
    if idle is not None and idle < HOST_BOUND_IDLE * b.step_seconds:
        return (f"its {duration(w.per_step)}/step of host work between steps ran beside the "
                f"device's queued steps (the device busy "
                f"{share_words(1 - idle / b.step_seconds)} of the step): the loop is not "
                "host-bound")
    return below_bar(c, MIN_SHARE)


def not_raised(s: Snapshot, site: SiteReading) -> str:
    """Why a ``host_work`` site is no finding, in words ("" otherwise)."""
    if site.kind not in _KINDS:
        return ""
    b = breakdown(s)
    ws = works(s)
    costs = work_costs(s, b, ws) if b is not None else [None] * len(ws)
    for w, c in zip(ws, costs):
        if site in w.lines:
            if site is not w.lines[0] and site != w.lines[0]:
                return f"part of {w.function}()'s host work at {short_location(w.location)}"
            return _why_not(s, b, w, c)
    return "no time per interval"


def _lines(w: Work) -> str:
    """``lines 30 (RandomState.choice) and 31``."""
    said: dict[str, list[str]] = {}  # (a line's host and JAX time: said once)
    for x in w.lines:
        said.setdefault(x.location.rsplit(":", 1)[-1], []).append(x.detail)
    cells = []
    for line, details in list(said.items())[:3]:
        detail = ", ".join(dict.fromkeys(d for d in details if d))
        cells.append(f"{line} ({detail})" if detail else line)
    return ("line " if len(cells) == 1 else "lines ") + ", ".join(cells)


def host_work(s: Snapshot) -> Iterable[Finding]:
    """One finding per line (or generator) of the user's own host code
    between steps that the device waits for."""
    ws = works(s)
    if not ws:
        return
    b = breakdown(s)
    if b is None:
        return
    for w, c in zip(ws, work_costs(s, b, ws)):
        if _why_not(s, b, w, c):
            continue
        why = host_bound(s, b)[0]
        share = c.share_of_step or 0.0
        bound = busy_cpu_words(s, "it")
        waits = (" In eager PyTorch on the CPU the step is all host time: this adds to it."
                 if torch_on_cpu(s) else f" The device waits for it: {why}.")
        if bound:  # information; said after the advice (a report's cut keeps that)
            share, waits, bound = 0.0, "", f" {bound}"
        torch = engine_of(s).startswith("torch")
        if w.eager:
            yield _eager(s, w, c, waits + bound, share)
            continue
        if torch:  # (no jitted step to move it into: a DataLoader's workers, or once)
            what = (f"{w.function}(), a generator the loop draws its batches from, runs on the "
                    "host between steps" if w.generator else
                    f"host code in {w.function}() runs between steps")
            fix = ("If it makes each step's examples: build them once before the loop (each "
                   "sample's tensors cached), or in a DataLoader with workers (num_workers on "
                   "spare cores: the main thread only collects them), or batch them (one op "
                   "over the batch, not a Python loop setting elements one by one). If it is "
                   "per-step bookkeeping (metrics, a loss outside the model), keep it on the "
                   "tensors and read it every N steps.")
        elif w.generator:
            what = (f"{w.function}(), a generator the loop draws its batches from, runs on the "
                    f"host between steps")
            fix = ("Make the batches ahead of the loop (draw an epoch's indices at once and "
                   "slice them, or build the batches once), or on the device (the data set put "
                   "once, the indices drawn with jax.random in the jitted step), or prefetch "
                   "the next batch in a thread; vectorise a Python loop over rows.")
        else:
            what = f"host code in {w.function}() runs between steps"
            fix = ("Do it once before the loop, vectorise it (one numpy call, not a Python "
                   "loop), or, if it is array math on the batch, move it into the jitted step.")
        yield Finding(
            f"{what} at {short_location(w.location)} ({_lines(w)}; {c.words()}).{waits} {fix}"
            f"{bound}",
            Severity.WARNING if share >= WARN_SHARE else Severity.INFO, w.location,
            kind="per_step_host_work", **c.fields())


# What a line entered that makes the training step itself (a gradient, an
# optimizer's update) rather than work beside it (indexing a batch).
_TRAINING = ("grad", "vjp", "update", "apply_gradients", "apply_updates")


def _eager(s: Snapshot, w: Work, c: Cost, waits: str, share: float) -> Finding:
    """JAX run outside jit between the step's calls: the step is not one
    jitted function (an eager ``value_and_grad`` of a jitted loss, an
    optimizer update op by op), or work beside it (eager indexing)."""
    ops = next((x for x in s.sites if x.kind == SiteKind.EAGER_OP.value
                and x.location == w.location), None)
    advice = eager_site_advice(ops) if ops is not None else None
    if advice is None and any(t in x.detail for x in w.lines for t in _TRAINING):
        advice = ("Jit the whole training step: the gradient (jax.value_and_grad), the optimizer "
                  "update and any per-step random split inside one jax.jit (nnx.jit for flax "
                  "nnx), so they compile into one graph.")
    return Finding(
        f"JAX runs outside jit between the step's calls at {short_location(w.location)} "
        f"({_lines(w)}; {c.words()}): each transform and op runs from Python on its own, "
        f"unfused, beside the step's jitted graph (an upper bound on what jitting saves: the "
        f"device work inside it stays).{waits} "
        + (advice or "Move it into the jitted step (or jit the function that holds it), so "
                     "it compiles into one graph."),
        Severity.WARNING if share >= WARN_SHARE else Severity.INFO, w.location,
        kind="per_step_eager_work", **c.fields())
