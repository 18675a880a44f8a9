"""Device->host transfers in (nearly) every step that no sync line accounts
for: an explicit ``jax.device_get`` every step, torch_xla's reads (whose
metrics carry no lines), or an older hook without sites.

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
from tpu_info.contract.model import Finding, Severity, SiteKind, Snapshot
from tpu_info.views.causes import typed
from tpu_info.views.cost import cost_of, engine_of
from tpu_info.views.sampled_reads import sampled_read

_EXPLICIT_ADVICE = {
    "jax": "Fetch values to the host every N steps instead (jax.device_get of a value "
           "accumulated on the device).",
    "torch_xla": "Read values (loss.item()) every N steps, after torch_xla.sync(), and "
                 "accumulate on the device in between.",
    "": "Fetch values to the host every N steps instead (accumulate them on the device).",
}


def explicit_syncs(s: Snapshot) -> Iterable[Finding]:
    """Device->host transfers in (nearly) every step that no sync line accounts
    for (explicit ``device_get``, or an older hook without sites)."""
    c0 = cost_of(s, 0.0, None)
    d2h = s.distribution(TRANSFER_FROM_DEVICE_TIME)
    if c0.steps is None or c0.steps.count < 5 or d2h is None:
        return
    # (sampled reads, numpy's of a jax.Array on the CPU, are in no distribution)
    at_sites = [x for x in s.sites if x.kind == SiteKind.SYNC.value and not sampled_read(x)]
    count = d2h.count - sum(x.count for x in at_sites)
    seconds = d2h.total / 1e9 - sum(x.seconds for x in at_sites)
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
