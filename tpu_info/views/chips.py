"""Local chips joined with what libtpu and the hooked processes say about them.

A chip's row combines three sources, best first:

1. libtpu's RuntimeMetricService (``localhost:8431``): HBM used and total and
   the duty cycle of each device, for every chip.
2. The hook of the process that holds the chip (its snapshot's devices:
   JAX's ``memory_stats``): HBM used and the runtime's total where libtpu
   cannot be reached (a sandbox without TCP, libtpu's service off), and the
   hook's own busy estimate, labelled as one.
3. The host scan: the generation's HBM size from a table (``spec``).

A hooked process's devices are joined to chips by owner, never by index: the
process's pid must hold the chip open (``/proc``), and its k-th TPU device
(by id) is the k-th chip it holds (by PCI address). On a host that passes one
of four chips through, JAX's ``TPU_0`` is the fourth PCI function.

Example:
    >>> usage, folded = chip_usage(None, [])
    >>> usage, folded
    ([], set())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tpu_info.contract.model import (
    BUSY_FROM_LIBTPU,
    ChipRecord,
    DeviceRecord,
    LocalScan,
    OwnerRecord,
)
from tpu_info.views.values import TargetView

# Where a chip's HBM figures came from.
HBM_LIBTPU, HBM_HOOK, HBM_NVML, HBM_SPEC = "libtpu", "hook", "nvml", "spec"
# Where its busy % came from: libtpu's duty cycle, NVML, or the hook's estimate.
BUSY_LIBTPU, BUSY_NVML, BUSY_ESTIMATE = "libtpu", "nvml", "estimate"


@dataclass(frozen=True, slots=True)
class ChipUsage:
    """A local chip with what libtpu or its owner's hook said about it.

    Attributes:
        hbm_source: ``libtpu``, ``hook``, ``nvml``, ``spec`` (the total from
            the generation's table, no use), or "" (nothing known).
        busy_source: ``libtpu``, ``nvml``, ``estimate`` (the hook's), or "".
        hook_pid: the hooked owner whose snapshot filled the row, if any.
        owners: who holds the chip open, named (pid, name, user, command).
        libtpu_devices, hook_devices: ``(target, device id)`` of the devices
            of libtpu's service and of the owner's hook joined to the chip
            (the dashboard draws the row's history from their samples).
    """

    chip: ChipRecord
    hbm_used_bytes: int | None
    hbm_total_bytes: int | None
    busy_percent: float | None
    reasons: dict[str, str]
    hbm_source: str = ""
    busy_source: str = ""
    hook_pid: int | None = None
    owners: tuple[OwnerRecord, ...] = field(default=())
    libtpu_devices: tuple[tuple[str, int], ...] = ()
    hook_devices: tuple[tuple[str, int], ...] = ()
    busy_from_hook: bool = False  # busy % as the owner's hook sent it (estimate or SDK)


Folded = set[tuple[int, int]]  # (id(view), device id): devices shown in a chip's row


def _libtpu_devices(tpus: list[ChipRecord], views: Sequence[TargetView],
                    folded: Folded) -> dict[int, list[tuple[str, DeviceRecord]]]:
    """libtpu's devices per chip index: its k-th device (by id) on the k-th usable
    chip (all chips, when it reports more devices than the usable ones hold)."""
    out: dict[int, list[tuple[str, DeviceRecord]]] = {}
    per = max(1, tpus[0].devices_per_chip or 1) if tpus else 1
    usable = [c for c in tpus if c.usable]
    for v in views:
        if v.source != "libtpu" or v.snapshot is None or not tpus:
            continue
        devs = sorted(v.snapshot.devices, key=lambda d: d.id)
        pool = usable if usable and len(devs) <= len(usable) * per else tpus
        for k, d in enumerate(devs):
            folded.add((id(v), d.id))
            if k // per < len(pool):
                out.setdefault(pool[k // per].index, []).append((v.target, d))
    return out


def _hooked_devices(tpus: list[ChipRecord], views: Sequence[TargetView], host: str | None,
                    folded: Folded) -> dict[int, tuple[int, str, list[DeviceRecord]]]:
    """Each hooked owner's TPU devices per chip index it holds: (pid, target, devices)."""
    out: dict[int, tuple[int, str, list[DeviceRecord]]] = {}
    for v in views:
        s = v.snapshot
        if v.source == "libtpu" or s is None or s.process is None:
            continue
        p = s.process
        if host and p.host and p.host != host:
            continue  # another host's pid says nothing about this host's chips
        owned = sorted((c for c in tpus if p.pid in c.owner_pids), key=lambda c: c.index)
        devs = sorted((d for d in s.devices if d.platform.lower() == "tpu"), key=lambda d: d.id)
        if not owned or not devs:
            continue
        per = max(1, owned[0].devices_per_chip or 1)
        if len(devs) == len(owned) * per:
            groups = [devs[i * per:(i + 1) * per] for i in range(len(owned))]
        elif len(owned) == 1:
            groups = [devs]
        else:
            continue  # which device is which chip cannot be told: listed apart
        for chip, group in zip(owned, groups, strict=True):
            if chip.index not in out:
                out[chip.index] = (p.pid, v.target, group)
                folded.update((id(v), d.id) for d in group)
    return out


def _hooked_names(scan: LocalScan, views: Sequence[TargetView],
                  host: str | None) -> dict[int, OwnerRecord]:
    """Owners that are hooked processes of this host, named as their hooks
    name them (``train.py``, where ``/proc`` says ``python3``)."""
    out = {}
    for v in views:
        p = v.snapshot.process if v.snapshot is not None else None
        if p is None or not p.name or (host and p.host and p.host != host):
            continue
        o = scan.owner(p.pid)
        if o is not None:
            out[p.pid] = replace(o, name=p.name)
    return out


def _sum(values: list[int | None]) -> int | None:
    known = [x for x in values if x is not None]
    return sum(known) if known else None


def owner_words(owners: Sequence[OwnerRecord], pids: Sequence[int]) -> str:
    """``pid 4242 (python3)``, for reasons; the pids alone where unnamed."""
    named = {o.pid: o for o in owners}
    return ", ".join(f"pid {p} ({named[p].name})" if p in named and named[p].name else f"pid {p}"
                     for p in pids)


def _missing(c: ChipRecord, views: Sequence[TargetView], scan: LocalScan,
             hooked_pids: set[int]) -> str | None:
    """Why a TPU chip has no live reading, when libtpu did not answer."""
    if any(v.source == "libtpu" and v.ok for v in views):
        return None
    libtpu = [v for v in views if v.source == "libtpu"]
    why = (f"libtpu's metric service did not answer ({libtpu[0].error})" if libtpu
           else "libtpu's metric service was not asked")
    if not c.usable:
        return why
    if not c.owner_pids:
        return f"{why}, and no process holds the chip"
    words = owner_words(scan.owners, c.owner_pids)
    if any(p in hooked_pids for p in c.owner_pids):
        return f"{why}, and its hooked owner ({words}) reported no TPU device for it"
    return f"{why}; {words} holds the chip without the hook (metrics.install())"


def chip_usage(local: LocalScan | None, views: Sequence[TargetView],
               host: str | None = None) -> tuple[list[ChipUsage], Folded]:
    """Local chips (all of them, usable or not) joined with libtpu's devices and
    their owners' hooks (see the module docstring).

    Args:
        local: the host scan.
        views: one per target, read or failed.
        host: this host's name: a hooked process on another host is never joined.

    Returns:
        The chips, and ``(id(view), device id)`` of each device shown in a
        chip's row (outputs do not list those again).
    """
    chips = list(local.chips) if local else []
    folded: Folded = set()
    tpus = [c for c in chips if c.vendor == "tpu"]
    lib = _libtpu_devices(tpus, views, folded)
    hooked = _hooked_devices(tpus, views, host, folded)
    hooked_pids = {v.snapshot.process.pid for v in views
                   if v.snapshot is not None and v.snapshot.process is not None}
    scan = local or LocalScan()
    names = _hooked_names(scan, views, host)
    out = []
    for c in chips:
        reasons = dict(c.reasons)
        used, total, busy = c.hbm_used_bytes, c.hbm_total_bytes, c.busy_percent
        nvidia = c.vendor == "nvidia"
        hbm_src = HBM_NVML if nvidia and total is not None else HBM_SPEC if total else ""
        busy_src = BUSY_NVML if nvidia and busy is not None else ""
        lib_pairs = lib.get(c.index, []) if not nvidia else []
        devs = [d for _, d in lib_pairs]
        if devs:
            lib_used = _sum([d.memory.used_bytes for d in devs])
            lib_total = _sum([d.memory.limit_bytes for d in devs])
            bs = [d.busy_percent for d in devs if d.busy_percent is not None]
            if lib_used is not None:
                used, hbm_src = lib_used, HBM_LIBTPU
                reasons.pop("hbm_used_bytes", None)
            if lib_total is not None:
                total, hbm_src = lib_total, HBM_LIBTPU
            if bs:
                busy, busy_src = sum(bs) / len(bs), BUSY_LIBTPU
                reasons.pop("busy_percent", None)
        from_hook = False
        pid, hook_target, own = (hooked.get(c.index, (None, "", [])) if not nvidia
                                 else (None, "", []))
        if own:
            hook_used = _sum([d.memory.used_bytes for d in own])
            hook_total = _sum([d.memory.limit_bytes for d in own])
            if used is None and hook_used is not None:
                used, hbm_src = hook_used, HBM_HOOK
                reasons.pop("hbm_used_bytes", None)
            if hook_total is not None and hbm_src in (HBM_SPEC, HBM_HOOK, ""):
                total, hbm_src = hook_total, HBM_HOOK  # the runtime's, not a table's
            bs = [d.busy_percent for d in own if d.busy_percent is not None]
            if busy is None and bs:
                # libtpu's duty cycle read by the hook in the process (its SDK), else
                # the hook's own estimate (an older hook does not say: its estimate)
                sdk = all(d.busy_source == BUSY_FROM_LIBTPU for d in own
                          if d.busy_percent is not None)
                busy, busy_src = sum(bs) / len(bs), BUSY_LIBTPU if sdk else BUSY_ESTIMATE
                from_hook = True
                reasons.pop("busy_percent", None)
            elif busy is None:
                why = next((d.busy_reason for d in own if d.busy_reason), "")
                reasons["busy_percent"] = (f"libtpu's duty cycle is unavailable and the hook "
                                           f"of pid {pid} has no estimate: {why}".rstrip(": "))
        if not nvidia and not devs and not own:
            missing = _missing(c, views, scan, hooked_pids)
            if missing and used is None:
                reasons["hbm_used_bytes"] = missing
            if missing and busy is None:
                reasons["busy_percent"] = missing
        owners = tuple(names.get(o.pid, o) for o in scan.owners if o.pid in c.owner_pids)
        out.append(ChipUsage(c, used, total, busy, reasons, hbm_src, busy_src,
                             pid if own else None, owners,
                             tuple((t, d.id) for t, d in lib_pairs),
                             tuple((hook_target, d.id) for d in own), from_hook))
    return out, folded


def hidden_line(usage: Sequence[ChipUsage], listed: Sequence[ChipUsage]) -> str:
    """``3 more TPU chips on this host are not usable here (no /dev/vfio/1, ...);
    --all lists them``, or "" when every chip is listed."""
    shown = {id(u) for u in listed}
    hidden = [u.chip for u in usage if id(u) not in shown]
    if not hidden:
        return ""
    n = len(hidden)
    more = "more " if listed else ""
    paths = [c.device_path or c.name for c in hidden]
    nodes = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
    return (f"{n} {more}TPU chip{'s' if n != 1 else ''} on this host "
            f"{'are' if n != 1 else 'is'} not usable here (no {nodes}); --all lists "
            f"{'them' if n != 1 else 'it'}")


def chip_notes(usage: Sequence[ChipUsage], listed: Sequence[ChipUsage]) -> list[str]:
    """The lines under the Devices table: chips not listed, then where the
    listed chips' HBM and busy % came from when not from libtpu or NVML."""
    out = [x for x in (hidden_line(usage, listed),) if x]
    for u in listed:
        if u.hbm_source == HBM_HOOK:
            out.append(f"HBM of {u.chip.name}: from pid {u.hook_pid}'s hook (libtpu's metric "
                       "service did not report it)")
        if u.busy_from_hook and u.busy_source == BUSY_LIBTPU:
            out.append(f"busy % of {u.chip.name}: libtpu's duty cycle, read in pid "
                       f"{u.hook_pid} by its hook (libtpu's monitoring SDK)")
    if any(u.busy_source == BUSY_ESTIMATE for u in listed):
        out.append("~ busy %: the hook's estimate, not libtpu's duty cycle")
    spec = [u.chip for u in listed if u.hbm_source == HBM_SPEC]
    if spec:
        out.append(f"HBM total of {', '.join(c.name for c in spec)}: the {spec[0].kind}'s "
                   "nominal size (libtpu or a hooked owner gives the runtime's)")
    return out
