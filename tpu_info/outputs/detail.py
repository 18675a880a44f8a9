"""``tpu-info -q``: every detail of each device, as ``nvidia-smi -q`` prints
it: a block per device, one ``key : value`` a line, grouped by indentation.

The devices are those the Devices table lists (the usable chips, every chip
with ``--all``, those ``-i`` names; then each process's devices that no chip
row shows), each with the processes that hold it (``--pid``/``--user`` keep
some). Values are the tables' (:mod:`tpu_info.views.derived`); one that
could not be read is ``N/A`` and ``tpu-info doctor`` says why. Plain text,
no colour, no console: it is written as the CSV and the JSON are.

Example:
    >>> from tpu_info.views.derived import readings
    >>> from tpu_info.views.values import Header
    >>> text = detail_text(readings([], header=Header(host="h", time_unix=0.0)))
    >>> print(text.splitlines()[7])
    Attached Devices                          : 0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tpu_info.views.chips import BUSY_ESTIMATE, ChipUsage
from tpu_info.views.derived import Derived, DeviceRow, ProcessRow, RunReadings
from tpu_info.views.values import clean

KEY = 42  # where the colon stands, as in nvidia-smi -q
MIB = float(1 << 20)
HBM_SOURCES = {"libtpu": "libtpu's service", "hook": "the hook of the program that holds it",
               "nvml": "NVML", "spec": "the generation's nominal size (no use read)"}
BUSY_SOURCES = {"libtpu": "libtpu's duty cycle", "nvml": "NVML",
                BUSY_ESTIMATE: "the hook's estimate from its timing of device work"}


def _kv(depth: int, key: str, value: object) -> str:
    return f"{'    ' * depth}{key}".ljust(KEY) + f": {value}"


def _text(d: Derived[Any], fmt: Callable[[Any], str] = str) -> str:
    """The value, ``N/A`` (not read) or ``None`` (does not apply)."""
    if d.value is not None:
        return clean(fmt(d.value))
    return "N/A" if d.reason else "None"


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def _memory(d: DeviceRow) -> list[str]:
    used, total = d.hbm_used.value, d.hbm_total.value
    free = "N/A" if used is None or total is None else _mib(max(0, total - used))
    return ["    HBM Memory Usage", _kv(2, "Total", _text(d.hbm_total, _mib)),
            _kv(2, "Used", _text(d.hbm_used, _mib)), _kv(2, "Free", free),
            _kv(2, "Source", HBM_SOURCES.get(d.hbm_source, d.hbm_source) or "N/A")]


def _utilization(d: DeviceRow, source: str) -> list[str]:
    return ["    Utilization", _kv(2, "Busy", _text(d.busy, lambda p: f"{p:.1f} %")),
            _kv(2, "Source", BUSY_SOURCES.get(source, source) or "N/A")]


def _process(p: ProcessRow, device: DeviceRow) -> list[str]:
    alone = device.pids.value == str(p.pid.value)
    used = (_text(device.hbm_used, _mib) if alone else
            "N/A (the chip is shared)" if device.pids.value else _text(p.hbm_used_bytes, _mib))
    lines = [_kv(2, "Process ID", _text(p.pid)), _kv(3, "Name", _text(p.name)),
             _kv(3, "User", _text(p.user)), _kv(3, "Engine", _text(p.engine))]
    if p.target != "-":
        lines.append(_kv(3, "Address", clean(p.target)))
    return lines + [_kv(3, "Used HBM", used)]


def _processes(device: DeviceRow, procs: Sequence[ProcessRow]) -> list[str]:
    if not procs:
        return [_kv(1, "Processes", "None")]
    return ["    Processes", *(line for p in procs for line in _process(p, device))]


def _chip(u: ChipUsage, d: DeviceRow, procs: Sequence[ProcessRow]) -> list[str]:
    c = u.chip
    return [
        f"{c.name[:3].upper()} {c.index}",
        _kv(1, "Name", c.name),
        _kv(1, "Product Name", clean(d.kind)),
        _kv(1, "Index", c.index),
        _kv(1, "Usable Here", "Yes" if c.usable else "No (its device node is missing here)"),
        _kv(1, "Device Node", _text(d.path)),
        "    PCI", _kv(2, "Bus Id", clean(c.pci_address) or "N/A"),
        _kv(1, "Cores per Chip", "N/A" if c.cores_per_chip is None else c.cores_per_chip),
        _kv(1, "Devices per Chip", "N/A" if c.devices_per_chip is None else c.devices_per_chip),
        *_memory(d), *_utilization(d, u.busy_source),
        *_processes(d, [p for p in procs if p.pid.value in c.owner_pids]),
    ]


def _process_device(d: DeviceRow, p: ProcessRow | None) -> list[str]:
    who = p.pid.value if p is not None and p.pid.value is not None else None
    return [
        f"Device {clean(d.label)}" + (f" of pid {who}" if who is not None else ""),
        _kv(1, "Product Name", clean(d.kind) or "N/A"),
        _kv(1, "Index", "N/A" if d.number is None else d.number),
        _kv(1, "Read At", _text(d.path)),
        *_memory(d), *_utilization(d, BUSY_ESTIMATE if d.busy_estimated else
                                   "libtpu" if d.busy.value is not None else ""),
        *_processes(d, [p] if p is not None and who is not None else []),
    ]


def detail_text(run: RunReadings) -> str:
    """The ``-q`` text of one look (``run``: the readings the tables show)."""
    h = run.header
    usage = {u.chip.name: u for u in run.usage}
    blocks = [_chip(usage[d.label], d, run.processes) for d in run.chips if d.label in usage]
    blocks += [_process_device(d, t.process) for t in run.targets for d in t.devices]
    lines = ["==============tpu-info -q==============", "",
             _kv(0, "Timestamp", h.time_text()), _kv(0, "Host", clean(h.host)),
             _kv(0, "tpu-info Version", clean(h.version)),
             _kv(0, "libtpu Version", _text(run.libtpu_version)),
             _kv(0, "Accelerator Type", _text(run.accelerator)),
             _kv(0, "Attached Devices", len(blocks))]
    if not blocks:
        lines.append(_kv(0, "No Devices", clean(run.no_devices) or "none listed"))
    lines += [_kv(0, "Note", clean(n)) for n in run.device_notes]
    for block in blocks:
        lines += ["", *block]
    if any(x.value is None and x.reason for d in (*run.chips, *(d for t in run.targets
                                                               for d in t.devices))
           for x in (d.hbm_used, d.hbm_total, d.busy, d.path)):
        lines += ["", "(N/A: tpu-info doctor says why)"]
    return "\n".join(lines) + "\n"
