"""Where the run's time went, as XProf's overview page splits it: one model
of time for every output (the report, ``--json``, the dashboard, the saved
run's summary, the HTML report).

The run (the process's uptime) is split into the backends' start-up, the
compiles (tracing, lowering and the backend's compile), the steady steps,
the periodic work in the loop's gaps (evaluation, checkpoints: their
measured wall time) and the rest (imports, set-up and host work outside the
loop), each measured by the hook; parts never add up past the run (a
remainder is never negative, and overlapping parts are said to overlap).

A steady step (the steps' wall time less the compiles inside them and less
the periodic work between them, over the steps) is split on the host's
timeline, which is what loops: copies to the device (the timed copies,
scaled to all), waits at device->host reads, a torch DataLoader's batches
(data loading: the main thread's time drawing them), waits in the step's dispatch
for the device's queue (its sampled calls' mean:
:func:`~tpu_info.views.slack.dispatch_wait`), and the host's other work;
and beside it the device's own time per step (the step function's graphs'
device time per execution, measured off the training thread, times their
executions per step), so ``the device waits for the host`` is the step
less that. Each figure says how many samples it stands on; one that was
not measured is left out, never assumed.

Example:
    >>> from tpu_info.contract.model import Snapshot, StepsReading
    >>> s = Snapshot(0.0, uptime_seconds=10.0,
    ...              steps=StepsReading(100, "marked", "metrics.mark_step", 5.0))
    >>> b = breakdown(s)
    >>> [(p.name, round(p.seconds, 1)) for p in b.parts]
    [('steps', 5.0), ('other', 5.0)]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from tpu_info.contract import catalog
from tpu_info.contract.diagnosis import SiteKind
from tpu_info.contract.model import SiteReading, Snapshot
from tpu_info.views.cost import (
    OUTSIDE_STEP,
    Cost,
    duration,
    eager_leads,
    leads,
    site_phase,
    step_leads,
    steps_of,
)
from tpu_info.views.eager import step_function
from tpu_info.views.slack import beside_queue, dispatch_wait, host_paced, step_device_seconds
from tpu_info.views.startup import startup_seconds

# The compile stages JAX reports apart (torch's CompileTime holds them all).
COMPILE_PARTS = (catalog.COMPILE_TIME, catalog.TRACE_TIME, catalog.LOWERING_TIME)
# The device's samples are told from the host's own time only on a step at
# least this long, whose host work measured as the host's (copies, a jit
# wrapper, work between steps) is under HOST_HELD of it: the watcher that
# times them needs the GIL the training thread holds, so on a sub-ms step or
# a step the host fills they hold the host's time (nnx_lifted: 1.0 ms of
# samples on a 357 us step whose nnx wrapper took 47 %).
TOLD_STEP_S = 1e-3
HOST_HELD = 0.5
# A step part that is the host's own work, not its waits or the rest.
_NOT_HOST_WORK = ("waits at reads", "waits in dispatch", "other")


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the run or of a step: ``seconds`` (per step for a step's
    parts), and what it stands on, in words ("" when plain)."""

    name: str
    seconds: float
    basis: str = ""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The run's parts (shares of ``run_seconds``) and the steady step's.

    Attributes:
        run_seconds: the process's uptime.
        parts: start-up, compiles, steps, each periodic work, other (only
            those measured), in that order.
        overlap: the parts add up past the run by this many seconds (they
            overlapped: a compile inside a step); 0 otherwise.
        step_seconds: the steady step's wall time (None: steps not timed).
        step_parts: the host's timeline of a steady step: copies to the
            device, reads' waits, other host work (per step).
        device: the device's time per steady step (None: not measured; more
            than the step where its samples, each an upper bound, ran late).
        device_basis: what ``device`` stands on.
    """

    run_seconds: float
    parts: tuple[Part, ...]
    overlap: float = 0.0
    step_seconds: float | None = None
    step_parts: tuple[Part, ...] = ()
    device: float | None = None
    device_basis: str = ""

    @property
    def device_blurred(self) -> bool:
        """The device's samples cannot be told from the host's own time: the
        step is under :data:`TOLD_STEP_S`, or the host's measured work holds
        :data:`HOST_HELD` of it or more. They are then at most an upper
        bound, and none at all where they pass the step."""
        w = self.step_seconds
        if self.device is None or not w:
            return False
        return w < TOLD_STEP_S or self._host_work() >= HOST_HELD * w

    def _host_work(self) -> float:
        """The step's parts measured as the host's own work, per step."""
        return sum(p.seconds for p in self.step_parts if p.name not in _NOT_HOST_WORK)

    @property
    def device_waits(self) -> float | None:
        """Share of the steady step the device had no work: it waited for the
        host (None: the device's time or the step's was not measured, or its
        samples hold the host's time: :attr:`device_blurred`)."""
        if self.device is None or not self.step_seconds or self.device_blurred:
            return None
        return max(0.0, 1.0 - self.device / self.step_seconds)  # 0: busy all of it

    def _device_words(self) -> str:
        """``; device busy 2.0 ms (3%, median of 40 timed executions)``, its
        bound, or that it was not measured ("" when it was not sampled)."""
        w, dev = self.step_seconds or 0.0, self.device
        if dev is None or not w:
            return ""
        if self.device_blurred:
            step = ("this sub-ms step" if w < TOLD_STEP_S else
                    f"this step, {_pct(self._host_work(), w)} of it the host's measured work")
            why = ("they include the timing thread's wait for the GIL the training thread "
                   "holds")
            if dev >= w:
                return (f"; device time unmeasured (its samples, {duration(dev)} a step, "
                        f"{self.device_basis}, ran past {step}: {why})")
            return (f"; device busy at most {duration(dev)} ({_pct(dev, w)}, "
                    f"{self.device_basis}; on {step} {why})")
        if dev > w:
            return (f"; device busy all of it (its measured {duration(dev)} a step, "
                    f"{self.device_basis}, is an upper bound)")
        return f"; device busy {duration(dev)} ({_pct(dev, w)}, {self.device_basis})"

    def lines(self) -> list[str]:
        """``Time: run 2m03s: start-up 7.0 s (6%), ...`` and the step's line."""
        run = self.run_seconds
        cells = [f"{p.name} {duration(p.seconds)} ({_pct(p.seconds, run)})" for p in self.parts]
        out = [f"run {duration(run)}: " + ", ".join(cells)
               + (f" (parts overlap by {duration(self.overlap)})" if self.overlap else "")]
        if self.step_seconds:
            w = self.step_seconds
            host = ", ".join(f"{p.name} {duration(p.seconds)} ({_pct(p.seconds, w)})"
                             for p in self.step_parts)
            out.append(f"steady step {duration(w)}: host {host}{self._device_words()}")
        return out

    def short_line(self) -> str:
        """``steps 73%, compiles 10%, evaluation 7%, ...; steady step 2.9 ms,
        device busy 83%`` (the run summary's)."""
        run = self.run_seconds
        parts = sorted(self.parts, key=lambda p: -p.seconds)
        line = ", ".join(f"{p.name} {_pct(p.seconds, run)}" for p in parts)
        if self.step_seconds:
            line += f"; steady step {duration(self.step_seconds)}"
            if self.device is not None and self.device_blurred:
                if self.device < self.step_seconds:
                    line += f", device busy at most {_pct(self.device, self.step_seconds)}"
            elif self.device is not None:
                line += f", device busy {_pct(self.device, self.step_seconds)}"
        return line

    def fields(self) -> dict[str, Any]:
        """The JSON object (seconds; shares as fractions of the run or step)."""
        run = self.run_seconds
        out: dict[str, Any] = {
            "run_seconds": run,
            "parts": [{"name": p.name, "seconds": p.seconds,
                       "share": p.seconds / run if run > 0 else None,
                       **({"basis": p.basis} if p.basis else {})} for p in self.parts],
            "overlap_seconds": self.overlap,
        }
        if self.step_seconds:
            w = self.step_seconds
            out["steady_step"] = {
                "seconds": w,
                "host": [{"name": p.name, "seconds": p.seconds, "share": p.seconds / w,
                          **({"basis": p.basis} if p.basis else {})} for p in self.step_parts],
                "device_seconds": self.device,
                "device_basis": self.device_basis or None,
                # the samples hold the host's time: an upper bound, none past the step
                "device_upper_bound": self.device_blurred or (
                    self.device is not None and self.device > w),
                "device_waits_share": self.device_waits,
            }
        return out


def _pct(part: float, whole: float) -> str:
    if whole <= 0:
        return "-"
    share = part / whole
    return "<1%" if 0 < share < 0.005 else f"{min(share, 1.0):.0%}"


def compile_seconds(s: Snapshot) -> float:
    """Seconds the compiles took: tracing, lowering and the backend's compile
    (their distributions), or the graphs' own compile time where that is
    more (a torch compile the backend cache answered records Dynamo's
    TraceTime, not the cache's load: nanoGPT's 2.9 s in its graphs read
    663 ms)."""
    total = 0.0
    for name in COMPILE_PARTS:
        d = s.distribution(name)
        if d is not None and d.count:
            total += d.total / 1e9
    return max(total, sum(g.compile_seconds_total for g in s.graphs))


def _site_seconds(s: Snapshot, kind: str) -> tuple[float, str]:
    """The step-phase sites of ``kind``: their seconds (timed copies scaled to
    all by bytes), and what that stands on; those in a gap after every step
    are in that gap's time (:func:`step_leads`)."""
    total, timed, count = 0.0, 0, 0
    between = step_leads(s)
    for x in s.sites:
        if (x.kind != kind or site_phase(s, x) in OUTSIDE_STEP or x.seconds <= 0
                or x.within in between):
            continue
        if 0 < x.timed < x.count:
            scale = x.bytes / x.timed_bytes if x.timed_bytes else x.count / x.timed
            total += x.seconds * scale
            timed += x.timed
        else:
            total += x.seconds
            timed += x.count
        count += x.count
    basis = f"timed {timed:,} of {count:,}" if count and timed < count else ""
    return total, basis


def _wrapper_seconds(s: Snapshot) -> tuple[float, str, str]:
    """The steps' library jit wrappers' own host time (``library_jit`` sites:
    their median sampled time times their calls), which they are, and what
    it stands on."""
    total, vias, timed = 0.0, set(), 0
    step = step_function(s)  # the step's wrapper (an evaluation's calls are no steps)
    for x in s.sites:
        if (x.kind == SiteKind.LIBRARY_JIT.value and x.seconds > 0 and x.detail == step
                and site_phase(s, x) not in OUTSIDE_STEP):
            total += x.seconds
            timed += x.timed
            vias.add(x.via or "a library's jit wrapper")
    via = ", ".join(sorted(vias))
    return total, via, (f"outside its jitted call: median of {timed:,} sampled calls"
                        if vias else "")


def _periodic_seconds(s: Snapshot) -> dict[str, float]:
    """The periodic work's measured wall time, by work (evaluation, checkpoint)."""
    out: dict[str, float] = {}
    for site in leads(s).values():
        out[site.work] = out.get(site.work, 0.0) + (site.gap_seconds or 0.0)
    return out


HOST_CODE = "your code between steps"  # the step part of host_work sites
EAGER_CODE = "JAX outside jit"  # of eager_work sites: JAX's time at the user's lines


def host_code_per_step(s: Snapshot, step: float | None = None,
                       kind: str = SiteKind.HOST_WORK.value) -> tuple[float, int]:
    """(seconds a step the training thread ran the user's own host code
    between the step's calls: each ``host_work`` line's :func:`line_per_step`,
    summed; the intervals that stands on); ``kind`` ``eager_work``: JAX's
    time at those lines."""
    total, intervals = 0.0, 0
    for x in s.sites:
        if x.kind == kind and x.timed > 0 and x.seconds > 0:
            total += line_per_step(x, step)
            intervals = max(intervals, x.timed)
    return total, intervals


def line_per_step(x: SiteReading, step: float | None) -> float:
    """A ``host_work`` line's time a step: its median share of the sampled
    intervals times the steady step ``step`` where the hook told the share
    (torch: an actor-critic's intervals, sampled most in its first and
    shortest episodes, read 2 % where the line took half of each), else its
    median time per interval."""
    if x.interval_share is not None and step:
        return x.interval_share * step
    return x.seconds / x.timed


def host_left(b: Breakdown) -> float:
    """The steady step's host time no measured part but the user's code
    between steps took (what that code's lines are said at most)."""
    if not b.step_seconds:
        return 0.0
    return max(0.0, b.step_seconds - sum(p.seconds for p in b.step_parts
                                         if p.name not in (HOST_CODE, EAGER_CODE, "other")))


class DeviceIdle(NamedTuple):
    """The steady steps' time the device was not busy (``seconds``, in all),
    its own time per step and the timed executions that stands on."""

    seconds: float
    device_per_step: float
    samples: int


def device_idle(s: Snapshot) -> DeviceIdle | None:
    """The steady steps less the device's measured time for them: what host
    work could have added to the loop at most (None: not measured)."""
    steps = steps_of(s)
    dev = step_device_seconds(s)
    if steps is None or dev is None:
        return None
    steady = steps.steady_seconds_total
    if steady is None or dev[0] * steps.count > steady:
        # A device busier than the steps are long: its samples (each an upper
        # bound: the watcher wakes late) are not to be trusted for a bound.
        return None
    return DeviceIdle(steady - dev[0] * steps.count, dev[0], dev[1])


def copy_bound(s: Snapshot, cost: Cost, what: str = "the copies'") -> Cost:
    """A copy to the device in the steps costs what exceeds the host's slack
    (:func:`~tpu_info.views.slack.beside_queue`: the host makes it while the
    device runs the queued steps), and at most the steps' time the device
    was not busy (:func:`device_idle`). Neither where the host set the
    loop's pace (:func:`host_paced`): the device's sampled times are upper
    bounds, so "the steps less the device's time" is no bound there."""
    if cost.outside_step or cost.estimated or cost.seconds <= 0 or host_paced(s) is not None:
        return cost
    cost = beside_queue(s, cost, "the copies")
    idle = device_idle(s)
    if idle is None or cost.seconds <= idle.seconds:
        return cost
    bound = (f"at most the steps' time the device was not busy: the device's own "
             f"{duration(idle.device_per_step)}/step (median of {idle.samples:,} timed "
             f"executions) overlapped {what} {duration(cost.seconds)}")
    return replace(cost, seconds=idle.seconds,
                   note=f"{cost.note}; {bound}" if cost.note else bound)


def breakdown(s: Snapshot) -> Breakdown | None:
    """``s``'s run and steady step split by what spent the time; None when
    the process told no uptime."""
    run = s.uptime_seconds
    if run <= 0:
        return None
    parts: list[Part] = []
    if (start := startup_seconds(s)) is not None and start > 0:
        parts.append(Part("start-up", start, "opening the device backends"))
    if (compiled := compile_seconds(s)) > 0:
        parts.append(Part("compiles", compiled, "tracing, lowering and compiling"))
    steps = steps_of(s)
    periodic = _periodic_seconds(s)
    steady = step_w = None
    if steps is not None and steps.count:
        steady = steps.steady_seconds_total  # less compiles and periodic work in the loop
        if steady is not None:
            parts.append(Part("steps", steady, f"{steps.count:,} steps"))
            step_w = steady / steps.count if steady > 0 else None
    for work, seconds in sorted(periodic.items()):
        # device_work: device work a read in the gaps waited for, sent by no call seen
        parts.append(Part("unseen work" if work == "device_work" else work, seconds,
                          "its gaps' wall time"))
    used = sum(p.seconds for p in parts)
    overlap = max(0.0, used - run)
    if run - used > 0:
        parts.append(Part("other", run - used, "imports, set-up and host work outside the "
                                                 "step loop"))
    if step_w is None or steps is None:
        return Breakdown(run, tuple(parts), overlap)
    copies, copies_basis = _site_seconds(s, SiteKind.IMPLICIT_TO_DEVICE.value)
    waits, waits_basis = _site_seconds(s, SiteKind.SYNC.value)
    n = steps.count
    wrapped, wrapped_via, wrapped_basis = _wrapper_seconds(s)
    host = [Part("copies to the device", min(copies / n, step_w), copies_basis),
            Part("waits at reads", min(waits / n, step_w), waits_basis)]
    host = [p for p in host if p.seconds > 0]
    # A torch DataLoader's batches the main thread drew in the steps (an
    # evaluation's are in its gaps' time): every batch timed.
    drawn = [x for x in s.sites if x.kind == SiteKind.DATA_LOADER.value and not x.within
             and site_phase(s, x) not in OUTSIDE_STEP]
    if (loading := sum(x.seconds for x in drawn)) > 0:
        batches = sum(x.count for x in drawn)
        host.append(Part("data loading", min(loading / n, max(0.0, step_w - sum(
            p.seconds for p in host))), f"the DataLoader's __next__, {batches:,} batches timed"))
    if wrapped > 0:  # a library's jit wrapper's own work (flax nnx.jit), within the step
        host.append(Part(f"jit wrapper ({wrapped_via})", min(wrapped / n, max(0.0, step_w - sum(
            p.seconds for p in host))), wrapped_basis))
    # Work in a gap after every step (a plotting callback): its measured
    # wall time, within what the other parts leave of the step.
    eager = eager_leads(s)  # (in the eager work's part, below)
    between = sum(x.gap_seconds or 0.0 for k, x in step_leads(s).items() if k not in eager) / n
    if between > 0:
        host.append(Part("work between steps", min(between, max(0.0, step_w - sum(
            p.seconds for p in host))), "its gaps' wall time"))
    # The user's own host code between the steps (no JAX in it: a loader's
    # numpy), its lines' medians over the sampled intervals between steps.
    for name, kind in ((EAGER_CODE, SiteKind.EAGER_WORK.value),
                       (HOST_CODE, SiteKind.HOST_WORK.value)):
        code, intervals = host_code_per_step(s, step_w, kind)
        if name == EAGER_CODE:
            code += sum(x.gap_seconds or 0.0 for x in eager.values()) / n
        if code > 0:
            host.append(Part(name, min(code, max(0.0, step_w - sum(p.seconds for p in host))),
                             f"median of {intervals:,} sampled intervals between steps"))
    if (waited := dispatch_wait(s)) is not None:  # the device's queue held the step's call
        host.append(Part("waits in dispatch", min(waited[0], max(0.0, step_w - sum(
            p.seconds for p in host))), f"mean of {waited[1]:,} sampled calls"))
    rest = step_w - sum(p.seconds for p in host)
    host.append(Part("other", max(0.0, rest)))
    dev = step_device_seconds(s)
    device, basis = None, ""
    if dev is not None:
        device = dev[0]
        basis = f"median of {dev[1]:,} timed executions"
    return Breakdown(run, tuple(parts), overlap, step_w, tuple(host), device, basis)

