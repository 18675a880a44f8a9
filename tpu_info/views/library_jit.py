"""A library's jit wrapper's own host time in the step (``library_jit`` sites).

flax's ``nnx.jit`` splits the Modules and optimizer it is passed into a
graph definition and state on every call, calls its inner ``jax.jit`` on the
state and merges the result back: host work outside the jitted call. The
hook times the wrapper's whole call on the calls whose inner call it times
anyway and keeps the difference (:mod:`metrics.engines.jax.wrappers`); a
site's ``seconds`` are the median of those samples times its calls.

What it costs the loop: the host does it every step, so where the host sets
the pace (:func:`~tpu_info.views.slack.host_paced`) it is step time;
where the device is the one the loop waits for, host work runs beside the
device's queued work. So the figure is cut by the host's slack
(:func:`~tpu_info.views.slack.beside_queue`: the time the host waited for
the device's queued steps at its reads and in the step's dispatch; a host
that waits there ran ahead of the device by that much, and its own work
hid behind the device's). It
is not cut to the steps' time the device's sampled times leave idle (as a
copy's is: :func:`~tpu_info.views.breakdown.copy_bound`): those samples end
when the watcher thread sees the output ready, and the watcher needs the
interpreter lock that this Python work holds, so they grow with it (issue
41's nnx_vae: the device "busy 9.1 ms, 100%" of a 9.1 ms step whose
``nnx.cached_partial`` saved a third).
Said from :data:`MIN_SHARE` of the steady step (a warning from
:data:`WARN_SHARE`); the advice is the library's own.

Example:
    >>> from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
    >>> s = Snapshot(0.0, steps=StepsReading(100, "inferred", "jit(step)", 1.0),
    ...              sites=(SiteReading("library_jit", "/w/train.py:9", 100, seconds=0.3,
    ...                                 detail="jit(step)", via="flax nnx.jit", timed=40),))
    >>> [f.kind for f in library_jit(s)]
    ['library_jit_overhead']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tpu_info.contract.model import (
    NNX_CACHED_PARTIAL,
    NNX_JIT,
    Finding,
    Severity,
    SiteKind,
    SiteReading,
    Snapshot,
)
from tpu_info.views.cost import (
    Cost,
    below_bar,
    cost_of,
    duration,
    share_words,
    short_location,
    site_phase,
)
from tpu_info.views.eager import step_function
from tpu_info.views.slack import beside_queue

MIN_SHARE = 0.05  # of the steady step: said from here
WARN_SHARE = 0.10  # a warning from here
MIN_SAMPLES = 8  # sampled calls a median stands on, at least
PER_STEP_AT_LEAST = 0.5  # calls per step (the step's wrapper, not an evaluation's)


_ADVICE = {
    NNX_JIT: ("flax's per-call graph traversal (split and merge) of the Modules and optimizer "
              "it is passed. Pass them once: step = nnx.cached_partial(train_step, model, "
              "optimizer), then call step(batch) (flax's documented fix; it keeps some per-call "
              "work, so it saves less than this figure), or split the state once (nnx.split) "
              "and jax.jit a function of the state"),
    NNX_CACHED_PARTIAL: ("what nnx.cached_partial leaves of flax's per-call work (its "
                         "cached graph traversal, checks and the state's merge). To remove "
                         "it, split the Modules and optimizer once (graphdef, state = "
                         "nnx.split(...)) and jax.jit a function of the state that returns "
                         "the new state, merging (nnx.update) only when the objects are needed"),
}
_GENERIC = ("the library's own per-call work on its arguments; pass the jitted function "
            "plain arrays, or use the library's way to cache that work")


def wrapper_cost(s: Snapshot, site: SiteReading) -> Cost:
    """The wrapper's host time in the steps, at most the steps' time, less
    the host's slack (module docstring)."""
    phase = site_phase(s, site)
    span = (site.first_seen_unix, site.last_seen_unix) if site.first_seen_unix else None
    per_call = site.seconds / site.count if site.count else 0.0
    note = (f"the wrapper's host time per call outside its jitted call, median of "
            f"{site.timed:,} sampled calls: {duration(per_call)}")
    cost = cost_of(s, site.seconds, site.count, phase=phase, span=span, note=note)
    if cost.outside_step:
        return cost
    # A median of sampled calls times every call can pass the steps' own time
    # (a sampled call wakes the device-time watcher, which takes the
    # interpreter lock from the wrapper's Python after it): at most the steps.
    return beside_queue(s, replace(cost, capped=True), "the wrapper's work")


def _why_not(s: Snapshot, site: SiteReading, c: Cost) -> str:
    """Why a wrapper's site is no finding ("" when it is one)."""
    step = step_function(s)
    if site.detail != step:  # an evaluation's wrapper: its calls are no steps
        return (f"not the step's function ({step})" if step else
                "the step's jitted function is not known")
    if site.timed < MIN_SAMPLES:
        return f"{site.timed} sampled calls (said from {MIN_SAMPLES})"
    if c.outside_step or c.steps is None:
        return "not in the steps: its time is not a step's"
    if (c.per_step or 0.0) < PER_STEP_AT_LEAST:
        return f"in {share_words(c.per_step or 0.0)} of the steps (said from half)"
    said = below_bar(c, MIN_SHARE)
    if not said:
        return ""
    if c.seconds < site.seconds:  # cut to what the device's work left of it
        whole = replace(c, seconds=site.seconds)
        said = (f"its {duration(whole.seconds_per_step or 0.0)}/step of host time "
                f"({share_words(whole.share_of_step or 0.0)} of step time) ran beside the "
                f"device's work, which leaves {said}")
    return said


def not_raised(s: Snapshot, site: SiteReading) -> str:
    """Why a ``library_jit`` site is no finding, in words ("" otherwise)."""
    if site.kind != SiteKind.LIBRARY_JIT.value:
        return ""
    return _why_not(s, site, wrapper_cost(s, site))


def library_jit(s: Snapshot) -> Iterable[Finding]:
    """One finding per library jit wrapper whose own host time is a large
    share of the step, at the user's line that calls it."""
    for site in s.sites:
        if site.kind != SiteKind.LIBRARY_JIT.value or site.seconds <= 0:
            continue
        c = wrapper_cost(s, site)
        if _why_not(s, site, c):
            continue
        share = c.share_of_step or 0.0
        what = _ADVICE.get(site.via, _GENERIC)
        via = site.via or "a library's jit wrapper"
        yield Finding(
            f"{via} around {site.detail or 'its jitted function'} at "
            f"{short_location(site.location)} spends host time outside the jitted call every "
            f"step ({c.words()}): {what}.",
            Severity.WARNING if share >= WARN_SHARE else Severity.INFO, site.location,
            kind="library_jit_overhead", **c.fields())
