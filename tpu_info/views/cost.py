"""What a finding cost: per step, as a share of step time, measured or estimated.

One place turns "this happened N times and took S seconds" into the fields a
:class:`~tpu_info.contract.model.Finding` carries and the words its message says, so
every rule states its cost the same way. Per-step figures exist only when the
snapshot knows its steps (marked or inferred); without them the words give the
total and say the steps are not known, never a guessed per-step figure.

Example:
    >>> from tpu_info.contract.model import Snapshot, StepsReading
    >>> s = Snapshot(0.0, steps=StepsReading(1200, "inferred", "jit(step)", 164.0))
    >>> cost_of(s, 4.92, 1200).words()
    '1,200 times, 1.0 per step, 4.1 ms/step, 3.0% of step time, measured'
    >>> cost_of(Snapshot(0.0), 4.92, 1200).words()
    '1,200 times, 4.9 s in all, measured; steps are not known, so no per-step figure'
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from tpu_info.contract.catalog import COMPILE_STEP_TIME, MARK_STEP, STEP_TIME
from tpu_info.contract.model import (
    STEPS_MARKED,
    Phase,
    Severity,
    SiteKind,
    SiteReading,
    Snapshot,
    StepsReading,
)
from tpu_info.contract.phases import every_steps, phase_of


def duration(seconds: float) -> str:
    """``0.0041`` -> ``4.1 ms``; ``0.00003`` -> ``30 us``; ``4e-7`` -> ``0.4 us``;
    ``12.3`` -> ``12.3 s``."""
    if seconds < 1e-5:
        return f"{seconds * 1e6:.2g} us" if seconds >= 5e-8 else "<0.1 us"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 0.01:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.1f} s"


def short_location(location: str | None) -> str:
    """Where a finding happened, as its words say it: ``/abs/path/train.py:88``
    -> ``train.py:88``."""
    if not location:
        return ""
    return os.path.basename(location)


def share_words(share: float) -> str:
    """``0.03`` -> ``3.0%``; ``0.004`` -> ``0.4%``; ``0.5`` -> ``50%``;
    ``0.00031`` -> ``0.031%`` (a small share keeps two digits, never ``0.0%``);
    below ``1e-5``, ``<0.001%``."""
    if share >= 0.1:
        return f"{share:.0%}"
    if share >= 0.01:
        return f"{share * 100:.1f}%"
    return f"{share * 100:.2g}%" if share >= 1e-5 else "<0.001%"


def size_words(nbytes: float) -> str:
    """``3_200_000`` -> ``3.2 MB`` (decimal units, as transfer rates are quoted)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


# PeriodicWork values said here (device_work: a read that waited for device
# work sent in the gap, unseen: an eager evaluation).
LED = frozenset({"evaluation", "checkpoint", "device_work", "logging"})
PER_STEP_GAPS = 0.5  # gaps after at least this share of the steps: work of every step


def _told_phase(site: SiteReading) -> Phase:
    try:
        return Phase(site.phase)
    except ValueError:
        return Phase.UNKNOWN


def leads(s: Snapshot) -> dict[str, SiteReading]:
    """The lines that led periodic evaluation or checkpoint gaps, by location."""
    return {x.location: x for x in s.sites
            if x.work in LED and x.gaps and x.gap_seconds and _told_phase(x) == Phase.PERIODIC}


def step_leads(s: Snapshot) -> dict[str, SiteReading]:
    """The lines that led gaps after (nearly) every step: work between the
    steps that runs each step (a plotting callback), by location: in the
    step phase, and with gaps after at least half the steps (the phase
    alone stands on all its records). Their time is the steps' (not taken
    out of them as :func:`leads`' is). A read every step (logging) is its
    own finding (per_step_sync), not work between steps."""
    steps = s.steps.count if s.steps is not None else 0
    return {x.location: x for x in s.sites
            if x.work in LED and x.work != "logging" and x.gap_seconds and steps
            and x.gaps >= PER_STEP_GAPS * steps
            and _told_phase(x) == Phase.STEP}


def eager_leads(s: Snapshot) -> dict[str, SiteReading]:
    """Of :func:`step_leads`, a library's jitted function (optax's
    ``tree_bias_correction``) called every step from a line that runs JAX
    outside jit there (``eager_work``: an optimizer update run op by op):
    part of that line's eager work, not work of its own between steps."""
    eager = {x.location for x in s.sites if x.kind == SiteKind.EAGER_WORK.value}
    return {k: x for k, x in step_leads(s).items()
            if x.kind == SiteKind.CALL.value and x.via and k in eager}


def steps_of(s: Snapshot) -> StepsReading | None:
    """The snapshot's steps; for an older hook without them, its ``MarkStep``
    counter (and ``StepTime`` total) as marked steps. None when nothing counts steps.
    The compile steps the engine told (``CompileStepTime``: compiles and the
    backends' start-up inside the loop) and the periodic work in the loop's
    gaps (:func:`leads`) are joined in, so every share of step time is taken
    over the steady steps (``steady_seconds_total``)."""
    if s.steps is not None and s.steps.count > 0:
        steps: StepsReading = s.steps
    else:
        marks = s.counter(MARK_STEP)
        if not marks:
            return None
        step_time = s.distribution(STEP_TIME)
        total = None
        if step_time is not None and step_time.count:
            total = step_time.total / 1e9 / step_time.count * marks
        steps = StepsReading(marks, STEPS_MARKED, "metrics.mark_step", total)
    compiles = s.distribution(COMPILE_STEP_TIME)
    if compiles is not None and compiles.count and not steps.compile_steps:
        seconds = compiles.total / 1e9
        if steps.seconds_total is not None:
            seconds = min(seconds, steps.seconds_total)
        steps = replace(steps, compile_steps=min(compiles.count, steps.count),
                        compile_seconds=seconds)
    # Evaluations and checkpoints in the loop's gaps ran inside the steps'
    # span: their measured wall time is theirs, not the steps'.
    periodic = sum(x.gap_seconds or 0.0 for x in leads(s).values())
    if periodic > 0 and steps.seconds_total is not None and not steps.periodic_seconds:
        steps = replace(steps, periodic_seconds=min(
            periodic, max(0.0, steps.seconds_total - steps.compile_seconds)))
    return steps


def steady_step_words(steps: StepsReading) -> str:
    """``compiles: 43.0 s in 3 steps`` when compile work sat inside the loop
    (the steady step leaves it out), else ``""``."""
    if not steps.compile_steps or steps.compile_seconds <= 0:
        return ""
    n = steps.compile_steps
    return f"compiles: {duration(steps.compile_seconds)} in {n:,} step{'s' * (n != 1)}"


# Phases whose work is not part of every step: costed per occurrence and as
# a share of the run, never per step.
OUTSIDE_STEP = frozenset({Phase.SETUP, Phase.PERIODIC, Phase.ONCE, Phase.TEARDOWN})
# When one-off work ran, in words.
WHEN = {Phase.SETUP: "at start-up, before the first step", Phase.ONCE: "in the step loop",
        Phase.TEARDOWN: "after the last step"}


@dataclass(frozen=True, slots=True)
class Cost:
    """A finding's cost. ``how`` says how it was estimated when ``estimated``
    (``"estimated at 10 GB/s"``); a timed cost says ``measured``. ``phase``
    is where it happened (:class:`~tpu_info.contract.model.Phase`): work
    outside the step (set-up, periodic, once, tear-down) is costed per
    occurrence and over ``run_seconds``, never spread over the steps. Per-step
    work measured at more than the steps took in all cannot all be in
    them: it gets no per-step figure and says so (:attr:`beyond_steps`), or,
    with ``capped`` (a graph table's cell, compile time included), is said at
    the steps' time."""

    seconds: float
    count: int | None
    estimated: bool
    how: str
    steps: StepsReading | None
    phase: Phase = Phase.UNKNOWN
    run_seconds: float = 0.0
    span: tuple[float, float] | None = None  # first and last occurrence (unix)
    note: str = ""  # after the label: what the figure stands for, where it is a bound
    apart: float | None = None  # steps between occurrences, counted by the hook (else from time)
    capped: bool = False

    @property
    def outside_step(self) -> bool:
        return self.phase in OUTSIDE_STEP

    @property
    def beyond_steps(self) -> bool:
        """Per-step work measured at more than the steps took in all, their
        compiles and periodic work included (counted across more than the
        steps, or not step work at all). Between the steady steps' time and
        that, some of it ran in the steps that compiled: said at most the
        steady steps' time."""
        if self.steps is None or self.outside_step or self.capped:
            return False
        whole = self.steps.seconds_total or self.steps.steady_seconds_total
        return bool(whole) and self.seconds > whole

    @property
    def per_step(self) -> float | None:
        if self.steps is None or self.count is None or self.outside_step:
            return None
        return self.count / self.steps.count

    @property
    def seconds_per_step(self) -> float | None:
        if self.steps is None or self.outside_step or self.beyond_steps:
            return None
        seconds = self.seconds
        steady = self.steps.steady_seconds_total
        if steady:  # (capped) part of the steady steps: never more than they took
            seconds = min(seconds, steady)
        return seconds / self.steps.count

    @property
    def share_of_step(self) -> float | None:
        """The cost over the steady steps' time (compiles inside the loop
        left out: one-off, said on their own line)."""
        steady = None if self.steps is None else self.steps.steady_seconds_total
        if not steady or self.outside_step or self.beyond_steps:
            return None
        return min(1.0, self.seconds / steady)

    @property
    def share_of_run(self) -> float | None:
        """The cost over the run's wall time so far (work outside the step)."""
        if not self.outside_step or self.run_seconds <= 0:
            return None
        return min(1.0, self.seconds / self.run_seconds)

    @property
    def every_steps(self) -> float | None:
        if self.phase != Phase.PERIODIC:
            return None
        if self.apart and (self.steps is None or self.apart <= self.steps.count):
            return max(1.0, self.apart)
        return every_steps(self.count or 0, self.steps, self.span)

    @property
    def untimed(self) -> bool:
        """Nothing was measured to cost it by: no figure is said."""
        return self.estimated and self.seconds <= 0 and self.how.startswith("not timed")

    def label(self) -> str:
        said = self.how if self.estimated else "measured"
        return f"{said}; {self.note}" if self.note else said

    def _outside_tail(self) -> str:
        """``every 40 steps, 480 ms each, 4.0% of run time, measured``;
        ``once at start-up, before the first step, 1.4 s, 12% of run time, measured``."""
        n = self.count or 1
        mark = "~" if self.estimated else ""
        run = self.share_of_run
        share = f", {share_words(run)} of run time" if run is not None else ""
        if self.phase == Phase.PERIODIC:
            every = self.every_steps
            how_often = f"every {every:,.0f} steps" if every else f"{n:,} times"
            return (f"{how_often}, {mark}{duration(self.seconds / n)} each"
                    f"{share}, {self.label()}")
        # All of the set-up (or tear-down) is one stretch, done once, in pieces or not.
        once = "once" if n == 1 or self.phase != Phase.ONCE else "one-off"
        return f"{once} {WHEN[self.phase]}, {mark}{duration(self.seconds)}{share}, {self.label()}"

    def tail(self) -> str:
        """The per-step part: ``1.0 per step, 4.1 ms/step, 3.0% of step time,
        measured``, or ``measured; steps are not known, so no per-step figure``;
        for work outside the step, when and what it cost (:meth:`_outside_tail`)."""
        if self.steps is None:
            return f"{self.label()}; steps are not known, so no per-step figure"
        if self.outside_step:
            return self._outside_tail()
        parts = []
        if (p := self.per_step) is not None:
            parts.append(f"{p:.2g} per step" if p < 0.1 else f"{p:.1f} per step")
        mark = "~" if self.estimated else ""
        if self.untimed:  # no figure: the label says why
            return ", ".join(parts + [self.label()])
        if self.beyond_steps:
            steps = self.steps
            assert steps is not None
            parts.append(f"{mark}{duration(self.seconds)} in all, more than the steps took "
                         f"({duration(steps.seconds_total or steps.steady_seconds_total)}): "
                         "not all of it is in the steps, so no per-step figure")
            return ", ".join(parts) + f", {self.label()}"
        parts.append(f"{mark}{duration(self.seconds_per_step or 0.0)}/step")
        if (share := self.share_of_step) is not None:
            parts.append(f"{share_words(share)} of step time")
        return ", ".join(parts) + f", {self.label()}"

    def words(self) -> str:
        """``1,200 times, 1.0 per step, 4.1 ms/step, 3.0% of step time, measured``;
        without steps ``1,200 times, 4.9 s in all, measured; steps are not known...``."""
        parts = [] if self.count is None else [f"{self.count:,} time{'s' * (self.count != 1)}"]
        if self.steps is None:
            parts.append(f"{duration(self.seconds)} in all")
        return ", ".join(parts + [self.tail()])

    def fields(self) -> dict[str, Any]:
        """The :class:`~tpu_info.contract.model.Finding` fields this cost fills."""
        return {"seconds_lost": self.seconds, "count": self.count, "per_step": self.per_step,
                "seconds_per_step": self.seconds_per_step, "share_of_step": self.share_of_step,
                "cost_estimated": self.estimated, "share_of_run": self.share_of_run,
                "every_steps": self.every_steps,
                "phase": "" if self.phase == Phase.UNKNOWN else self.phase.value}


# Work outside the step is a warning only when it weighs on the run: periodic
# work from this share of the run's time, one-off work (set-up, once,
# tear-down) from this share and this long (start-up a longer run pays once).
PERIODIC_WARN_SHARE = 0.05
ONE_OFF_WARN_SHARE = 0.25
ONE_OFF_WARN_SECONDS = 5.0


def outside_warns(c: Cost) -> bool:
    """Whether work outside the step (``c.outside_step``) is worth a warning."""
    share = c.share_of_run or 0.0
    if c.phase == Phase.PERIODIC:
        return share >= PERIODIC_WARN_SHARE
    return share >= ONE_OFF_WARN_SHARE and c.seconds >= ONE_OFF_WARN_SECONDS


def cost_of(s: Snapshot, seconds: float, count: int | None, estimated: str = "",
            phase: Phase | str = Phase.UNKNOWN,
            span: tuple[float, float] | None = None, note: str = "",
            apart: float | None = None) -> Cost:
    """The cost of something that happened ``count`` times and took ``seconds``
    in ``s``; ``estimated`` names how the seconds were estimated (empty: measured);
    ``phase`` where it happened (:func:`tpu_info.contract.phases.phase_of`),
    ``span`` its first and last time (for how many steps apart it recurs);
    ``note`` what the figure stands for, said after how it was had; ``apart``
    how many steps apart it recurred, where the hook counted them."""
    return Cost(max(0.0, seconds), count, bool(estimated), estimated, steps_of(s),
                as_phase(phase), s.uptime_seconds, span, note, apart)


def below_bar(c: Cost, bar: float) -> str:
    """Why a per-step cost is no finding: ``""`` where its share of the step
    reaches ``bar``, else ``2.0 ms/step, 3.0% of step time (said from 5.0%)``."""
    share = c.share_of_step or 0.0
    if share >= bar:
        return ""
    return (f"{duration(c.seconds_per_step or 0.0)}/step, {share_words(share)} of step time "
            f"(said from {share_words(bar)})")


def site_phase(s: Snapshot, site: SiteReading) -> Phase:
    """The phase the hook told for ``site``, else told here from its times
    (an older hook's sites)."""
    if site.phase:
        return as_phase(site.phase)
    return phase_of(site.first_seen_unix or site.last_seen_unix, site.last_seen_unix,
                    min(site.occurrences, site.count) or site.count, steps_of(s))


def as_phase(value: Phase | str) -> Phase:
    """A phase from the wire (a plain string); an unknown one is UNKNOWN."""
    try:
        return Phase(value) if value else Phase.UNKNOWN
    except ValueError:
        return Phase.UNKNOWN


def engine_of(s: Snapshot) -> str:
    """The snapshot's engine (``jax``, ``torch_compile``, ``torch_xla``), for
    advice in that engine's words; empty when unknown."""
    if s.process is not None and s.process.engine:
        return s.process.engine.split(",")[0].split(" ")[0]
    return next((g.engine for g in s.graphs), "")


def rank_key(f: Any) -> tuple[float, float, int]:
    """Costliest first (seconds lost, then share of step time); warnings before
    info at equal cost."""
    return (-f.seconds_lost, -(f.share_of_step or 0.0), f.severity != Severity.WARNING)


def cost_cell(f: Any) -> str:
    """A finding's cost in a table cell: ``4.1 ms/step 3.0%``, ``2.8 s`` when
    steps are unknown, ``-`` when it cost nothing measurable; ``~`` marks an
    estimate."""
    mark = "~" if f.cost_estimated else ""
    if f.phase in OUTSIDE_STEP and f.seconds_lost > 0:
        n = max(1, f.count or 1)
        if f.phase == Phase.PERIODIC and f.every_steps:
            return f"{mark}{duration(f.seconds_lost / n)} /{f.every_steps:,.0f} steps"
        if f.phase == Phase.PERIODIC:
            return f"{mark}{duration(f.seconds_lost)} in all"
        return f"{mark}{duration(f.seconds_lost)} once"
    if f.seconds_per_step is not None and f.seconds_lost > 0:
        share = f" {share_words(f.share_of_step)}" if f.share_of_step is not None else ""
        return f"{mark}{duration(f.seconds_per_step)}/step{share}"
    if f.seconds_lost > 0:
        return f"{mark}{duration(f.seconds_lost)}"
    return "-"
