"""A torch DataLoader's batches the training loop waits for (``data_loader``
sites: :mod:`metrics.engines.torch.loader`).

pytorch/examples' vae decodes and transforms every sample in the training
process (``num_workers=0``: PIL and ``transforms`` in the Dataset's
``__getitem__``): 24-25 % of its loop by A/B, and no finding said so,
since nothing timed the DataLoader. The hook times each batch the main
thread draws (its ``__next__``) at the user's ``for`` line; with
``num_workers=0`` that is the samples' loading and collation, with workers
the main thread's wait for batches they had not made yet. Either way the
step waited for it: the loop's own thread did it, so it is step time.

A line's cost per step is its batches' time over the steps (within the
steady steps' time), said from :data:`MIN_SHARE` of the steady step (a
warning from :data:`WARN_SHARE`) where the line drew a batch in at least
half the steps; an evaluation's loader (its batches in the evaluation's
gaps: ``within``) is that evaluation's time, and a loader outside the
step loop (set-up, tear-down) costs no step. The advice: load in worker
processes (``num_workers>0``), ``pin_memory=True`` for a GPU, and do
per-sample work once (decoded, transformed samples cached) or on the
batch; with workers already, more of them, or cheaper samples; with workers
that match or outnumber the cores the process may use, fewer of them (at
most the cores less one, none on one core), then cheaper samples.

Example:
    >>> from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
    >>> steps = StepsReading(100, "inferred", "optimizer.step()", 1.0, 10.0, 11.0)
    >>> s = Snapshot(0.0, uptime_seconds=3.0, steps=steps,
    ...              sites=(SiteReading("data_loader", "/w/train.py:40", 100, seconds=0.3,
    ...                                 detail="num_workers=0", phase="step"),))
    >>> [(f.kind, round(f.seconds_per_step, 4)) for f in data_loading(s)]
    [('per_step_data_loading', 0.003)]
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_info.contract.model import Finding, Severity, SiteKind, SiteReading, Snapshot
from tpu_info.views.cost import (
    Cost,
    below_bar,
    cost_of,
    duration,
    share_words,
    short_location,
    site_phase,
)

MIN_SHARE = 0.05  # of the steady step: said from here
WARN_SHARE = 0.10  # a warning from here
PER_STEP_AT_LEAST = 0.5  # batches per step (the training loader's, not an evaluation's)


def loader_cost(s: Snapshot, site: SiteReading) -> Cost:
    """The main thread's time in the line's batches, over the steps."""
    span = (site.first_seen_unix, site.last_seen_unix) if site.first_seen_unix else None
    per_batch = site.seconds / site.count if site.count else 0.0
    note = (f"the main thread's time in the DataLoader's __next__, every batch timed: "
            f"{duration(per_batch)} a batch")
    return cost_of(s, site.seconds, site.count, phase=site_phase(s, site), span=span,
                   note=note)


def workers(site: SiteReading, name: str = "num_workers") -> int:
    """The loader's ``num_workers`` (or, ``name="cores"``, the cores its
    process may run on: its site's detail), 0 where not told."""
    _, _, n = site.detail.partition(f"{name}=")
    n = n.split(",")[0]
    return int(n) if n.isdigit() else 0


def _why_not(s: Snapshot, site: SiteReading, c: Cost) -> str:
    """Why a loader's line is no finding ("" when it is one)."""
    if site.within:
        return f"in the work led by {short_location(site.within)}: its time is that finding's"
    if c.steps is None:
        return "steps are not known: no per-step figure"
    if c.outside_step:
        return f"{c.phase.value} work, not in the steps: its time is not a step's"
    if (c.per_step or 0.0) < PER_STEP_AT_LEAST:
        return f"a batch in {share_words(c.per_step or 0.0)} of the steps (said from half)"
    share = c.share_of_step
    if share is None:
        return "its time is not within the steps' (no per-step figure)"
    return below_bar(c, MIN_SHARE)


def not_raised(s: Snapshot, site: SiteReading) -> str:
    """Why a ``data_loader`` site is no finding, in words ("" otherwise)."""
    if site.kind != SiteKind.DATA_LOADER.value:
        return ""
    return _why_not(s, site, loader_cost(s, site))


def _advice(n: int, cores: int) -> str:
    # Workers that match or outnumber the cores compete with the step for
    # them: fewer workers first. cifar10 (pytorch/tutorials), 2 workers on 1
    # core: num_workers=0 saved 41 % of its loop, while its samples' own work
    # was 0.34 ms of the 4.8 ms wait; makemore, 4 workers on 2 cores, was
    # slower with none (one worker leaves the step a core).
    if n and cores and n >= cores:
        fewer = ("num_workers=0: on one core the workers only take turns with the step "
                 "and add their hand-off" if cores == 1 else
                 f"num_workers={cores - 1} at most, leaving the step a core")
        return (f"Its {n} worker{'s' * (n != 1)} match or outnumber the {cores} "
                f"core{'s' * (cores != 1)} this process may use and compete with the step "
                f"for {'it' if cores == 1 else 'them'}: use fewer workers ({fewer}). Then "
                "make each sample cheaper (decode and transform once and cache, or transform "
                "whole batches on the device), or run it where more cores are free.")
    if n == 0 and cores == 1:
        # yunjey's GAN tutorial pinned to one core: its per-sample loading 38 %
        # of the loop's CPU; batches made once saved it, workers would take
        # turns with the step on that core.
        return ("On the 1 core this process may use, worker processes would take turns "
                "with the step: do the per-sample work once instead, decoding and "
                "transforming the samples before the loop and caching them (or transforming "
                "whole batches on the device), or run it where more cores are free.")
    if n == 0:
        return ("Load in worker processes beside the step (DataLoader(num_workers=N), N up "
                "to the free cores; persistent_workers=True keeps them across epochs), set "
                "pin_memory=True where batches go to a GPU, and do per-sample work once: "
                "decode and transform the samples before the loop and cache them (or "
                "transform whole batches on the device) instead of in __getitem__ every epoch.")
    return (f"Its {n} worker{'s' * (n != 1)} did not keep up with the step: add workers "
            "(up to the free cores), raise prefetch_factor, keep them across epochs "
            "(persistent_workers=True), or make each sample cheaper: decode and transform "
            "once and cache, or transform whole batches on the device.")


def data_loading(s: Snapshot) -> Iterable[Finding]:
    """One finding per DataLoader line whose batches take a large share of
    the step, at the user's ``for`` line."""
    for site in s.sites:
        if site.kind != SiteKind.DATA_LOADER.value or site.seconds <= 0:
            continue
        c = loader_cost(s, site)
        if _why_not(s, site, c):
            continue
        n = workers(site)
        at = f"{short_location(site.location)}" + (f" (via {site.via})" if site.via else "")
        what = (f"the DataLoader iterated at {at} loads every batch in the training process "
                "(num_workers=0): the step waits for it" if n == 0 else
                f"the training loop waits for the batches of the DataLoader iterated at {at} "
                f"(num_workers={n})")
        yield Finding(
            f"{what} ({c.words()}). {_advice(n, workers(site, 'cores'))}",
            Severity.WARNING if (c.share_of_step or 0.0) >= WARN_SHARE else Severity.INFO,
            site.location, kind="per_step_data_loading", **c.fields())
