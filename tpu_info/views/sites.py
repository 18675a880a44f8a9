"""Findings from the lines that synced, moved data or ran eager ops every step
(``Snapshot.sites``).

A device->host sync (``float(loss)``, ``print(x)``, ``if x > 0:``) at a line
that runs about once per step stops the host until the device finishes, and
the device then idles while Python catches up; a numpy batch passed straight
into a jitted function copies it to the device on the step's critical path;
eager (un-jitted) ops each dispatch on their own from Python.
Each finding names the line, how often it ran per step, and its cost per step
and as a share of step time: timed by the hook (measured), or, where only bytes
are known, estimated from a transfer rate (and labelled so).

Example:
    >>> from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
    >>> s = Snapshot(0.0, steps=StepsReading(1200, "inferred", "jit(step)", 164.0),
    ...              sites=(SiteReading("sync", "/src/train.py:88", 1200, 4800, 4.92,
    ...                                 detail="float()"),))
    >>> [f.kind for f in site_findings(s)]
    ['per_step_sync']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tpu_info.contract.catalog import (
    INBOUND_DATA,
    OUTBOUND_DATA,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
)
from tpu_info.contract.model import Finding, Phase, Severity, SiteKind, SiteReading, Snapshot
from tpu_info.views.breakdown import copy_bound
from tpu_info.views.cost import (
    OUTSIDE_STEP,
    Cost,
    cost_of,
    duration,
    engine_of,
    leads,
    outside_warns,
    share_words,
    short_location,
    site_phase,
    size_words,
    step_leads,
    steps_of,
)
from tpu_info.views.eager import eager_site_advice, not_jitted_step
from tpu_info.views.periodic import part_of_periodic_work
from tpu_info.views.read_words import cheap_sync_words, sync_advice
from tpu_info.views.sampled_reads import read_cost, sampled_read
from tpu_info.views.slack import busy_cpu_words

# A site is a finding when it ran in at least half the steps (or, steps
# unknown, this many times) and cost at least this much, in all and as a share.
PER_STEP_AT_LEAST = 0.5
COUNT_WITHOUT_STEPS = 100
RUN_SHARE_WITHOUT_STEPS = 0.01  # ... and, steps unknown, this share of the run
MIN_SECONDS = 1e-3
MIN_SHARE = 0.005
# A read, copy or eager op every step is a warning from this share of the
# step (information below: pytorch/examples' actor_critic reads each sampled
# action for the environment, 0.77 % of its step, and was warned to log
# every N steps; jax's advi example copies a 4 B key a step, 0.5-1 %, and was
# warned to device_put its data set).
SYNC_WARN_SHARE = 0.02

# A host->device copy of at least this much in (nearly) every step, over at
# least this many steps, is named whatever its share: it sits on the step's
# critical path, and a shorter step (a faster device, a smaller model) makes
# the same copy weigh more. Below MIN_SHARE it is said as info, not a warning.
MIN_BYTES_PER_STEP = 64e3
MIN_STEPS = 10
# A device->host read in every step (this share of the steps or more), over at
# least MIN_STEPS steps, is named whatever it cost here: on a GPU or TPU each
# one drains the pipeline (the host cannot queue step n+1 while step n runs),
# which a CPU run, where it costs microseconds, cannot show. Info when cheap.
EVERY_STEP = 0.9

# Work outside the step (set-up, periodic, once, tear-down) is said when it
# took at least this share of the run (and MIN_SECONDS); a warning only when
# it weighs on the run (:func:`tpu_info.views.cost.outside_warns`).
OUTSIDE_INFO_SHARE = {Phase.PERIODIC: 0.01, Phase.SETUP: 0.05, Phase.ONCE: 0.05,
                      Phase.TEARDOWN: 0.05}

# What a read's cost stands for (sites._sync_cost).
WAIT_NOTE = "at most this: the wait includes the device's own work, which runs either way"
HOST_NOTE = ("at most the host's other time in the steps, all that overlap could hide "
             "(the wait is longer: the device's own work)")

# A transfer's cost stands on timed transfers, never on an assumed rate: a
# line's own when at least this many of its records were timed (the jit
# wrapper times a sample of its numpy arguments), else this program's own
# timed transfers that way (per direction) when there are this many, moving
# at least MIN_TIMED_BYTES in all (fewer or smaller ones measure latency, not
# bandwidth); else no figure is given, and the finding says why.
MIN_TIMED_TRANSFERS = 20  # as many as a percentile needs (views.values.MIN_TIMED_SAMPLES)
MIN_TIMED_BYTES = 8e6


def _rate_words(bytes_per_s: float) -> str:
    """``9.8e9`` -> ``9.8 GB/s``; ``1e10`` -> ``10 GB/s``; ``4.7e8`` -> ``0.47 GB/s``."""
    g = bytes_per_s / 1e9
    return f"{g:.2g} GB/s" if g < 10 else f"{g:.0f} GB/s"


def _untimed_bytes(s: Snapshot, kind: str) -> int:
    """Bytes of ``kind`` copies counted without a time (the ``jax.jit``
    wrapper's numpy arguments it did not time): in ``OutboundData``, not in
    its time."""
    return sum(x.bytes - x.timed_bytes if x.timed else x.bytes for x in s.sites
               if x.kind == kind and (x.timed or x.seconds <= 0))


def transfer_rate(s: Snapshot, to_device: bool = True) -> tuple[float, str] | None:
    """Bytes per second of this program's timed transfers in one direction
    (``TransferToDeviceTime`` over the bytes they moved: ``OutboundData`` less
    the untimed copies; ``TransferFromDeviceTime`` and ``InboundData`` the
    other way) and what it stands on, in words; None with too few."""
    names = ((TRANSFER_TO_DEVICE_TIME, OUTBOUND_DATA, SiteKind.IMPLICIT_TO_DEVICE.value,
              "to the device") if to_device else
             (TRANSFER_FROM_DEVICE_TIME, INBOUND_DATA, SiteKind.SYNC.value, "from the device"))
    t, b = s.distribution(names[0]), s.distribution(names[1])
    if t is None or b is None or t.count < MIN_TIMED_TRANSFERS or t.total <= 0:
        return None
    timed_bytes = b.total - _untimed_bytes(s, names[2])
    if timed_bytes < MIN_TIMED_BYTES:
        return None
    rate = timed_bytes / (t.total / 1e9)
    return rate, (f"estimated at {_rate_words(rate)} {names[3]}, measured on this program's "
                  f"{t.count:,} timed transfers")


def _sampled_note(site: SiteReading, seconds: float) -> str:
    """``timed 40 of 2,186 transfers: 1.2 GB/s to the device``."""
    rate = (f": {_rate_words(site.timed_bytes / site.seconds)} to the device"
            if site.timed_bytes and site.seconds > 0 else "")
    return f"timed {site.timed:,} of {site.count:,} transfers{rate}"


def steps_apart(site: SiteReading) -> float | None:
    """How many steps apart the line's occurrences were, from the step index
    the hook kept (None: not told, or fewer than two occurrences)."""
    if site.steps_spanned <= 0 or site.occurrences < 2:
        return None
    return site.steps_spanned / (site.occurrences - 1)


# How a site's figures were had where the hook recorded a random sample of
# its records (SiteReading.estimated: torch's reads past the first 1,000).
SAMPLED_HOW = ("estimated from a random sample of the line's records, each weighted by the "
               "sampling rate (its count and time are estimates)")


def site_cost(s: Snapshot, site: SiteReading) -> Cost:
    """What ``site`` cost, in its phase: per step, or per time it ran (a copy
    to the device at most the device's idle time: :func:`copy_bound`). A
    sampled site's cost says it is an estimate, never ``measured``."""
    cost = _site_cost(s, site)
    if site.estimated and not cost.estimated:
        cost = replace(cost, estimated=True, how=SAMPLED_HOW)
    return copy_bound(s, cost) if site.kind == SiteKind.IMPLICIT_TO_DEVICE.value else cost


def _site_cost(s: Snapshot, site: SiteReading) -> Cost:
    phase = site_phase(s, site)
    span = (site.first_seen_unix, site.last_seen_unix) if site.first_seen_unix else None
    apart = steps_apart(site)
    if phase in OUTSIDE_STEP and site.occurrences:  # costed per time it ran, not per read
        site = replace(site, count=min(site.occurrences, site.count))
    if site.seconds > 0 and site.kind == SiteKind.SYNC.value and site.drain_seconds is not None:
        return _drain_cost(s, site, phase, span, apart)
    if site.seconds > 0 and sampled_read(site):  # np.asarray(x), in sampled intervals
        return read_cost(s, site, phase, span, apart)
    if site.seconds > 0 and site.kind == SiteKind.SYNC.value and phase not in OUTSIDE_STEP:
        return _sync_cost(s, site, phase, span, apart)
    sampled = 0 < site.timed < site.count
    if site.seconds > 0 and not sampled:  # every record timed
        return cost_of(s, site.seconds, site.count, phase=phase, span=span, apart=apart)
    if sampled and site.timed >= MIN_TIMED_TRANSFERS and site.seconds > 0:
        # The line's own timed copies, scaled to all it made (by bytes).
        scale = (site.bytes / site.timed_bytes if site.timed_bytes
                 else site.count / site.timed)
        seconds = site.seconds * scale
        return cost_of(s, seconds, site.count, phase=phase, span=span,
                       note=_sampled_note(site, seconds), apart=apart)
    found = transfer_rate(s, site.kind != SiteKind.SYNC.value)
    if found is None:
        timed = f"{site.timed:,} of its {site.count:,} transfers" if site.timed else "none"
        how = (f"not timed: {timed} and fewer than {MIN_TIMED_TRANSFERS} of this program's "
               "transfers this way were timed, so no figure is given")
        return cost_of(s, 0.0, site.count, how, phase, span, apart=apart)
    rate, how = found
    return cost_of(s, site.bytes / rate, site.count, how, phase, span, apart=apart)


def drain_note(site: SiteReading) -> str:
    """What a read's drained cost stands on, in words (its waits, and the
    device work they held, which is charged to the graphs that ran)."""
    queued = max(0.0, site.seconds - (site.drain_seconds or 0.0))
    return (f"the drain it caused: per read, its wait plus the host's time since the previous "
            f"read, less the longer of that and the device's time for the work between (its "
            f"samples' upper quartile); its {duration(site.seconds)} of waiting held "
            f"{duration(queued)} of the device's queued work, which runs either way")


def _drain_cost(s: Snapshot, site: SiteReading, phase: Phase,
                span: tuple[float, float] | None, apart: float | None) -> Cost:
    """A read the hook measured the drain of (:mod:`metrics.engines.jax.drains`):
    it costs that drain, never its wait, and never more than the host's own
    time in the steps (what overlap could hide)."""
    lost = min(site.drain_seconds or 0.0, site.seconds)
    steps = steps_of(s)
    if phase not in OUTSIDE_STEP and steps is not None and steps.seconds_total:
        lost = min(lost, max(0.0, steps.seconds_total - (site.seconds - lost)))
    return cost_of(s, lost, site.count, phase=phase, span=span, note=drain_note(site),
                   apart=apart)


def _sync_cost(s: Snapshot, site: SiteReading, phase: Phase,
               span: tuple[float, float] | None, apart: float | None) -> Cost:
    """A read in the step loop: the hook times its wait, and the wait holds the
    device's queued work, which runs whether or not the host waits. What the
    read costs is the overlap it prevents: at most the wait, and at most the
    host's other time in the steps (all the device could have run beside)."""
    steps = steps_of(s)
    lost, note = site.seconds, WAIT_NOTE if steps is not None else ""
    if steps is not None and steps.seconds_total:
        other = max(0.0, steps.seconds_total - site.seconds)
        if other < lost:
            lost, note = other, HOST_NOTE
    return cost_of(s, lost, site.count, phase=phase, span=span, note=note, apart=apart)


def _outside_severity(c: Cost) -> Severity | None:
    """Work outside the step: info, a warning when it took a large share of
    the run, or None when it is not worth saying."""
    share = c.share_of_run or 0.0
    if c.seconds < MIN_SECONDS or share < OUTSIDE_INFO_SHARE.get(c.phase, 1.0):
        return None
    return Severity.WARNING if outside_warns(c) else Severity.INFO


def _warns(c: Cost) -> bool:
    """Whether work every step is worth a warning (:data:`SYNC_WARN_SHARE`)."""
    return _costly(c) and (c.share_of_step is None or c.share_of_step >= SYNC_WARN_SHARE)


def _costly(c: Cost) -> bool:
    return c.seconds >= MIN_SECONDS and (c.share_of_step is None
                                         or c.share_of_step >= MIN_SHARE)


def _worth_saying(c: Cost, site: SiteReading, run: float) -> bool:
    if c.steps is None:  # (a share of the run too: pytorch/examples' hogwild parent read
        # 157 values in its one test, 1.2 ms of a 42 s run, and was told "Log every N steps")
        return (c.seconds >= MIN_SECONDS and (c.count or 0) >= COUNT_WITHOUT_STEPS
                and (run <= 0 or c.seconds >= RUN_SHARE_WITHOUT_STEPS * run))
    if (c.per_step or 0.0) < PER_STEP_AT_LEAST:
        return False
    if _costly(c):
        return True
    if c.steps.count < MIN_STEPS:
        return False
    if site.kind == SiteKind.SYNC.value:
        return (c.per_step or 0.0) >= EVERY_STEP
    return (site.kind == SiteKind.IMPLICIT_TO_DEVICE.value
            and site.bytes / c.steps.count >= MIN_BYTES_PER_STEP)


def _how_often(c: Cost) -> str:
    p = c.per_step
    if p is None:
        return f"{c.count:,} times"
    if p >= 1.5:
        return f"{p:.0f} times every step"
    return "every step" if p >= 0.9 else "in most steps"


# The hook names a numpy argument's dtype where the host sends float64 that
# JAX (x64 off) turns into float32 on every call (jit_numpy.FLOAT64_WORD).
FLOAT64_ADVICE = ("The host sends float64 that JAX converts to float32 on every call: make "
                  "the data float32 once where it is made (np.float32, .astype once), which "
                  "also halves what is copied. ")


def _transfer_advice(detail: str) -> str:
    d = detail.lower()
    if "float64" in d:
        return FLOAT64_ADVICE + _transfer_advice(d.replace("float64 ", ""))
    if "shard" in d:
        return ("device_put the batch with its sharding in the data loader "
                "(jax.device_put(batch, sharding)), ahead of the step.")
    if "asarray" in d or "array" in d.split("(")[0]:
        return ("Convert the data once outside the loop (jax.device_put the whole data set if "
                "it fits) and index it on the device. " + PUT_AHEAD_NOTE)
    if "jit" in d:
        return ("Keep the data on the device: jax.device_put the whole data set once if it "
                "fits, and index each batch there. " + PUT_AHEAD_NOTE)
    return "device_put the data once and keep it on the device. " + PUT_AHEAD_NOTE


# Measured on a TPU v5e (bench/tpu_costs.py --fix prefetch / thread, optax and
# flax steps on two 0.5 MB numpy batches, host-bound): the data set put once
# saved 166-283 us a step; a put per batch ahead of the step made the loop
# slower by 258-516 us a step, on the training thread or a loader thread.
PUT_AHEAD_NOTE = ("A device_put of each batch one step ahead only moves the copy (slower on a "
                  "TPU v5e).")


_OUTSIDE_WORDS = {
    Phase.SETUP: "at start-up, before the first step: one-off work, not a per-step cost",
    Phase.ONCE: "in the step loop, but not in every step: one-off work, not a per-step cost",
    Phase.TEARDOWN: "after the last step: one-off work, not a per-step cost",
    Phase.PERIODIC: ("in the loop's gaps, not in every step (evaluation, logging or "
                     "checkpoints every N steps): each time it runs, that step is slower"),
}
_OUTSIDE_ADVICE = {
    SiteKind.SYNC.value: ("If it is logging, read a value accumulated on the device, "
                          "and only as often as you need it."),
    SiteKind.IMPLICIT_TO_DEVICE.value: ("Convert the data once (jax.device_put) and keep "
                                        "it on the device."),
    SiteKind.EAGER_OP.value: ("If it matters, jit the function that holds them, so they run "
                              "as one graph."),
}
# The finding kind's noun per site kind, for work outside the step.
_OUTSIDE_NOUN = {SiteKind.SYNC.value: "sync", SiteKind.IMPLICIT_TO_DEVICE.value:
                 "implicit_transfer", SiteKind.EAGER_OP.value: "eager_ops"}
# The kinds of sites the rules here judge.
_JUDGED = frozenset(_OUTSIDE_NOUN)


def _outside_finding(site: SiteReading, c: Cost) -> Finding | None:
    """A line that ran outside the step: said with when and what it cost each
    time, never per step; only when it took a share of the run worth it."""
    severity = _outside_severity(c)
    if severity is None:
        return None
    via = f" (via {site.via})" if site.via else ""
    where = f"at {short_location(site.location)}{via}"
    if site.kind == SiteKind.EAGER_OP.value:
        head = f"eager jnp ops {where} ({site.detail}) run outside jit"
    elif site.kind == SiteKind.SYNC.value:
        head = f"{site.detail or 'a read'} {where} reads a value back to the host"
    else:
        head = (f"{site.detail or 'a read'} {where} copies "
                f"{size_words(site.bytes / max(1, site.count))} to the device")
    advice = ((site.kind == SiteKind.EAGER_OP.value and eager_site_advice(site, "each time"))
              or _OUTSIDE_ADVICE.get(site.kind, ""))
    return Finding(
        f"{head} {_OUTSIDE_WORDS[c.phase]} ({c.words()}). {advice}".rstrip(),
        severity, site.location, kind=f"{c.phase.value}_{_OUTSIDE_NOUN[site.kind]}",
        **c.fields())


def _finding(s: Snapshot, site: SiteReading) -> Finding | None:
    c = site_cost(s, site)
    if c.outside_step:
        return _outside_finding(site, c)
    if not _worth_saying(c, site, s.uptime_seconds):
        return None
    via = f" (via {site.via})" if site.via else ""
    if site.kind == SiteKind.EAGER_OP.value:
        st = steps_of(s)
        advice = (eager_site_advice(site)
                  or (not_jitted_step(st.step_line) if st is not None and st.step_line else
                      "Move them into the jitted step (or jit the helper that holds them)."))
        return Finding(
            f"eager jnp ops at {short_location(site.location)}{via} ({site.detail}) run outside "
            f"jit {_how_often(c)} ({c.words()}): each dispatches on its own from Python. "
            + advice,
            Severity.WARNING if _warns(c) else Severity.INFO, site.location,
            kind="per_step_eager_ops", **c.fields())
    where = f"{site.detail or 'a read'} at {short_location(site.location)}{via}"
    if site.kind == SiteKind.SYNC.value:
        costly = _warns(c)
        weight = "" if costly else f" {cheap_sync_words(s)}"
        bound = busy_cpu_words(s, "the read") if site.drain_seconds is not None else ""
        if bound:  # the drain model's overlap had no free core to run on (said after
            costly, weight, bound = False, "", f" {bound}"  # the advice: a cut keeps it)
        return Finding(
            f"{where} reads a value back to the host {_how_often(c)} ({c.words()}): the host "
            f"waits for the device to finish, then the device waits for the host.{weight} "
            f"{sync_advice(site.detail, engine_of(s))}{bound}",
            Severity.WARNING if costly else Severity.INFO, site.location,
            kind="per_step_sync", **c.fields())
    each = size_words(site.bytes / site.count) if site.count else size_words(0)
    what = site.detail or "host data"
    costly = _costly(c)
    path = "the copy sits on the step's critical path."
    if not costly and c.seconds < _site_cost(s, site).seconds:  # cut: beside the device's work
        path = ("the copy ran while the device worked through queued steps, so this loop "
                 "hardly pays for it; it weighs where the host sets the pace (a faster "
                 "device, shorter steps).")
    elif not costly:
        path += (" It is cheap at this step time, but it grows with the batch and weighs "
                  "more where steps are shorter (an accelerator).")
    per_step = None if c.steps is None else site.bytes / c.steps.count
    if per_step is not None and c.per_step is not None and c.per_step >= 1.5:
        # several arrays a step (an image batch and its labels): their sum, not a
        # mean of different sizes
        each, often = f"{size_words(per_step)} in {c.per_step:.0f} arrays", "every step"
    else:
        often = _how_often(c)
    return Finding(
        f"{what} at {short_location(site.location)}{via} copies {each} to the device "
        f"{often} "
        f"({c.words()}): {path} "
        f"{_transfer_advice(site.detail)}",
        Severity.WARNING if costly and _warns(c) else Severity.INFO, site.location,
        kind="per_step_implicit_transfer", bytes_per_step=per_step, **c.fields())


def not_raised(s: Snapshot) -> list[str]:
    """Why each line the hook counted (``s.sites``, in order) is not a
    finding, in words (``""``: it is one, or its kind has no rule here): said
    next to it in ``--json`` sites, so a count without a finding is never a
    silent judgement."""
    broken = _broken_lines(s)  # once per snapshot, not once per site
    return [_not_raised(s, site, broken) for site in s.sites]


def _not_raised(s: Snapshot, site: SiteReading, broken: set[str]) -> str:
    if site.kind not in _JUDGED:
        return ""
    if site.kind == SiteKind.SYNC.value and site.location in broken:
        return "the graph break at this line is the finding (it names this read)"
    if _finding(s, site) is not None:
        return ""
    c = site_cost(s, site)
    if c.outside_step:
        floor = OUTSIDE_INFO_SHARE.get(c.phase, 1.0)
        return (f"{c.phase.value} work: {duration(c.seconds)}, "
                f"{share_words(c.share_of_run or 0.0)} of run time (said from "
                f"{share_words(floor)} and {duration(MIN_SECONDS)})")
    if c.steps is None:
        return (f"steps are not known: {c.count:,} times, {duration(c.seconds)} (said from "
                f"{COUNT_WITHOUT_STEPS} times and {duration(MIN_SECONDS)})")
    if (c.per_step or 0.0) < PER_STEP_AT_LEAST:
        return f"in {share_words(c.per_step or 0.0)} of the steps (said from half)"
    if site.kind == SiteKind.SYNC.value and c.steps.count < MIN_STEPS:
        return (f"{c.steps.count} steps so far: a read in every step is said from "
                f"{MIN_STEPS} steps")
    copy = (f", or a copy of {size_words(MIN_BYTES_PER_STEP)} a step"
            if site.kind == SiteKind.IMPLICIT_TO_DEVICE.value else
            f", or a read in {share_words(EVERY_STEP)} of the steps"
            if site.kind == SiteKind.SYNC.value else "")
    return (f"{duration(c.seconds_per_step or 0.0)}/step, "
            f"{share_words(c.share_of_step or 0.0)} of step time (said from "
            f"{duration(MIN_SECONDS)} in all and {share_words(MIN_SHARE)}{copy})")


def _broken_lines(s: Snapshot) -> set[str]:
    """Lines torch.compile broke its graph at: a read there (``if
    x.item() > 0:`` in a compiled function) is that break's finding, which
    names the read, its frequency and its cost."""
    return {x.location for x in s.sites if x.kind == SiteKind.GRAPH_BREAK.value}


def site_findings(s: Snapshot) -> Iterable[Finding]:
    """One finding per costly sync, implicit-transfer or eager-op line; cheap
    lines are not news."""
    broken = _broken_lines(s)
    # An evaluation's or checkpoint's lines are its finding's (periodic.py),
    # also when it runs after every step.
    led = {**leads(s), **step_leads(s)}
    # Lines that ran in that work's gaps: their other kinds of records too
    # (matplotlib's conversions beside its reads in a plotting callback).
    inside = {x.location for x in s.sites if x.within and x.within in led}
    for site in s.sites:
        if (site.kind == SiteKind.SYNC.value and site.location in broken
                or part_of_periodic_work(s, site, led) or site.location in inside):
            continue
        if site.kind in _JUDGED:
            f = _finding(s, site)
            if f is not None:
                yield f
