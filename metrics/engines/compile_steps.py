"""The compiles of the step loop, one engine-neutral model: which steps held
compile work and how long it took (``CompileStepTime``).

Every engine that compiles inside the loop (JAX: tracing, lowering, the
backend's compile and its start-up; torch.compile: Dynamo's frame compiles
and the backwards AOTAutograd compiles at the first ``backward()``) adds the
monotonic span of each piece of compile work to a :class:`CompileTimeline`
when it ends. At scrape time :func:`compile_step_time` clips the spans to the
step loop (marked steps, else the engine's inferred ones) and groups them
into the steps they fell in: one ``CompileStepTime`` sample per step that
held compile work, its seconds. The views take the steady step as the steps
less that time (``StepsReading.steady_seconds_total``) and say the compiles
on their own line ("steady step 2.9 ms, compiles: 43 s in 3 steps").

Example:
    >>> t = CompileTimeline()
    >>> t.add(100, 600); t.add(650, 700); t.add(5_000, 5_100)
    >>> t.in_loop(0, 10_000, 10)     # two steps held compile work
    [550, 100]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from tpu_info.contract import catalog as names
from tpu_info.contract.model import DistributionReading, StepsReading, Unit

if TYPE_CHECKING:
    from metrics.recording.recorder import Recorder

__all__ = ["MAX_SPANS", "CompileTimeline", "compile_step_time"]

MAX_SPANS = 8192  # compile spans kept (the oldest go first)


class CompileTimeline:
    """Monotonic-ns spans of compile work (and a backend's start-up)."""

    __slots__ = ("spans", "latest")

    def __init__(self) -> None:
        self.spans: deque[tuple[int, int]] = deque(maxlen=MAX_SPANS)
        self.latest = 0  # the latest end of any span added: none reaches past it

    def add(self, start: int, end: int) -> None:
        if end > start:
            self.spans.append((start, end))
            if end > self.latest:
                self.latest = end

    def clear(self) -> None:
        self.spans.clear()
        self.latest = 0

    def within(self, first: int, last: int) -> int:
        """The compile ns inside ``[first, last]`` (spans clipped, overlaps
        merged): a gap's compile work, said on its own line, not the gap's."""
        if first >= self.latest:  # (a steady loop's gaps: every compile before them)
            return 0
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


def compile_step_time(timeline: CompileTimeline, recorder: Recorder,
                      inferred: Callable[[], StepsReading | None]) -> list[DistributionReading]:
    """``CompileStepTime``: per step of the loop that held compile work, its
    time (``timeline`` clipped to the loop: the marked steps', else those
    ``inferred`` gives); none without a loop or such a step."""
    n = recorder.steps_so_far()
    first, last = recorder.first_step_ns, recorder.last_step_ns
    if not (n and first is not None and last is not None):
        st = inferred()
        if st is None or st.first_unix is None or st.last_unix is None:
            return []
        to_unix = recorder.mono_to_unix
        n, first, last = st.count, int((st.first_unix - to_unix) * 1e9), int(
            (st.last_unix - to_unix) * 1e9)
    per = timeline.in_loop(first, last, n)
    if not per:
        return []
    return [DistributionReading(names.COMPILE_STEP_TIME, Unit.TIME_NS, len(per),
                                float(sum(per)), float(min(per)), float(max(per)),
                                help=names.help_for(names.COMPILE_STEP_TIME))]
