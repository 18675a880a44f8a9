"""The process's other Python threads competing with the step for its cores
(``thread_work`` sites: :mod:`metrics.engines.other_threads`): a data
pipeline's prefetch pool doing per-example work.

What it costs the loop: where the process's cores are contended (the
training thread waited for a core :data:`~tpu_info.views.slack.LOADED_PERCENT`
of the loop's time or more, or the process's threads together
:data:`CONTENDED_PERCENT`: on the CPU backend the device's work is the
engine's threads), every CPU second the other threads take is
one the step's own work (the training thread's, and the device's where the
device is the host's CPU) waits for: the step's time in the proportion of the
process's CPU they used (``OtherThreadsCpu``'s mean), since the step's wall
time is the process's CPU time at the rate the process got its cores. Where
the cores were not contended, the threads ran beside the step on spare
cores: not raised, said so; nor on an accelerator, whose work takes no core
from them (a pipeline that paces its loop is the loop's wait for a batch).
Said from :data:`MIN_SHARE` of the steady step on :data:`MIN_WINDOWS`
sampled windows (a warning from :data:`WARN_SHARE`). A pipeline too slow to
keep up shows on the training thread instead, as its wait for the next batch
(``host_work`` at the loop's line).

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> list(thread_work(Snapshot(0.0)))
    []
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_info.contract import catalog
from tpu_info.contract.model import Finding, Phase, Severity, SiteKind, SiteReading, Snapshot
from tpu_info.views.breakdown import Breakdown, breakdown
from tpu_info.views.cost import below_bar, cost_of, duration, short_location, steps_of
from tpu_info.views.slack import loaded_machine, on_cpu

MIN_SHARE = 0.05  # of the steady step: said from here
WARN_SHARE = 0.10  # a warning from here
MIN_WINDOWS = 3  # sampled windows the median stands on, at least
CONTENDED_PERCENT = 10.0  # the process's threads' wait for a core over the wall: contended


def _mean(s: Snapshot, name: str) -> tuple[float, int] | None:
    """A sampled percentage's mean over its windows (a pipeline fills its
    buffer in bursts: a median of its windows reads 0 between them), and
    how many; None below :data:`MIN_WINDOWS`."""
    d = s.distribution(name)
    if d is None or d.count < MIN_WINDOWS:
        return None
    return d.total / d.count, d.count


def contended(s: Snapshot) -> str:
    """Why the process's cores were contended in the loop, in words ("": they
    were not, or it is not known)."""
    loaded = loaded_machine(s)
    if loaded is not None:
        return (f"the training thread waited for a core {loaded[0]:.0f}% of the loop's time "
                f"(median of {loaded[1]} readings)")
    queued = _mean(s, catalog.PROCESS_RUN_QUEUE)
    if queued is not None and queued[0] >= CONTENDED_PERCENT:
        return (f"the process's threads waited for a core {queued[0]:.0f}% of the loop's time "
                f"together (mean of {queued[1]} readings)")
    return ""


def _groups(s: Snapshot) -> list[SiteReading]:
    return sorted((x for x in s.sites if x.kind == SiteKind.THREAD_WORK.value and x.seconds > 0),
                  key=lambda x: -x.seconds)


def _why_not(s: Snapshot, b: Breakdown | None, share: tuple[float, int] | None) -> str:
    """Why the other threads are no finding ("": they are one), from the
    snapshot's breakdown ``b`` and their mean share of the process's CPU."""
    steps = steps_of(s)
    if b is None or not b.step_seconds or steps is None:
        return "the steady step's time is not known"
    if share is None:
        return f"fewer than {MIN_WINDOWS} sampled windows"
    if not on_cpu(s):  # (an accelerator's work takes no core from them)
        return (f"the other threads used {share[0]:.0f}% of the process's CPU beside the "
                "device's work (it runs on the accelerator, not on these cores); a pipeline "
                "that paces the loop shows as the loop's wait for its next batch")
    if not contended(s):
        return (f"the other threads used {share[0]:.0f}% of the process's CPU, beside the step "
                "on spare cores (neither the training thread nor the process's threads "
                "waited for a core 10% of the loop's time)")
    c = cost_of(s, share[0] / 100.0 * b.step_seconds * steps.count, steps.count,
                phase=Phase.STEP)
    return below_bar(c, MIN_SHARE) if c.share_of_step is not None else ""


def not_raised(s: Snapshot, site: SiteReading) -> str:
    """Why a ``thread_work`` site is no finding, in words ("" otherwise)."""
    if site.kind != SiteKind.THREAD_WORK.value:
        return ""
    groups = _groups(s)
    if groups and site is not groups[0] and site != groups[0]:
        return f"counted with the other threads at {short_location(groups[0].location)}"
    return _why_not(s, breakdown(s), _mean(s, catalog.OTHER_THREADS_CPU))


def thread_work(s: Snapshot) -> Iterable[Finding]:
    """One finding for the process's other Python threads where their CPU
    comes out of a contended step, at the busiest group's line."""
    groups = _groups(s)
    if not groups:
        return
    share, b, steps = _mean(s, catalog.OTHER_THREADS_CPU), breakdown(s), steps_of(s)
    if _why_not(s, b, share) or share is None or b is None or not b.step_seconds or not steps:
        return
    per_step, n = share[0] / 100.0 * b.step_seconds, steps.count
    top = groups[0]
    note = (f"the other threads' mean share of the process's CPU over {share[1]} sampled "
            f"windows, times the steady step {duration(b.step_seconds)}")
    c = cost_of(s, per_step * n, n, phase=Phase.STEP, note=note)
    names = "; ".join(g.detail for g in groups[:3])
    seen = not top.location.startswith("<")
    at = (f"mostly in {top.function}() at {short_location(top.location)}" if seen
          else "not seen (idle at every sample)")
    severity = Severity.WARNING if (c.share_of_step or 0.0) >= WARN_SHARE else Severity.INFO
    yield Finding(
        f"other threads of the process ({names}) used {share[0]:.0f}% of its CPU while the "
        f"step loop ran, their work {at} ({c.words()}). The "
        f"process's cores were contended ({contended(s)}), so that CPU time comes out of "
        f"the step. If it is a data pipeline's per-example work: do it once before the "
        f"loop (preprocess the data set), move array math on the batch into the jitted "
        f"step, or give the pipeline fewer threads than the cores the step leaves free "
        f"(grain: ReadOptions(num_threads=...)); on a host with spare cores it overlaps.",
        severity, top.location if seen else None, kind="per_step_thread_work", **c.fields())
