"""A process's steps as one line: how many, how fast, how long each, how busy.

Every figure comes from a view the CLI already shows, so the dashboard's step
line and the tables never disagree: the count (and its N/A words) is
:func:`~tpu_info.views.derived.process_row`'s Steps cell, the mean step time is
:attr:`~tpu_info.contract.model.StepsReading.seconds_per_step` (the text
report's "per step"), the percentiles are the ``StepTime`` distribution's
(:func:`~tpu_info.views.values.dist_percentile`, as ``tpu-info metrics``: N/A
from fewer than :data:`~tpu_info.views.values.MIN_TIMED_SAMPLES` timed steps,
and with the number of timed steps they stand on), and busy % is the devices
table's (:func:`~tpu_info.views.derived.device_row`).
Only the rate needs two readings: steps counted between them over the time
between them.

Example:
    >>> from tpu_info.contract.model import Snapshot, StepsReading
    >>> a = Snapshot(10.0, steps=StepsReading(1000, "inferred", "jit(step)", 2.0))
    >>> b = Snapshot(11.0, steps=StepsReading(2500, "inferred", "jit(step)", 3.0))
    >>> line = step_line(TargetView("h:1", b), a)
    >>> line.steps.text(), line.per_second.value, line.step_seconds.value
    ('~2,500', 1500.0, 0.0012)
    >>> line.p50_seconds.text(), line.p50_seconds.reason[:24]
    ('N/A', 'the steps are inferred (')
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_info.contract.catalog import STEP_TIME
from tpu_info.contract.model import STEPS_INFERRED, Snapshot
from tpu_info.views.cost import steps_of
from tpu_info.views.derived import Derived, device_row, process_row
from tpu_info.views.values import (
    NO_STEPS,
    TargetView,
    clean,
    dist_percentile,
    transfer_stats,
)

NO_RATE = "steps/s needs two readings with steps between them"


@dataclass(frozen=True, slots=True)
class StepLine:
    """One process's steps, each value with the reason it is missing.

    Attributes:
        steps: the Processes table's Steps cell (``~1,200`` when inferred).
        per_second: steps per second between the last two readings.
        step_seconds: mean wall time per steady step since the program
            started (the steps less the compiles and start-up inside them).
        p50_seconds, p99_seconds: step time percentiles (marked steps only:
            ``StepTime`` times each step).
        busy: busy % of the process's devices (their mean), as the devices
            table shows it.
        basis: what a step was taken to be ("" when marked or unknown).
        na: ``(where, reason)`` of each N/A, for tooltips and ``n``.
        timed: the timed steps the percentiles stand on (``StepTime``'s
            count; 0 when there is none).
        timed_note: ``25 timed`` where they stand on fewer steps than were
            counted ("" otherwise: N marks time the N - 1 steps between them).
    """

    steps: Derived[str]
    per_second: Derived[float]
    step_seconds: Derived[float]
    p50_seconds: Derived[float]
    p99_seconds: Derived[float]
    busy: Derived[float]
    basis: str = ""
    na: tuple[tuple[str, str], ...] = ()
    timed: int = 0
    timed_note: str = ""


def step_count(s: Snapshot) -> int | None:
    """Steps so far (marked, else inferred); None when nothing counts them."""
    st = steps_of(s)
    return st.count if st is not None else None


def steps_per_second(prev: Snapshot | None, s: Snapshot) -> float | None:
    """Steps between ``prev`` and ``s`` over the time between them; None
    without a usable earlier reading (none, the same instant, or a restart)."""
    if prev is None:
        return None
    now, then = step_count(s), step_count(prev)
    dt = s.taken_at_unix - prev.taken_at_unix
    if now is None or dt <= 0 or (then is not None and now < then):
        return None
    return (now - (then or 0)) / dt


def transfers_per_second(prev: Snapshot | None, s: Snapshot) -> tuple[float, float] | None:
    """Host->device and device->host transfers a second between two readings
    (the counts of the Transfers table); None without a usable earlier one,
    or when the process never recorded a transfer."""
    if prev is None or s.taken_at_unix <= prev.taken_at_unix:
        return None
    dt = s.taken_at_unix - prev.taken_at_unix
    now, then = transfer_stats(s), transfer_stats(prev)
    if not (now[0].count or now[1].count) or any(
            a.count < b.count for a, b in zip(now, then, strict=True)):
        return None
    return ((now[0].count - then[0].count) / dt, (now[1].count - then[1].count) / dt)


def interval_step_seconds(prev: Snapshot | None, s: Snapshot) -> float | None:
    """Mean time per step between two readings (the sparkline's values): the
    steps' own time when the hook reports it, else wall time over steps."""
    if prev is None:
        return None
    a, b = steps_of(prev), steps_of(s)
    if b is None:
        return None
    done = b.count - (a.count if a is not None else 0)
    if done <= 0:
        return None
    if (a is not None and a.seconds_total is not None and b.seconds_total is not None
            and b.seconds_total >= a.seconds_total and a.source == b.source):
        return (b.seconds_total - a.seconds_total) / done
    dt = s.taken_at_unix - prev.taken_at_unix
    return dt / done if dt > 0 else None


def _busy(v: TargetView, s: Snapshot) -> Derived[float]:
    rows = [device_row(v, d) for d in s.devices]
    known = [r.busy.value for r in rows if r.busy.value is not None]
    if known:
        return Derived(sum(known) / len(known))
    if not rows:
        return Derived(None, "the process reported no devices")
    return Derived(None, rows[0].busy.reason)


def step_line(v: TargetView, prev: Snapshot | None = None) -> StepLine:
    """``v``'s step line (``v.snapshot`` set); ``prev`` is the reading before,
    for the rate."""
    s = v.snapshot
    assert s is not None
    where = f"steps/{v.target}"
    na: list[tuple[str, str]] = []

    def get(name: str, value: float | None, reason: str) -> Derived[float]:
        if value is None:
            na.append((f"{where}/{name}", reason))
        return Derived.of(value, reason)

    row = process_row(v)
    steps = row.steps_short if row is not None else Derived(None, NO_STEPS)
    st = steps_of(s)
    if st is None:
        why = steps.reason or NO_STEPS
        gone: Derived[float] = Derived(None, why)
        na.append((where, why))
        return StepLine(steps, gone, gone, gone, gone, _busy(v, s), "", tuple(na))
    rate = get("per_second", steps_per_second(prev, s), NO_RATE)
    # The steady step: compiles inside the loop (and the start-up) left out.
    mean = get("step_time", st.steady_seconds_per_step, "the hook did not time the steps")
    basis = clean(st.basis, 120) if st.source == STEPS_INFERRED else ""
    dist = s.distribution(STEP_TIME)
    if dist is not None and not dist.count:
        dist = None
    # Inferred steps have step times only where the hook timed them (a torch
    # program's optimizer steps, when nothing marks steps): else N/A.
    if dist is None:
        why = (f"the steps are inferred ({basis.split(': ', 1)[0]}): no single step is timed; "
               "metrics.mark_step() each step gives P50/P99" if st.source == STEPS_INFERRED
               else "the hook sent no StepTime distribution")
        p50, p99 = get("p50", None, why), get("p99", None, why)
    else:
        v50, why50 = dist_percentile(dist, 50.0)
        v99, why99 = dist_percentile(dist, 99.0)
        p50 = get("p50", v50 / 1e9 if v50 is not None else None, why50)
        p99 = get("p99", v99 / 1e9 if v99 is not None else None, why99)
    busy = _busy(v, s)
    if busy.value is None:
        na.append((f"{where}/busy", busy.reason))
    timed = dist.count if dist is not None else 0
    note = f"{timed:,} timed" if p50.value is not None and timed < st.count - 1 else ""
    return StepLine(steps, rate, mean, p50, p99, busy, basis, tuple(na), timed, note)
