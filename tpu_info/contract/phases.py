"""Which part of the program something happened in, from the step loop.

The step loop runs from the first step's start to the latest step's end
(:attr:`StepsReading.first_unix`, :attr:`StepsReading.last_unix`). Work that
ended before it is set-up; work that began after it (by more than a few
steps' time, or at all once the program has ended: ``loop_ended``) is
tear-down, and sooner than that once (the loop may go on); work inside it
is per-step when it ran in at least half the steps, periodic when it
recurred less often (evaluation, logging, checkpoints every N steps), and
once when it ran once. The hook
fills a site's phase with :func:`phase_of` when it is read; views use the same
function for what carries only times (compile events).

Example:
    >>> from tpu_info.contract.model import StepsReading
    >>> loop = StepsReading(100, "marked", seconds_total=10.0, first_unix=50.0, last_unix=60.0)
    >>> [phase_of(t0, t1, n, loop).value for t0, t1, n in
    ...  ((1.0, 2.0, 40), (50.5, 59.9, 100), (51.0, 59.0, 5), (55.0, 55.0, 1), (70.0, 71.0, 3))]
    ['setup', 'step', 'periodic', 'once', 'teardown']
"""

from __future__ import annotations

from tpu_info.contract.diagnosis import Phase, StepsReading

# Per-step work ran in at least this share of the steps.
PER_STEP_AT_LEAST = 0.5
# Recurring work in the loop ran at least this many times; fewer is once.
PERIODIC_AT_LEAST = 2
# Work that began this many steps' time (and at least TEARDOWN_MIN_S) after
# the latest step's end is tear-down, not the step in progress.
TEARDOWN_STEPS = 3
TEARDOWN_MIN_S = 1.0
# Events closer than this (and two steps) are one occurrence of the work.
BURST_MIN_S = 0.1
# Recurring work not seen again for this many of its periods before the
# loop's end stopped recurring (a first pass): once. Wide, since two
# occurrences give one period and a loaded machine stretches some steps.
STOPPED_PERIODS = 4


def loop_of(steps: StepsReading | None) -> tuple[float, float] | None:
    """The step loop's ``(start, end)`` in unix time, or None when not known."""
    if steps is None or not steps.count or steps.first_unix is None or steps.last_unix is None:
        return None
    return steps.first_unix, max(steps.first_unix, steps.last_unix)


def phase_of(first_unix: float, last_unix: float, count: int,
             steps: StepsReading | None) -> Phase:
    """The phase of work that ran ``count`` times between ``first_unix`` and
    ``last_unix`` (see the module docstring); :attr:`Phase.UNKNOWN` when the
    step loop is not known or the times are not."""
    loop = loop_of(steps)
    if loop is None or steps is None or not first_unix or count <= 0:
        return Phase.UNKNOWN
    start, end = loop
    last_unix = max(first_unix, last_unix or first_unix)
    if last_unix < start:
        return Phase.SETUP
    per_step = steps.seconds_per_step or 0.0
    if first_unix > end:
        if steps.loop_ended or first_unix > end + max(TEARDOWN_STEPS * per_step,
                                                      TEARDOWN_MIN_S):
            return Phase.TEARDOWN
        return Phase.ONCE  # after the latest step so far: not per step, not (yet) recurring
    if count >= PER_STEP_AT_LEAST * steps.count:
        return Phase.STEP
    return Phase.PERIODIC if count >= PERIODIC_AT_LEAST else Phase.ONCE


def every_steps(count: int, steps: StepsReading | None,
                span: tuple[float, float] | None = None) -> float | None:
    """How many steps apart periodic work ran: from the time between its
    first and last occurrence (``span``) over the loop's time per step when
    known (a read taken mid-epoch does not skew it), else ``steps / count``."""
    if steps is None or count <= 0 or not steps.count:
        return None
    loop = loop_of(steps)
    if span is not None and count > 1 and loop is not None and loop[1] > loop[0]:
        per_step = (loop[1] - loop[0]) / steps.count
        return max(1.0, (span[1] - span[0]) / (count - 1) / per_step)
    return steps.count / count


def bursts_phase(times: list[float], steps: StepsReading | None,
                 seconds: list[float] | None = None,
                 sites: list[str] | None = None) -> tuple[Phase, int]:
    """The phase of events ending at ``times`` (compiles, each taking
    ``seconds``) and how many times the work happened: an event that began
    less than two steps (and :data:`BURST_MIN_S`) after the previous one ended
    is the same occurrence, so the fifteen op compiles of one evaluation are
    one, not a per-step cost. Events in at least half the steps are per-step only when
    they span at least half the loop; occurrences in the loop are otherwise
    periodic from :data:`PERIODIC_AT_LEAST` on (and seen again within
    :data:`STOPPED_PERIODS` of their period before the loop's end), else once.

    ``sites`` (what each event compiled and from where, in ``times``' order)
    tell one pass from recurring work however soon the read and however the
    machine stretches the pass: a new occurrence begins only where some site
    of the current one compiles again (new shapes, the next pass), so an
    evaluation's train and test calls, or one pass slowed into pieces, are once."""
    if not times:
        return Phase.UNKNOWN, 0
    took = dict(zip(times, seconds)) if seconds is not None else {}
    order = sorted(range(len(times)), key=times.__getitem__)
    at = [times[i] for i in order]
    per_step = (steps.seconds_per_step or 0.0) if steps else 0.0
    # One occurrence while the next begins within two steps and BURST_MIN_S of the
    # last (both: two epochs of fast steps are two, however close in time).
    gap = min(BURST_MIN_S, 2 * per_step) if per_step else BURST_MIN_S
    starts = [0] + [k + 1 for k, (a, b) in enumerate(zip(at, at[1:]))
                    if b - took.get(b, 0.0) - a > gap]
    if sites is not None:
        starts = _passes(starts, [sites[i] for i in order])
    bursts = len(starts)
    phase = phase_of(at[0], at[-1], len(at), steps)
    loop = loop_of(steps)
    if phase == Phase.STEP and loop is not None and (
            at[-1] - at[0] < PER_STEP_AT_LEAST * (loop[1] - loop[0])):
        phase = Phase.ONCE  # many events in a short stretch of the loop: told by bursts
    after_loop = loop is not None and at[0] - took.get(at[0], 0.0) > loop[1]
    if phase in (Phase.PERIODIC, Phase.ONCE) and not after_loop:
        phase = Phase.PERIODIC if bursts >= PERIODIC_AT_LEAST else Phase.ONCE
    held = steps.compile_seconds if steps is not None and steps.compile_steps == 1 else 0.0
    if (phase == Phase.PERIODIC and loop is not None and held
            and at[0] - took.get(at[0], 0.0) - loop[0] <= held and at[-1] - at[0] <= held):
        # All within the one step of the loop that held compiles, its first
        # (an eager Adam's ops compiling per parameter shape in step one): once.
        phase = Phase.ONCE
    if phase == Phase.PERIODIC and loop is not None:
        # Work that recurs is seen again within its period: compiles that
        # stopped long before the loop's end were a first pass (an
        # evaluation's two data sets), once, not every N steps.
        period = (at[-1] - at[0]) / (bursts - 1)
        if loop[1] - at[-1] > STOPPED_PERIODS * period + gap:
            phase = Phase.ONCE
    return phase, bursts


def _passes(starts: list[int], sites: list[str]) -> list[int]:
    """The burst ``starts`` (indexes into time-sorted ``sites``) where a new
    pass begins: a burst that compiles a site the current pass already did."""
    kept = [0]
    current: set[str] = set()
    for a, b in zip(starts, starts[1:] + [len(sites)]):
        burst = sites[a:b]
        if a and current.intersection(burst):
            kept.append(a)
            current = set()
        current.update(burst)
    return kept
