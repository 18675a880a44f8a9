"""Steps and busy % when the program marks no step, from what the hook saw.

In order of trust: the function wrapped in ``metrics.track`` with the most
time; else the counted jitted function with the most time (called at least
``MIN_CALLS`` times: :mod:`metrics.recording.callstats`); else, when no jitted call
is seen (the step was jitted before install), the line that syncs
device->host most often (a loop's ``float(loss)``), whose time between its
first and last sync over the syncs between gives the step time. Each is
labelled: ``source`` says inferred, ``basis`` says from what.

Busy % is host-side: time inside tracked calls, else inside counted jitted
calls, else waiting at the step's sync line, over the wall time of a window
of a second or more. Dispatch is asynchronous, so the first two read low for
a step that does not wait for its result; the wait at a sync misses the
device time the host overlapped with its own work (a lower bound).

Example:
    >>> eng.steps.steps().basis                               # doctest: +SKIP
    'float() at train.py:41: the most frequent device->host sync (1,200 times); ...'
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING

from metrics.engines.compile_steps import compile_step_time
from metrics.engines.jax.context import step_rank
from metrics.engines.jax.executions import Executions
from metrics.engines.jax.library_step import users_line
from metrics.engines.jax.sites import SyncLine
from metrics.recording.callstats import MIN_CALLS
from tpu_info.contract.model import STEPS_INFERRED, DistributionReading, StepsReading

if TYPE_CHECKING:
    from metrics.engines.compile_steps import CompileTimeline
    from metrics.engines.jax.context import JaxContext
    from metrics.engines.jax.implicit import ImplicitTransfers
    from metrics.recording.recorder import Recorder

BUSY_INFERRED = ("inferred: host time inside calls of jitted functions (dispatch is "
                 "asynchronous, so a step that does not wait for its result reads low); "
                 "metrics.track(step) gives the step's own")
BUSY_TOO_FEW = (f"busy % is inferred once a jitted function has run {MIN_CALLS} times; "
                "or wrap the step with metrics.track(step) to see it")
BUSY_NOTHING = ("busy % is estimated from calls of jitted functions and tracked ones, or "
                "from the line that syncs device->host most often: none counted yet "
                "(functions jitted before install are not seen; wrap the step with "
                "metrics.track(step) to see it)")
WINDOW_NS = 1_000_000_000  # a reading's window starts at the newest mark this old
MARK_EVERY_NS = 250_000_000


def _sync_busy_reason(where: str) -> str:
    return (f"inferred (a lower bound): host time waiting at {where}, the step's sync, over "
            "wall time (the step's calls are not seen: jitted before install); "
            "metrics.track(step) gives the step's own")


READS_PER_CALL = 8  # reads per call of a few-called jitted function: its loop's, not steps


class MarkedSteps:
    """The program's marked steps as a device->host read's step index
    (``calls``, as a step function's :class:`~metrics.engines.jax.calls.Owner`
    has): steps marked so far (folded and waiting, read as plain ints)."""

    __slots__ = ("_rec", "_waiting")

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._waiting = recorder._steps_queue  # the marks not folded yet

    @property
    def calls(self) -> int:
        return self._rec.steps_folded + len(self._waiting)


class StepWatch:
    """Steps and busy % of one JAX engine, read at scrape time from its
    counted calls (``runs``) and its implicit syncs (``implicit``: an
    :class:`~metrics.engines.jax.implicit.ImplicitTransfers`)."""

    def __init__(self, runs: Executions, implicit: ImplicitTransfers | None) -> None:
        self.runs = runs
        self.implicit = implicit
        # (monotonic ns, tracked ns, inferred ns, {sync line: ns}) at recent
        # readings; the window of a reading starts at the newest mark at
        # least a second old. The sync times are kept only while syncs are
        # the basis (None otherwise).
        self._marks: deque[tuple[int, int, int, dict[str, int] | None]] = deque(maxlen=32)
        self.forget()

    def name_step(self, context: JaxContext) -> None:
        """Tells ``context`` which calls are steps, for the step index of
        later device->host reads: marked steps when the program marks them,
        else the tracked or inferred step function (by time, as
        :meth:`steps`); no change while none is known (the jit wrapper's
        guess stands), nor while the guess outranks that function on all
        but time and calls (:func:`~metrics.engines.jax.context.step_rank`)
        and was called after it: the loop's step in its first calls, fewer
        than ``MIN_CALLS``, beside an evaluation run before the loop."""
        rec = self.runs.rec
        if rec.steps_so_far():
            if not isinstance(context.step_owner, MarkedSteps):
                context.name_step(MarkedSteps(rec))
            return
        self.runs.journal.flush()
        times = self.runs.call_times
        owner = times.step_owner()
        if owner is None:
            return
        lead = context.step_owner
        if (lead is not None and lead is not owner and not isinstance(lead, MarkedSteps)
                and step_rank(lead) > step_rank(owner)
                and (times.last_end(lead) or 0) > (times.last_end(owner) or 0)):
            return  # a guess called since that outranks it: the time leader lacks its calls
        context.name_step(owner)

    def forget(self) -> None:
        """Starts over (``metrics.clear_*``): no marks before now."""
        self._marks.clear()
        self._marks.append((time.monotonic_ns(), 0, 0, {}))

    def _step_sync(self) -> tuple[SyncLine, dict[str, int]] | None:
        """The line that syncs most often (at least ``MIN_CALLS`` times) and
        the host ns inside the syncs of every line; None without one."""
        lines = self.implicit.sync_lines() if self.implicit is not None else []
        lines = [x for x in lines if ":" in x.location]
        if not lines:
            return None
        top = max(lines, key=lambda x: (x.count, x.location))
        if top.count < MIN_CALLS:
            return None
        # A loop of a few long jitted calls (numpyro's VAE example: one jitted
        # epoch of 468 batches, 4 calls, 11 reads of a check in between) is no
        # loop of these reads' steps: the evaluation's gap after an epoch held
        # the next epoch whole (14x). Reads a step loop makes outnumber them.
        few = [f.calls for f in list(self.runs.call_times.by_key.values())
               if 0 < f.calls < MIN_CALLS and f.ns >= top.ns]
        if few and READS_PER_CALL * max(few) >= top.count:
            return None
        return top, {x.location: x.ns for x in lines}

    def busy_percent(self) -> tuple[float | None, str]:
        """Host-side busy % over the last second or more, capped at 100, and
        its reason ("" for tracked calls, the measured case). Readers close
        together see the same window."""
        self.runs.journal.flush()
        now, tracked, inferred = time.monotonic_ns(), self.runs.tracked_ns, self.runs.inferred_ns
        syncs: dict[str, int] | None = None
        if tracked:
            which, busy, reason = 1, tracked, ""
        elif inferred:
            if self.runs.call_times.dominant(False, MIN_CALLS) is None:
                return None, BUSY_TOO_FEW
            which, busy, reason = 2, inferred, BUSY_INFERRED
        else:
            found = self._step_sync()
            if found is None:
                return None, BUSY_NOTHING
            top, syncs = found
            which, busy, reason = 3, top.ns, _sync_busy_reason(_where(top))
        marks = self._marks
        start = marks[0]
        for mark in reversed(marks):
            if now - mark[0] >= WINDOW_NS:
                start = mark
                break
        if now - marks[-1][0] >= MARK_EVERY_NS:
            marks.append((now, tracked, inferred, syncs))
        if now <= start[0]:
            return None, "busy % needs a moment of history"
        if which == 3:
            # A mark taken before syncs were the basis has none: the line's
            # whole time counts (its syncs began after that mark or at it).
            before = (start[3] or {}).get(top.location, 0)
        else:
            before = start[1] if which == 1 else start[2]
        share = (busy - before) / (now - start[0])
        return min(100.0, max(0.0, 100.0 * share)), reason

    def steps(self) -> StepsReading | None:
        """Steps when the program never marks them (see the module's
        docstring for the order); None with too little history."""
        self.runs.journal.flush()
        found = self.runs.call_times.steps()
        if found is not None and found.source == STEPS_INFERRED:
            found = users_line(found, self.runs.call_times.step_owner())
        if found is not None:
            return found
        sync = self._step_sync()
        if sync is None:
            return None
        top = sync[0]
        seconds_total = None
        timing = "step time unknown"
        if top.count > 1 and top.last_end > top.first_end:
            # count syncs have count - 1 steps between them; the total is
            # scaled to count steps so the time per step reads right.
            per_step = (top.last_end - top.first_end) / 1e9 / (top.count - 1)
            seconds_total = per_step * top.count
            timing = "step time from its first sync to its last"
        to_unix = self.runs.rec.mono_to_unix
        return StepsReading(count=top.count, source=STEPS_INFERRED, seconds_total=seconds_total,
                            first_unix=top.first_end / 1e9 + to_unix,
                            last_unix=top.last_end / 1e9 + to_unix,
                            basis=f"{_where(top)}: the most frequent device->host sync "
                                  f"({top.count:,} times); {timing}")

    def compile_steps(self, timeline: CompileTimeline) -> list[DistributionReading]:
        """``CompileStepTime``: per step of the loop that held compile work
        (or the backends' start-up), its time (:func:`compile_step_time`:
        the marked steps' loop, else the inferred one's)."""
        return compile_step_time(timeline, self.runs.rec, self.steps)


def _where(line: SyncLine) -> str:
    """``float() at train.py:41`` for a sync line."""
    return f"{line.detail or 'sync'} at {os.path.basename(line.location)}"
