"""Device rows: each local chip joined with libtpu and its owner's hook, and
the devices of each process that no chip row shows.

:func:`device_readings` is the one join every output of devices reads: the
CLI's Devices table (through :func:`tpu_info.views.derived.readings`),
``--json`` and the dashboard's Devices panel, so a chip shows with the same
owner, HBM source and busy label everywhere (:mod:`tpu_info.views.chips`).

Example:
    >>> from tpu_info.contract.model import LocalScan
    >>> d = device_readings([], LocalScan(), "h")
    >>> d.chips, d.notes, d.hidden
    ((), (), '')
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tpu_info.contract.model import BUSY_FROM_LIBTPU, DeviceRecord, LocalScan, OwnerRecord
from tpu_info.views.chips import (
    BUSY_ESTIMATE,
    ChipUsage,
    Folded,
    chip_notes,
    chip_usage,
    hidden_line,
)
from tpu_info.views.derived_value import Derived, Row
from tpu_info.views.values import TargetView, clean


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A local chip, or a device one process reported."""

    label: str  # tpu0, or platform:id
    kind: str
    path: Derived[str]  # a chip's device node; a process's target
    hbm_used: Derived[int]
    hbm_total: Derived[int]
    hbm_percent: Derived[float]
    busy: Derived[float]
    pids: Derived[str]  # "4242, 4243": the owners' pids
    na: tuple[tuple[str, str], ...] = ()
    owners: Derived[str] = Derived()  # "4242 python3": the owners named (tables show this)
    busy_estimated: bool = False  # the hook's estimate, not libtpu's duty cycle
    hbm_source: str = ""  # libtpu, hook, nvml, spec (views.chips)
    number: int | None = None  # tpu3: 3 (what -i and -L take); a process's device: its id
    pci_address: str = ""  # a local chip's (0000:00:0b.0)


def owner_cell(pids: tuple[int, ...], named: tuple[OwnerRecord, ...]) -> str:
    """``4242 python3, 4300``: each owner's pid and, where known, its name."""
    names = {o.pid: o.name for o in named}
    return ", ".join(f"{p} {clean(names[p], 32)}" if names.get(p) else str(p) for p in pids)


def chip_row(u: ChipUsage) -> DeviceRow:
    """One local chip with what libtpu or its owner's hook said about it."""
    c = u.chip
    r = Row(f"devices/{c.name}")
    why_used = u.reasons.get("hbm_used_bytes", "not reported")
    used = r.get("hbm_used", u.hbm_used_bytes, why_used)
    total = r.get("hbm_total", u.hbm_total_bytes, u.reasons.get("hbm_total_bytes", "not reported"))
    unknown = not c.owner_pids and "owner_pids" in u.reasons
    pids = r.get("pids", None if unknown else ", ".join(map(str, c.owner_pids)) or "-",
                 u.reasons.get("owner_pids", ""))
    owners = Derived.of(None if unknown else owner_cell(c.owner_pids, u.owners) or "-",
                        pids.reason)
    path = r.get("path", c.device_path or None, u.reasons.get("device_path", "not reported"))
    busy = r.get("busy", u.busy_percent, u.reasons.get("busy_percent", "not reported"))
    pct = r.get("hbm_percent", _percent(u.hbm_used_bytes, u.hbm_total_bytes), why_used)
    kind = f"TPU {c.kind}" if c.vendor == "tpu" else c.kind
    return DeviceRow(c.name, kind, path, used, total, pct, busy, pids, tuple(r.na), owners,
                     u.busy_source == BUSY_ESTIMATE, u.hbm_source, c.index, c.pci_address)


def device_row(v: TargetView, d: DeviceRecord) -> DeviceRow:
    """One device of the process read at ``v`` (``v.snapshot`` is set)."""
    s = v.snapshot
    assert s is not None
    r = Row(f"devices/{v.target}/{d.platform}:{d.id}")
    m = d.memory
    why = m.reason or f"the engine does not report device memory ({m.source})"
    used = r.get("hbm_used", m.used_bytes, why)
    total = r.get("hbm_total", m.limit_bytes, m.reason or "the engine reports no memory limit")
    busy = r.get("busy", d.busy_percent, d.busy_reason or "the engine does not report busy %")
    pct = r.get("hbm_percent", _percent(m.used_bytes, m.limit_bytes), why)
    pid = Derived(str(s.process.pid) if s.process else "-")
    owner = Derived(f"{s.process.pid} {clean(s.process.name, 32)}".strip() if s.process
                    else "-")
    estimated = (v.source != "libtpu" and d.busy_percent is not None
                 and d.busy_source != BUSY_FROM_LIBTPU)  # the hook's, unless its SDK read
    return DeviceRow(f"{d.platform}:{d.id}", d.kind, Derived(v.target), used, total, pct, busy,
                     pid, tuple(r.na), owner, estimated,
                     m.source if m.used_bytes is not None else "", d.id)


def _percent(used: int | None, total: int | None) -> float | None:
    return None if used is None or not total else 100.0 * used / total


@dataclass(frozen=True, slots=True)
class DeviceReadings:
    """The devices of one look: the chips listed and what is left per process.

    Attributes:
        usage: every local chip, listed or not (for ``--json``).
        listed: the chips shown (the usable ones, or all with ``--all``).
        chips: a row per listed chip.
        folded: ``(id(view), device id)`` of each process's device shown in a
            chip's row (:meth:`shown` leaves those out).
        notes: the lines under the table: chips not listed, where HBM and busy
            % came from (:func:`tpu_info.views.chips.chip_notes`).
        hidden: the chips not listed, in one line ("" when none).
    """

    usage: tuple[ChipUsage, ...]
    listed: tuple[ChipUsage, ...]
    chips: tuple[DeviceRow, ...]
    folded: Folded
    notes: tuple[str, ...]
    hidden: str

    def shown(self, v: TargetView) -> tuple[DeviceRecord, ...]:
        """The devices of ``v``'s snapshot that no chip row shows."""
        s = v.snapshot
        if s is None:
            return ()
        return tuple(d for d in s.devices if (id(v), d.id) not in self.folded)


def device_readings(views: Sequence[TargetView], local: LocalScan | None, host: str | None,
                    all_chips: bool = False,
                    only: Collection[str] | None = None) -> DeviceReadings:
    """The local chips joined with libtpu's devices and their owners' hooks
    (:func:`tpu_info.views.chips.chip_usage`), the rows of those listed, and
    the notes under them.

    Args:
        views: one per target, read or failed (the same objects :meth:`~DeviceReadings.shown`
            is later given).
        local: the host scan (None: not scanned).
        host: this host's name: a hooked process on another host is never joined.
        all_chips: list every chip, also those not usable here (``--all``).
        only: list only these chips (``-i``: names from :func:`pick_chips`); the
            others are not counted under the table.
    """
    usage, folded = chip_usage(local, views, host)
    listed = tuple(u for u in usage if (all_chips or u.chip.usable)
                   and (only is None or u.chip.name in only))
    scope = usage if only is None else listed  # -i: the chips left out are not "hidden"
    return DeviceReadings(tuple(usage), listed, tuple(chip_row(u) for u in listed), folded,
                          tuple(chip_notes(scope, listed)), hidden_line(scope, listed))


def pick_chips(local: LocalScan, ids: Sequence[str], all_chips: bool = False,
               flag: str = "-i") -> frozenset[str]:
    """The chips ``-i`` (or nvitop's ``--only``: ``flag``) names, as the
    Devices table names them (``tpu3``, or ``3``: ``tpu3``, else ``gpu3``).

    Raises:
        ValueError: an id no listed chip has (one line, naming those there are).

    >>> pick_chips(LocalScan(), ["0"])
    Traceback (most recent call last):
    ValueError: -i 0: no such device here (devices: none); tpu-info -L lists them
    """
    chips = {c.name: c for c in local.chips}
    listed = [c.name for c in local.chips if all_chips or c.usable]
    picked = set()
    for i in ids:
        name = next((n for n in (f"tpu{i}", f"gpu{i}") if n in chips), i) if i.isdigit() else i
        chip = chips.get(name)
        if chip is None:
            raise ValueError(f"{flag} {i}: no such device here (devices: "
                             f"{', '.join(listed) or 'none'}); tpu-info -L lists them")
        if not (all_chips or chip.usable):
            raise ValueError(f"{flag} {i}: {name} is on this host's PCI bus but not usable here; "
                             "add --all to show it")
        picked.add(name)
    return frozenset(picked)
