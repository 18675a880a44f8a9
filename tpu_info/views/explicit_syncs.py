"""Device->host transfers in (nearly) every step that no sync or
``device_get`` line accounts for: torch_xla's reads (whose metrics carry no
lines), or an older hook without sites.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> list(explicit_syncs(Snapshot(0.0)))
    []
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tpu_info.contract.catalog import TRANSFER_FROM_DEVICE_TIME
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import Finding, Severity, SiteKind, SiteReading, Snapshot
from tpu_info.views.breakdown import breakdown
from tpu_info.views.causes import typed
from tpu_info.views.cost import cost_of, duration, engine_of, short_location, size_words
from tpu_info.views.sampled_reads import sampled_read

_EXPLICIT_ADVICE = {
    "jax": "Fetch values to the host every N steps instead (jax.device_get of a value "
           "accumulated on the device).",
    "torch_xla": "Read values (loss.item()) every N steps, after torch_xla.sync(), and "
                 "accumulate on the device in between.",
    "": "Fetch values to the host every N steps instead (accumulate them on the device).",
}


MIN_SHARE = 0.05  # of the steady step: a warning from here (a drain measured)


def explicit_syncs(s: Snapshot) -> Iterable[Finding]:
    """Device->host transfers in (nearly) every step that no line accounts for
    (an older hook without sites, torch_xla's reads), and each
    ``jax.device_get`` line read every step."""
    c0 = cost_of(s, 0.0, None)
    d2h = s.distribution(TRANSFER_FROM_DEVICE_TIME)
    if c0.steps is None or c0.steps.count < 5 or d2h is None:
        return
    # (sampled reads, numpy's of a jax.Array on the CPU, are in no distribution;
    # a jax.device_get every step is said at its own line, below, by its wait
    # beyond the step's device time: haiku's vqvae example gets its step's whole
    # output every step, and its waits, the step's compute, read "717 ms/step,
    # 100 %" here where removing it saved ~1.4 % by A/B)
    lined = (SiteKind.SYNC.value, SiteKind.DEVICE_GET.value)
    at_sites = [x for x in s.sites if x.kind in lined and not sampled_read(x)]
    count = d2h.count - sum(x.count for x in at_sites)
    seconds = d2h.total / 1e9 - sum(x.seconds for x in at_sites)
    for x in at_sites:
        if x.kind == SiteKind.DEVICE_GET.value and x.count >= 0.9 * c0.steps.count:
            yield from _device_get_every_step(s, x)
    if count < 0.9 * c0.steps.count:
        return
    c = cost_of(s, seconds, count)
    engine = engine_of(s)
    where = ""
    if "torch_xla" in (s.process.engine if s.process is not None else "") or any(
            g.engine == "torch_xla" for g in s.graphs):
        engine, where = "torch_xla", _xla_sync_lines(s)
    advice = _EXPLICIT_ADVICE.get(engine, _EXPLICIT_ADVICE[""])
    yield Finding(
        f"device->host transfers every step ({c.words()}): each one waits for the device.{where} "
        f"{advice}",
        Severity.WARNING, None, kind="per_step_sync", **c.fields())


def _device_get_every_step(s: Snapshot, x: SiteReading) -> Iterable[Finding]:
    """A ``jax.device_get`` at the user's line every step: each waits for the
    step queued before it, whose device work runs either way, so it costs
    its wait beyond the device's time for that step (the drain it causes,
    as a sync line's), at most its wait; where the device's time per step
    is not measured, the wait is an upper bound, said at information."""
    b = breakdown(s)
    device = b.device if b is not None and not b.device_blurred else None
    each = x.seconds / x.count
    if device is None:
        c, severity = cost_of(s, x.seconds, x.count), Severity.INFO
        basis = ("; its waits hold the device's queued steps, which run either way, so this "
                 "is an upper bound of what fetching less often saves")
    else:
        beyond = max(0.0, each - device)
        c, severity = cost_of(s, beyond * x.count, x.count), Severity.WARNING
        basis = (f"; its wait, {duration(each)} a read, less the device's "
                 f"{duration(device)} a step ({b.device_basis}) that runs either way"
                 if b is not None else "")
    if not c.seconds or c.share_of_step is None or c.share_of_step < MIN_SHARE:
        severity = Severity.INFO
    yield Finding(
        f"jax.device_get at {short_location(x.location)} reads {size_words(x.bytes / x.count)} "
        f"back to the host every step ({c.words()}{basis}). {_EXPLICIT_ADVICE['jax']}",
        severity, x.location, kind="per_step_sync", **c.fields())


def _xla_sync_lines(s: Snapshot) -> str:
    """Where torch_xla's device->host reads come from, as far as it can be
    seen: its metrics have no lines, only the compiles a read forced do."""
    lines = sorted({os.path.basename(c.location) for g in s.graphs if g.engine == "torch_xla"
                    for c in g.causes if c.location
                    and typed(c).kind == CauseKind.XLA_VALUE_ACCESS})
    known = (f" Of these, the reads before the sync are at {', '.join(lines)} (named above)"
             if lines else " None of them forced a compile")
    return (f" torch_xla's transfer metrics carry no source lines.{known}; the rest (.cpu(), "
            ".item() or printing after torch_xla.sync()) are not attributed to a line.")
