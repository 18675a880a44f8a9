"""Opening the device, and the compiles of the step loop: one-off time, apart.

**Start-up.** The first device operation of a process opens the backend
(``jax._src.xla_bridge.backends()`` initializes every platform: 7-11 s for a
TPU chip, a fraction of a second for the CPU). Whatever op that was (a
``jnp.asarray`` of 4 bytes, a ``device_put``, a read) would otherwise be
charged with it. :func:`patch_backends` wraps ``backends()``: a call that
finds no backend yet is timed, and when it leaves backends behind the
start-up is recorded (``BackendStartTime``, one sample; its monotonic span
kept in ``JaxContext.startups``). :func:`take_out` then removes that span from
any journal record that contains it, at fold time (off the hot path: the
usual call of ``backends()`` reads one module global and returns).

**Compile steps.** :class:`CompileTimeline` keeps the spans of compile work
(tracing, lowering, the backend compile, the start-up), bounded. At scrape
time :meth:`CompileTimeline.in_loop` clips them to the step loop and groups
them into the steps they fell in: the engine reports it as
``CompileStepTime`` (one sample per step that held compile work, its
seconds), so the views take the steady step as the steps less that time
(``StepsReading.steady_seconds_total``) and say the compiles on their own line.

Example:
    >>> t = CompileTimeline()
    >>> t.add(100, 600); t.add(650, 700); t.add(5_000, 5_100)
    >>> t.in_loop(0, 10_000, 10)     # two steps held compile work
    [550, 100]
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.jax.context import JaxContext

MAX_SPANS = 8192  # compile spans kept (the oldest go first)


class CompileTimeline:
    """Monotonic-ns spans of compile work (and the backend's start-up)."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: deque[tuple[int, int]] = deque(maxlen=MAX_SPANS)

    def add(self, start: int, end: int) -> None:
        if end > start:
            self.spans.append((start, end))

    def clear(self) -> None:
        self.spans.clear()

    def within(self, first: int, last: int) -> int:
        """The compile ns inside ``[first, last]`` (spans clipped, overlaps
        merged): a gap's compile work, said on its own line, not the gap's."""
        total, end = 0, first
        for s, e in sorted((max(s, first), min(e, last)) for s, e in list(self.spans)
                           if e > first and s < last):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    def in_loop(self, first: int, last: int, steps: int) -> list[int]:
        """The compile ns in each step of the loop ``[first, last]`` (``steps``
        steps) that held any: the spans clipped to the loop, overlaps merged
        (a trace inside another's), and spans less than a steady step apart
        taken as one step's."""
        clipped = sorted((max(s, first), min(e, last)) for s, e in list(self.spans)
                         if e > first and s < last)
        merged: list[list[int]] = []
        for s, e in clipped:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        busy = sum(e - s for s, e in merged)
        steady = max(0, (last - first) - busy) / max(1, steps)  # a steady step's ns
        out: list[int] = []
        end = None
        for s, e in merged:
            if end is not None and s - end < steady:
                out[-1] += e - s
            else:
                out.append(e - s)
            end = e
        return out


def take_out(flat: list[Any], fields: int, start_at: int, end_at: int,
             startups: Sequence[tuple[int, int]]) -> None:
    """Journal records (``fields`` values each; a record's start at index
    ``start_at``, its end at ``end_at``) that contain a start-up span lose
    it: their start moves later by its length, in place. A batch that began
    after every start-up (all of them, once it is past) is checked in C."""
    if not startups or min(flat[start_at::fields], default=0) > startups[-1][0]:
        return
    for s0, s1 in startups:
        for i in range(0, len(flat), fields):
            start, end = flat[i + start_at], flat[i + end_at]
            if start <= s0 and end >= s1 and end > start:
                flat[i + start_at] = min(end, start + (s1 - s0))


def patch_backends(patches: Patches, context: JaxContext) -> None:
    """Wraps ``xla_bridge.backends`` so the call that opens the backends is
    timed and handed to the active engine's compiles (``on_startup``)."""
    try:
        from jax._src import xla_bridge
    except ImportError as e:
        patches.degraded.append(f"backend start-up not told apart: {e}")
        return
    if not isinstance(getattr(xla_bridge, "_backends", None), dict):
        patches.degraded.append("backend start-up not told apart: "
                                "jax._src.xla_bridge._backends missing")
        return
    patches.apply(xla_bridge, "backends", lambda orig: _wrap_backends(orig, xla_bridge, context))


def _wrap_backends(original: Callable[[], Any], bridge: Any,
                   context: JaxContext) -> Callable[[], Any]:
    clock = time.monotonic_ns

    def backends() -> Any:
        if bridge._backends:  # the usual call: opened already
            return original()
        start = clock()
        out = original()
        end = clock()
        eng = context.active
        if eng is not None and bridge._backends:
            try:
                eng.compiles.on_startup(start, end, sorted(bridge._backends))
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                eng.rec.hook_failed("jax.startup", e)
        return out

    backends.__wrapped__ = original  # type: ignore[attr-defined]
    return backends
