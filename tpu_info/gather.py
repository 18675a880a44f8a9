"""One look at everything ``tpu-info`` shows: local chips, discovered hooked
processes, libtpu on localhost:8431 and the targets the user named.

Example:
    >>> g = gather([], timeout=0.5, probe_libtpu=False, scan_devices=False,
    ...            runtime_dir="/nonexistent")
    >>> g.views
    []
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tpu_info.model import LocalScan
from tpu_info.targets import normalize
from tpu_info.views import TargetView

LIBTPU_TARGET = "localhost:8431"


@dataclass(frozen=True)
class Gathered:
    """What one look found; ``notes`` are (where, reason) pairs for ``doctor``."""

    views: list[TargetView]
    local: LocalScan
    notes: list[tuple[str, str]] = field(default_factory=list)
    discovered: int = 0

    @property
    def failed(self) -> list[TargetView]:
        return [v for v in self.views if not v.ok]


def _read_hook_or_libtpu(client):  # type: ignore[no-untyped-def]
    """Our service first; a server that only speaks libtpu's is read as libtpu."""
    from tpu_info.errors import NotAMonitor

    try:
        return "hook", client.snapshot()
    except NotAMonitor:
        return "libtpu", client.libtpu()


def gather(
    targets: Sequence[str],
    timeout: float = 3.0,
    *,
    use_discovery: bool = True,
    probe_libtpu: bool = True,
    scan_devices: bool = True,
    runtime_dir: str | None = None,
) -> Gathered:
    """Reads every source at once; a failed target becomes a view with its error.

    Targets named by the user that fail are errors (exit code 1); libtpu's
    default port answering nothing is only a note, since most machines have
    no libtpu.
    """
    from tpu_info import devices, discovery
    from tpu_info.client import fan_out

    notes: list[tuple[str, str]] = []
    local = devices.scan_local() if scan_devices else LocalScan()
    for key, why in local.reasons.items():
        notes.append((f"local/{key}", why))

    order: list[str] = []
    implicit: set[str] = set()
    discovered = 0
    if use_discovery:
        scan = discovery.scan(runtime_dir)
        for s in scan.skipped:
            notes.append((f"discovery/{s.path.name}", f"{s.reason}: {s.detail}".rstrip(": ")))
        for p in scan.processes:
            order.append(p.target)
            discovered += 1
        if not scan.processes:
            notes.append(("discovery", f"no hooked process of this user found in {scan.directory}"
                          " (start one with metrics.install() or `tpu-info run -- python ...`)"))
    for t in targets:
        order.append(t)
    if probe_libtpu:
        order.append(LIBTPU_TARGET)
        implicit.add(normalize(LIBTPU_TARGET))
    seen: set[str] = set()
    unique: list[str] = []
    for t in order:
        key = normalize(t)
        if key not in seen:
            seen.add(key)
            unique.append(t)
    # A target the user named explicitly is not implicit any more.
    implicit -= {normalize(t) for t in targets}
    implicit -= {normalize(t) for t in order[:discovered]}

    views: list[TargetView] = []
    for r in fan_out(unique, timeout=timeout, call=_read_hook_or_libtpu):
        if r.ok:
            source, snap = r.value  # type: ignore[misc]
            views.append(TargetView(r.target, snap, source=source))
        elif normalize(r.target) in implicit:
            notes.append((r.target, f"libtpu not present: {r.error} (normal on machines "
                          "without TPUs, or when no TPU program runs)"))
        else:
            views.append(TargetView(r.target, None, error=str(r.error)))
    return Gathered(views, local, notes, discovered)
