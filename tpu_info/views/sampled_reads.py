"""What a read seen only in sampled intervals cost: ``np.asarray(loss)`` of a
jax.Array on the CPU, which numpy reads through its buffer protocol in C
(:mod:`metrics.engines.jax.numpy_reads`), timed by the hook only in its
sampled intervals between steps (:mod:`metrics.engines.jax.host_lines`).

Such a ``sync`` site is sampled (``0 < timed < count``): ``seconds`` are
its timed reads' waits, ``count`` the steps' worth. Its waits, scaled to all
its reads, hold the device's queued work; the read costs the drain it
causes, as :mod:`metrics.engines.jax.drains` costs the reads it sees one by
one: ``h + w - max(h, d)`` per read, where, at one read a step, ``h + w``
is the step (``P``) and ``d`` the device's time for it (``D``), so
``min(w, P - D)``: its wait, at most the step's time the device was idle
(:func:`~tpu_info.views.breakdown.device_idle`, the steps less the device's
measured time). Where the host set the loop's pace
(:func:`~tpu_info.views.slack.host_paced`) the device's sampled times are
upper bounds and the read costs its wait (``h > d``); so where they hold the
host's own time (:attr:`~tpu_info.views.breakdown.Breakdown.device_blurred`). And never more than
the host's other time in the steps (:func:`~tpu_info.views.sites._sync_cost`'s
bound).

Example:
    >>> from tpu_info.contract.model import SiteReading
    >>> sampled_read(SiteReading("sync", "/p.py:9", 1000, 4000, 0.05, timed=50, timed_bytes=200))
    True
"""

from __future__ import annotations

from tpu_info.contract.model import Phase, SiteKind, SiteReading, Snapshot
from tpu_info.views.breakdown import breakdown, device_idle
from tpu_info.views.cost import Cost, cost_of, duration, steps_of
from tpu_info.views.slack import host_paced


def sampled_read(site: SiteReading) -> bool:
    """Whether ``site`` is a read timed only in sampled intervals."""
    return site.kind == SiteKind.SYNC.value and 0 < site.timed < site.count


def waits(site: SiteReading) -> float:
    """A sampled read's waits scaled to all its reads (by bytes, else count)."""
    scale = site.bytes / site.timed_bytes if site.timed_bytes else site.count / site.timed
    return site.seconds * scale


def read_cost(s: Snapshot, site: SiteReading, phase: Phase,
              span: tuple[float, float] | None, apart: float | None) -> Cost:
    """A sampled read's cost: its drain (module docstring)."""
    waited = waits(site)
    lost = waited
    note = (f"sampled: {site.timed:,} reads timed in the hook's sampled intervals between "
            f"steps, {duration(waited / max(1, site.count))} of waiting a read")
    steps = steps_of(s)
    b = breakdown(s)
    told = b is not None and not b.device_blurred  # (blurred: the idle time is unmeasured)
    idle = device_idle(s) if told and host_paced(s) is None else None
    if idle is not None and steps is not None and steps.count:
        per_read = idle.seconds / steps.count  # one read a step: h + w is the step
        bound = per_read * site.count
        if bound < lost:
            lost = bound
            note += (f"; the drain it caused: at most the step's {duration(per_read)} the "
                     f"device was idle (its own {duration(idle.device_per_step)}/step, median "
                     f"of {idle.samples:,} timed executions); the rest of the wait held the "
                     "device's queued work, which runs either way")
    if steps is not None and steps.seconds_total:
        other = max(0.0, steps.seconds_total - waited)
        if other < lost:
            lost = other
            note += "; at most the host's other time in the steps"
    return cost_of(s, lost, site.count, phase=phase, span=span, note=note, apart=apart)
