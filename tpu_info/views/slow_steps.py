"""Rare slow steps: which steps were outliers, and what happened in them.

A loop that checkpoints, evaluates or logs every N steps has a few steps far
slower than the rest; a rule that asks "did this happen in half the steps?"
never sees them. Here the step times (``StepTime``: marked steps) give the
outliers (slower than :data:`SLOW_FACTOR` times the median), and the hook's
records with a time say what ran in them: compiles (with their function),
device->host transfers (with their bytes), and the lines that ran in the
loop's gaps (periodic sites, with their line). What none of them explains is
host time the hook does not see at a line, and is said so. A step's compiles
(their events' seconds) are the compile's, which the recompile and compile
findings say: a step counts only for its time beyond them, and they are no
suspect. A step that held an evaluation or checkpoint that
:mod:`~tpu_info.views.periodic` names and costs counts only for its time
beyond that work (:func:`unexplained`), and nothing that ran in the work is a
suspect: that work is its finding's.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> list(slow_steps(Snapshot(taken_at_unix=0.0)))
    []
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import NamedTuple

from tpu_info.contract.catalog import INBOUND_DATA, STEP_TIME, TRANSFER_FROM_DEVICE_TIME
from tpu_info.contract.model import (
    COMPILE_KINDS,
    DistributionReading,
    Finding,
    Phase,
    Severity,
    SiteReading,
    Snapshot,
)
from tpu_info.views.cost import duration, leads, share_words, short_location, size_words
from tpu_info.views.periodic import part_of_periodic_work, periodic_seconds
from tpu_info.views.sites import site_phase
from tpu_info.views.slack import loaded_machine

SLOW_FACTOR = 2.5  # a step this many times the median step is an outlier
MIN_STEPS = 20  # fewer step times say nothing about outliers
MIN_EXCESS_S = 5e-3  # an outlier at least this much slower than the median
WARN_SHARE = 0.05  # outliers' extra time over the run's time: a warning from here
INFO_SHARE = 0.01  # and said from here (a loaded machine's odd slow step is not news)
# A step that held named periodic work (an evaluation, a checkpoint) stays an
# outlier only when what it took beyond the median step and that work's mean
# time (its gaps' mean) is at least this share of the work's time: one
# evaluation runs longer than another (ng-video-lecture's: 1.52-1.63 s).
WORK_SPREAD = 0.5
# Outliers in the recent window scaled to all steps only from this many: one
# or two make no rate (nanoGPT on a loaded machine: 2 odd steps of the last 64
# scaled 300/64 said ~223 ms, 1.9% of the run; the 47 ms measured was 0.4%,
# and two more runs had none).
MIN_TO_SCALE = 3


def slow_cut(median: float) -> float:
    """The step time (seconds) from which a step is an outlier, given the median step's."""
    return max(SLOW_FACTOR * median, median + MIN_EXCESS_S)


def outliers(d: DistributionReading) -> tuple[float, float, list[tuple[float, float]]]:
    """``(median, p99, [(end unix time, seconds)])`` of the outliers among the
    recent step times (nanoseconds in the distribution); the HTML report
    marks the same steps."""
    median = (d.percentile(50.0) or 0.0) / 1e9
    p99 = (d.percentile(99.0) or 0.0) / 1e9
    cut = slow_cut(median)
    return median, p99, [(t, v / 1e9) for t, v in d.recent if v / 1e9 >= cut]


class Slow(NamedTuple):
    """A slow step: its end (unix time), its time left to explain (seconds:
    the step's own, less the named periodic work it held), its start, and
    until when what the hook saw in it is a suspect (its end; the start of
    the named work in it: what ran from there on was that work's)."""

    end: float
    seconds: float
    start: float
    until: float


def _work_times(s: Snapshot, lead: SiteReading) -> list[float]:
    """When the named work at ``lead`` was seen: its line's first and last
    times and those of the lines that ran in its gaps."""
    times = [lead.first_seen_unix, lead.last_seen_unix]
    for x in s.sites:
        if x.within == lead.location:
            times += [x.first_seen_unix, x.last_seen_unix]
    return [t for t in times if t > 0]


def _spread_times(lead: SiteReading) -> list[float]:
    """Where the work ran more than twice, its other times spread evenly
    between its first and last: an epoch's evaluation in the window's middle,
    neither the first nor the last of three, was a 1.7 s "slow step" beside
    the evaluation's own finding. Guesses: they hold only a step that took
    the work's time."""
    first, last, n = lead.first_seen_unix, lead.last_seen_unix, lead.occurrences
    if n <= 2 or not 0 < first < last:
        return []
    return [first + (last - first) * j / (n - 1) for j in range(1, n - 1)]


def _compiled(s: Snapshot, recent: list[tuple[float, float]]) -> list[float]:
    """Each recent step's time (seconds) less its compiles' (the compile and
    recompile events that ended in it, each with its seconds): a step is
    slow only beyond its compiles, whose findings say them."""
    own = [v / 1e9 for _, v in recent]
    order = sorted(range(len(recent)), key=lambda i: recent[i][0])
    ends = [recent[i][0] for i in order]
    for e in s.events:
        if e.kind in COMPILE_KINDS and e.value:
            k = bisect.bisect_left(ends, e.time_unix)
            if k < len(ends) and ends[k] - recent[order[k]][1] / 1e9 <= e.time_unix:
                own[order[k]] = max(0.0, own[order[k]] - e.value)
    return own


def unexplained(s: Snapshot, d: DistributionReading, median: float
                ) -> tuple[list[Slow], int]:
    """The recent outliers, each less its compiles' seconds, with the
    evaluations and checkpoints that
    :func:`~tpu_info.views.periodic.periodic_work` names (and costs) taken
    out, and how many outliers held such work. A step holds it where one of
    the work's times falls in it, or, when the work ran every N steps, N
    steps (one either side) from such a step. Its time less the work's mean
    gap is what is left; it stays an outlier only when that is still one and
    at least :data:`WORK_SPREAD` of the work's time, and then only what ran
    in it before the work began is a suspect."""
    cut = slow_cut(median)
    recent = list(d.recent)
    own = _compiled(s, recent)
    held: dict[int, tuple[float, float]] = {}  # step index -> (work seconds, work start)
    for lead in leads(s).values():
        each = (lead.gap_seconds or 0.0) / max(1, lead.gaps)
        times = _work_times(s, lead)
        found = {i: min(t for t in times if end - v / 1e9 <= t <= end)
                 for i, (end, v) in enumerate(recent)
                 if any(end - v / 1e9 <= t <= end for t in times)}
        for t in _spread_times(lead):
            for i, (end, v) in enumerate(recent):
                if end - v / 1e9 <= t <= end and i not in found \
                        and own[i] - median >= WORK_SPREAD * each:
                    found[i] = end - v / 1e9  # its start: no suspect in it
        every = (round(lead.steps_spanned / (lead.occurrences - 1))
                 if lead.occurrences > 1 and lead.steps_spanned else 0)
        if every >= 2:  # the same work's other times in the window, every N steps
            for i in list(found):
                for k in range(-(len(recent) // every) - 1, len(recent) // every + 2):
                    for j in (i + k * every, i + k * every - 1, i + k * every + 1):
                        if not 0 <= j < len(recent):
                            continue
                        if j in found:  # that time of the work is had: not a neighbour too
                            break
                        if own[j] >= cut:
                            end, v = recent[j]
                            found[j] = end - v / 1e9  # its start: no suspect in it
                            break
        for i, start in found.items():
            work, first = held.get(i, (0.0, start))
            held[i] = (work + each, min(first, start))
    slow: list[Slow] = []
    taken = 0
    for i, (end, v) in enumerate(recent):
        seconds = own[i]
        if seconds < cut:
            continue
        if i not in held:
            slow.append(Slow(end, seconds, end - v / 1e9, end))
            continue
        taken += 1
        work, start = held[i]
        left = seconds - work
        if left >= cut and left - median >= WORK_SPREAD * work:
            slow.append(Slow(end, left, end - v / 1e9, start))
    return slow, taken


def _every(d: DistributionReading, slow_times: list[float]) -> int | None:
    """How many steps apart the outliers are among the recent steps, when
    they are evenly spaced (every 40 steps); else None. Three at least (two
    make no period), never next to each other (a stall over two steps)."""
    slow = set(slow_times)
    places = [i for i, (t, _) in enumerate(d.recent) if t in slow]
    if len(places) < 3:
        return None
    gaps = [b - a for a, b in zip(places, places[1:])]
    if min(gaps) < 2 or max(gaps) - min(gaps) > max(1, 0.2 * min(gaps)):
        return None
    return round(sum(gaps) / len(gaps))


def _inside(slow: list[Slow], t: float) -> bool:
    """Whether ``t`` falls in a slow step before the named work in it."""
    return any(x.start <= t <= x.until for x in slow)


def _in_slow_steps(s: Snapshot, slow: list[Slow]) -> list[str]:
    """What the hook saw with a time inside the slow steps: compiles whose
    seconds are not known (those known are taken out of the steps), and
    device->host transfers with their bytes."""
    def inside(t: float) -> bool:
        return _inside(slow, t)

    said: list[str] = []
    compiles: dict[str, int] = {}
    for e in s.events:
        if e.kind in COMPILE_KINDS and not e.value and inside(e.time_unix):
            compiles[e.name] = compiles.get(e.name, 0) + 1
    if compiles:
        said.append("compiles (" + ", ".join(f"{n} x{c}" if c > 1 else n
                                             for n, c in list(compiles.items())[:3]) + ")")
    d2h, nbytes = s.distribution(TRANSFER_FROM_DEVICE_TIME), s.distribution(INBOUND_DATA)
    if d2h is not None:
        hits = [(t, v) for t, v in d2h.recent if inside(t)]
        if hits:
            moved = ""
            if nbytes is not None:
                sizes = [v for t, v in nbytes.recent if inside(t)]
                moved = f", {size_words(max(sizes))} the largest" if sizes else ""
            said.append(f"device->host transfers ({len(hits)} of them, "
                        f"{duration(sum(v for _, v in hits) / 1e9)} in all{moved}: "
                        "jax.device_get, .item() or a checkpoint's copy)")
    return said


def _periodic_in(s: Snapshot, slow: list[Slow]) -> list[SiteReading]:
    """The loop's periodic sites last seen inside a slow step: only those
    were in them. A periodic read elsewhere in the loop (a log line every 10
    steps) is no suspect for slow steps it was not seen in (the steps of a
    run on a loaded machine were slow at random, and both reads were named
    "in them" with their counts over the whole run)."""
    def inside(t: float) -> bool:
        return _inside(slow, t)

    led = leads(s)  # an evaluation's or checkpoint's lines: its own finding, its time apart
    return [x for x in s.sites
            if site_phase(s, x) == Phase.PERIODIC and inside(x.last_seen_unix)
            and not part_of_periodic_work(s, x, led)]


def _excess(s: Snapshot, d: DistributionReading, median: float, slow: list[Slow],
            named: float, loaded: bool = False) -> tuple[float, str]:
    """The outliers' time above the median over all steps, and what it stands
    on. Measured when the recent window holds every step, or holds fewer
    than :data:`MIN_TO_SCALE` outliers, or the machine was loaded (slow steps
    at random: no rate) (the window's alone); else scaled from it, and never
    more than was measured: all steps' time above the median (``StepTime``'s
    total less the median times its count) less the named periodic work's
    (``named``), and the run."""
    recent = sum(x.seconds - median for x in slow)
    if d.count <= len(d.recent):
        return recent, f"measured over all {d.count:,} steps"
    if loaded:
        return recent, (f"measured in the last {len(d.recent):,} of {d.count:,} timed steps, "
                        "not scaled: on a loaded machine slow steps come at random")
    if len(slow) < MIN_TO_SCALE:
        return recent, (f"measured in the last {len(d.recent):,} of {d.count:,} timed "
                        f"steps ({len(slow)} slow: too few to scale to all)")
    scaled = recent * d.count / len(d.recent)
    bound = max(recent, d.total / 1e9 - median * d.count - named)
    if s.uptime_seconds > 0:
        bound = min(bound, s.uptime_seconds)
    less = (f" less the {duration(named)} of the evaluations and checkpoints named on their "
            "own" if named > 0 else "")
    words = (f"estimated from the last {len(d.recent):,} of {d.count:,} timed steps, scaled "
             "to all")
    if scaled > bound:
        return bound, (f"at most {duration(bound)}: what all {d.count:,} timed steps took "
                       f"above the median{less} (the last {len(d.recent):,} scaled to all "
                       f"would say {duration(scaled)})")
    return scaled, words


def slow_steps(s: Snapshot) -> Iterable[Finding]:
    """Steps much slower than the median step, with what ran in them."""
    d = s.distribution(STEP_TIME)
    if d is None or d.count < MIN_STEPS or not d.recent:
        return
    median, p99, _ = outliers(d)
    if median <= 0:
        return
    # Steps that held the evaluations and checkpoints periodic_work names and
    # costs: that work's time (and what ran in it) is not here, only what is left.
    slow, taken = unexplained(s, d, median)
    if not slow:
        return
    loaded = loaded_machine(s)
    excess, stands_on = _excess(s, d, median, slow, periodic_seconds(s), loaded is not None)
    if taken:
        held = "steps held" if taken > 1 else "step held"
        stands_on += (f"; {taken} slow {held} an evaluation or checkpoint named on its own: "
                      "only time beyond that work counts here")
    share = min(1.0, excess / s.uptime_seconds) if s.uptime_seconds > 0 else None
    if excess < MIN_EXCESS_S or (share is not None and share < INFO_SHARE):
        return
    seen = _in_slow_steps(s, slow)
    seen += [f"{x.detail or 'a read'} at {short_location(x.location)} ({x.count:,} times "
             "in the run)" for x in _periodic_in(s, slow)[:3]]
    what = ("in them the hook saw " + "; ".join(seen) + ". What these do not explain is "
            if seen else "the hook saw nothing with a time in them, so it is ")
    if loaded is not None:
        what = (f"the machine was busy: the training thread waited for a core "
                f"{loaded[0]:.0f}% of the loop's time (median of {loaded[1]} samples), which "
                f"slows steps at random, so these may be that; else {what}")
    share_text = f", {share_words(share)} of run time" if share is not None else ""
    every = _every(d, [x.end for x in slow])
    yield Finding(
        f"{len(slow)} of the last {len(d.recent)} steps were slow"
        f"{f', every {every} steps' if every else ''}"
        f" ({duration(sum(x.seconds for x in slow) / len(slow))} each against a median step of "
        f"{duration(median)}; P99 {duration(p99)}; ~{duration(excess)} above the median in "
        f"all{share_text}, {stands_on}): {what}host work between steps "
        "that no hook sees at a line (checkpoint writes, logging, data loading, Python). "
        "Time a suspect with metrics.track(fn); do the periodic work less often, on the "
        "device, or in a background thread (async checkpointing).",
        Severity.WARNING if share is not None and share >= WARN_SHARE and loaded is None
        else Severity.INFO,
        None, excess, "slow_steps", count=len(slow), phase=Phase.PERIODIC.value,
        share_of_run=share, cost_estimated=True, every_steps=every)
