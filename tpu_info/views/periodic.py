"""Periodic work in the step loop's gaps, named as what it is: an evaluation
or a checkpoint every N steps, with its line, how often, its measured time
and its share of the run.

The hook (``metrics/engines/jax/gaps.py``; for torch,
``metrics/engines/torch/gaps.py``: the intervals between optimizer steps
beyond the usual step) bounds each gap by the steps around it and tells
which line led it
(:attr:`SiteReading.work`, ``gaps``, ``gap_seconds``) and which lines sat in
it (``within``): an evaluation's reads and numpy batches are its, not
findings of their own. Logging (a gap a read led) is said from its gaps'
own time where that is a share of the run (host work: plotting, printing),
else it stays the read's finding (``periodic_sync``), costed by its drain.

Example:
    >>> from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
    >>> ev = SiteReading("call", "/w/train.py:90", 10, detail="jit(apply_model)",
    ...                  phase="periodic", occurrences=10, steps_spanned=270,
    ...                  work="evaluation", gaps=9, gap_seconds=0.9)
    >>> steps = StepsReading(300, "inferred", "jit(train_step)", 1.0, 100.0, 101.0)
    >>> [f.kind for f in periodic_work(Snapshot(101.0, uptime_seconds=2.0, sites=(ev,),
    ...                                         steps=steps))]
    ['periodic_evaluation']
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_info.contract.model import (
    STEPS_MARKED,
    Finding,
    Phase,
    Severity,
    SiteKind,
    SiteReading,
    Snapshot,
    StepsReading,
)
from tpu_info.views.cost import (
    cost_of,
    duration,
    eager_leads,
    engine_of,
    leads,
    share_words,
    short_location,
    size_words,
    step_leads,
    steps_of,
)
from tpu_info.views.slack import step_device_seconds

# Said from this share of the run; a warning from WARN_SHARE (as other periodic work).
INFO_SHARE = 0.01
WARN_SHARE = 0.05
# Work in a gap after (nearly) every step is said from this share of the
# steady steps' time, a warning from STEP_WARN_SHARE: below, a second jitted
# call in the step (an EMA update) and the host's own work until the next
# step, not work that would run less often.
STEP_INFO_SHARE = 0.05
STEP_WARN_SHARE = 0.2
# Logging, printing or plotting led by a read whose gaps hold host work of
# their own (d2l's ProgressBoard: a matplotlib draw every 23 steps, 19 % of
# its epochs, said as the read's 2 ms drain): the gaps' time, not the read's.
_LOGGING = ("Log, print or plot less often (every N steps), and hand a plotting library host "
            "values (np.asarray once, or floats you accumulate), not device arrays it reads "
            "one by one.")
_STEP_ADVICE = {
    # No line of its own seen: what it is, when the eager ops beside it say so.
    "device_work": ("If it is an evaluation in eager code, jit it (its ops then run as one "
                    "compiled call, not one dispatch each), and evaluate less often or on "
                    "fewer batches."),
    "evaluation": ("Run it every N steps (every 10 or 100: its cost falls N-fold) or only at "
                   "the end; if it must see every step, compute what it needs inside the "
                   "jitted step and read that back every N steps."),
    "checkpoint": ("Save every N steps rather than every step, or asynchronously (orbax's "
                   "AsyncCheckpointer copies and writes in a background thread while the "
                   "steps go on)."),
}
# torch's (pytorch/examples' gcn: two evaluations after every step, 42 % of its loop).
_TORCH_STEP_ADVICE = {
    "evaluation": ("Evaluate every N steps (every 10 or 100: its cost falls N-fold) or only "
                   "at the end, under torch.no_grad() (or torch.inference_mode()); if it must "
                   "see every step, take what it needs from the training step's own forward "
                   "output (detached) and read that back every N steps."),
    "checkpoint": ("Save every N steps rather than every step, or asynchronously "
                   "(torch.distributed.checkpoint.async_save writes in a background thread "
                   "while the steps go on)."),
}

_ADVICE = {
    "logging": _LOGGING,
    # No line of its own seen: what it is, when the eager ops beside it say so.
    "device_work": ("If it is an evaluation in eager code, jit it (its ops then run as one "
                    "compiled call, not one dispatch each), and evaluate less often or on "
                    "fewer batches."),
    "evaluation": ("Evaluate less often or on fewer batches; or run the evaluation loop on "
                   "the device (its batches put there once, the loop in lax.scan or "
                   "fori_loop) so the host dispatches it once."),
    "checkpoint": ("Save less often, or asynchronously (orbax's AsyncCheckpointer copies "
                   "and writes in a background thread while the steps go on)."),
}
_TORCH_ADVICE = {
    "logging": _LOGGING,
    # No line of its own seen: what it is, when the eager ops beside it say so.
    "device_work": ("If it is an evaluation in eager code, jit it (its ops then run as one "
                    "compiled call, not one dispatch each), and evaluate less often or on "
                    "fewer batches."),
    "evaluation": ("Evaluate less often or on fewer batches (fewer eval iterations), under "
                   "torch.inference_mode(), and with the model compiled for it once: an "
                   "evaluation at another batch size or grad mode recompiles."),
    # An eager program (nothing compiled) is told nothing about recompiles.
    "evaluation_eager": ("Evaluate less often or on fewer batches (fewer eval iterations), "
                         "under torch.inference_mode()."),
    "checkpoint": ("Save less often, or asynchronously "
                   "(torch.distributed.checkpoint.async_save writes in a background thread "
                   "while the steps go on)."),
}
# torch's hook measures the intervals between steps (an optimizer's, else
# backward()'s), beyond the usual step (metrics/engines/torch/gaps.py); JAX's,
# the gap from its first record, less the device's work on the steps queued
# before it (their count x the step's measured device time) or the usual step.
_MEASURED = {
    True: "from its first call after a step to the end that closed it (a model.train(), a "
          "no_grad block's exit, a torch.save's return), else the "
          "time between its steps beyond the usual step (their median), compiles left out",
    False: "the wall time from its first call or copy to the step's next call",
}


def _jax_measured(s: Snapshot, unseen: bool = False) -> str:
    """What a JAX gap's time stands on (metrics/engines/jax/gaps.py): less
    the usual step or the device's work left on the training steps queued
    before it, up to its first read's return (all that wait where it had
    sent no work of its own before and waited no longer than those steps'
    work could take; else their count x the step's measured device time,
    the median of its samples). Without that device time, an upper
    bound where a gap called a jitted function before its first read.
    ``unseen``: a gap of device work sent by no call the hook saw, timed from
    its read (the host's time in that work before the read is not in it: at
    least this)."""
    dev = step_device_seconds(s)
    head = (f"{_MEASURED[False]}, less the usual step or the device's work left on the "
            "training steps queued before it, up to its first read's return (all that wait "
            "where it had run nothing of its own before and waited no longer than those "
            "steps could take; else")
    if dev is None:
        return (f"{head} an upper bound: the step's device time was not measured, and a wait "
                "for those steps, which run either way, is in it)")
    tail = (f"{head} their count x {duration(dev[0])} a step, median of {dev[1]} timed "
            "executions)")
    if unseen:
        tail += ("; at least this: it starts at the read, and the host's time in that work "
                 "before the read (its eager dispatch) is not in it")
    return tail


def part_of_periodic_work(s: Snapshot, site: SiteReading,
                          led: dict[str, SiteReading] | None = None) -> bool:
    """Whether ``site`` sat in the gaps of an evaluation or checkpoint that
    :func:`periodic_work` names, or ran at its line (its cost is that
    finding's)."""
    led = leads(s) if led is None else led
    # Its gaps' lines, and other work at the lead's own line (the eager
    # slicing of an evaluation's batches in its call).
    return site.within in led if site.within else site.location in led


def _unseen_words(s: Snapshot, site: SiteReading) -> str:
    """What a ``device_work`` gap held, in words: the device work its read
    waited for beyond the training steps' queue, sent since the step's last
    call by no jitted call the hook saw; an un-jitted evaluation where eager
    ops were seen in the loop's gaps as often (their lines named)."""
    eager = sorted({f"{short_location(x.location)} in {x.function}()" for x in s.sites
                    if x.kind == SiteKind.EAGER_OP.value and x.phase == Phase.PERIODIC.value
                    and 2 * x.occurrences >= site.occurrences})
    head = (f"{site.detail} there waited for device work sent since the step's last call, "
            "beyond the training steps' queued work, by no jitted call the hook saw")
    if not eager:
        return f"{head}: eager ops JAX runs in C++ after their first call?"
    return (f"{head}: an un-jitted evaluation? eager ops at {', '.join(eager[:3])} ran in "
            "the loop's gaps as often")


def _what(site: SiteReading, between: bool) -> str:
    """What ran at the lead's line: ``jit(apply_model), called from``,
    ``jax.device_get of 4.2 MB each time``, ``GPT.eval()``, ``torch.save``
    (the hook notes a gap's call at the loop's line that led to it)."""
    if between and site.kind != SiteKind.CALL.value:
        return site.detail  # GPT.eval(), torch.save
    if site.work == "evaluation":
        return f"{site.detail}, called from"
    if not site.bytes:
        return site.detail
    return f"{site.detail} of {size_words(site.bytes / max(1, site.count))} each time"


def _untimed(site: SiteReading, steps: StepsReading | None, timed: int, each: float) -> str:
    """``, and once more after the last step, in no gap to time (...)``: the
    occurrences the gaps do not hold (an evaluation after the loop's last
    step has no next step to close its gap), so the count beside the gaps'
    time is theirs, and the share holds them at ``each``; "" when every
    occurrence was in a gap."""
    extra = site.occurrences - timed
    if extra <= 0:
        return ""
    times = "once" if extra == 1 else f"{extra} times"
    after = (steps is not None and steps.last_unix is not None
             and site.last_seen_unix >= steps.last_unix)
    where = "after the last step" if after and extra == 1 else "outside the loop's gaps"
    return (f", and {times} more {where}, in no gap to time (in the share at "
            f"{duration(each)} each)")


def periodic_seconds(s: Snapshot) -> float:
    """The measured wall time of the periodic evaluations and checkpoints, at
    most the run."""
    total = sum(x.gap_seconds or 0.0 for x in leads(s).values())
    return min(total, s.uptime_seconds) if s.uptime_seconds > 0 else total


def _advice(s: Snapshot, work: str, torch: bool, detail: str = "") -> str:
    """What to do about ``work``: torch's words for a torch program, and its
    recompile advice only where something was compiled; never to run it under
    inference mode where it ran so (makemore's ``@torch.inference_mode()``
    evaluate: the lead's ``detail`` ends so, from the hook; or the lead is
    that block)."""
    if not torch:
        return _ADVICE[work]
    if work == "evaluation" and not any(g.compiles for g in s.graphs):
        advice = _TORCH_ADVICE["evaluation_eager"]
    else:
        advice = _TORCH_ADVICE[work]
    if detail.endswith(" under inference_mode") or detail == "torch.inference_mode()":
        advice = advice.replace(", under torch.inference_mode(),", ",").replace(
            ", under torch.inference_mode().", ".")
    return advice


def periodic_work(s: Snapshot) -> Iterable[Finding]:
    """One finding per line that led an evaluation or checkpoint every N
    steps, when it took at least :data:`INFO_SHARE` of the run."""
    steps = steps_of(s)
    led = leads(s)
    # torch's hook measures the gaps between optimizer steps (its own words).
    torch = engine_of(s).startswith("torch")
    for site in led.values():
        run = s.uptime_seconds
        each = (site.gap_seconds or 0.0) / site.gaps
        timed = min(site.gaps, site.occurrences) if site.occurrences else site.gaps
        # The ones in no gap (an evaluation after the last step) at the timed
        # ones' mean: jax-ai-stack's text classifier evaluates each of its 2
        # epochs, one after the last step, ~30 % of the loop; the timed one
        # alone read 4.7 % of the run, an info.
        seconds = each * max(site.occurrences, timed)
        seconds = min(seconds, run) if run > 0 else seconds
        share = seconds / run if run > 0 else None
        if share is not None and share < INFO_SHARE:
            continue
        every = (site.steps_spanned / (site.occurrences - 1)
                 if site.occurrences > 1 and site.steps_spanned else None)
        members = [short_location(x.location) for x in s.sites
                   if x.within == site.location and x.location != site.location]
        between = torch
        what = _what(site, between)
        how = ("steps marked by the program" if steps is not None
               and steps.source == STEPS_MARKED else
               f"steps inferred from {steps.basis.split(':')[0]}" if steps is not None
               else "steps not known")
        often = f"every {every:,.0f} steps" if every else f"{site.occurrences} times"
        part = f"; {', '.join(sorted(set(members))[:4])} ran in it" if members else ""
        share_text = f", {share_words(share)} of run time" if share is not None else ""
        untimed = _untimed(site, steps, timed, each)
        name = f"{site.work} at {short_location(site.location)} ({what} there)"
        if site.work == "device_work":
            name = (f"work the hook did not see, read at {short_location(site.location)} "
                    f"({_unseen_words(s, site)})")
        message = (
            f"{name} runs in the step "
            f"loop's gaps {often} ({'once' if timed == 1 else f'{timed} times'}, "
            f"{duration(each)} each{share_text}"
            f"{untimed}{'; ' if untimed else ', '}measured: "
            f"{_MEASURED[True] if between else _jax_measured(s, site.work == 'device_work')}; "
            f"{how}{part}). {_advice(s, site.work, between, site.detail)}")
        yield Finding(message, Severity.WARNING if (share or 0.0) >= WARN_SHARE
                      else Severity.INFO, site.location, seconds, f"periodic_{site.work}",
                      count=site.gaps, phase=Phase.PERIODIC.value, share_of_run=share,
                      every_steps=every)


def _members(s: Snapshot, site: SiteReading) -> str:
    """``; train.py:95, train.py:99 ran in it`` (the gap's other lines), or ""."""
    members = {short_location(x.location) for x in s.sites
               if x.within == site.location and x.location != site.location}
    return f"; {', '.join(sorted(members)[:4])} ran in it" if members else ""


def per_step_work(s: Snapshot) -> Iterable[Finding]:
    """One finding per line that led a gap after (nearly) every step (a
    plotting or logging callback that calls jitted functions, a save every
    step) holding at least :data:`STEP_INFO_SHARE` of the steady steps:
    its cost is the gaps' measured wall time, per step."""
    steps = steps_of(s)
    if steps is None or not steps.count:
        return
    torch = engine_of(s).startswith("torch")
    advice = _TORCH_STEP_ADVICE if torch else _STEP_ADVICE
    eager = eager_leads(s)  # (an optimizer's jitted helper: the eager update's finding)
    for site in step_leads(s).values():
        if site.work not in advice or site.location in eager:
            continue  # device work read every step: the read's own finding (its drain)
        measured = _MEASURED[True] if torch else _jax_measured(s)
        c = cost_of(s, site.gap_seconds or 0.0, site.gaps, phase=Phase.STEP,
                    note=f"{measured}, over {site.gaps:,} gaps")
        share = c.share_of_step
        if share is None or share < STEP_INFO_SHARE:
            continue
        message = (
            f"work between steps at {short_location(site.location)} ({_what(site, torch)} "
            f"there) runs in the step loop's gap after {site.gaps:,} of {steps.count:,} steps "
            f"({c.tail()}{_members(s, site)}). {advice[site.work]}")
        yield Finding(message, Severity.WARNING if share >= STEP_WARN_SHARE else Severity.INFO,
                      site.location, kind=f"per_step_{site.work}", **c.fields())
