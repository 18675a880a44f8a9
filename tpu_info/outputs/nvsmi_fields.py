"""nvidia-smi's CSV spellings on ``--query``'s fields: ``--query-gpu=FIELDS``
(a row per device) and ``--query-compute-apps=FIELDS`` (a row per process on
a device), with nvidia-smi's field names.

A name nvidia-smi knows that has a meaning here is one of
:data:`tpu_info.outputs.query.FIELDS` (:data:`GPU`, :data:`APPS`: ``index``
is the device's number as ``-i`` and ``-L`` take it, ``memory.used`` is HBM
in use, ``used_memory`` a process's HBM on that chip, ...); the header echoes
the names as written, as nvidia-smi's does. A name nvidia-smi knows that has
no meaning on a TPU here (``temperature.gpu``, ``power.draw``, ``uuid``) is
accepted and printed as ``[N/A]`` (nvidia-smi's word for a value a device does
not have), so a script's columns stay where it expects them; the command says
so in one line on stderr (:func:`unsupported_line`). Any other name is a
usage error, as ``--query``'s are. Our own field names work in every spelling.

Example:
    >>> q = parse_fields("index,memory.used,temperature.gpu", "--query-gpu")
    >>> [f.name for f in q.fields], [f.unit for f in q.fields], q.per
    (['index', 'memory.used', 'temperature.gpu'], ['', 'MiB', ''], 'device')
    >>> q.fields[0].help[:22]
    "the device's number, a"
    >>> unsupported_line(q)[:60]
    '--query-gpu prints [N/A] for nvidia-smi fields with no meani'
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpu_info.contract.safe import clean
from tpu_info.outputs.query import _BY_NAME, FIELDS, Field

# nvidia-smi --query-gpu names -> ours.
GPU = {"index": "id", "name": "name", "gpu_name": "name", "pci.bus_id": "pci_bus_id",
       "gpu_bus_id": "pci_bus_id", "memory.used": "hbm_used", "memory.total": "hbm_total",
       "memory.free": "hbm_free", "utilization.gpu": "duty_cycle", "timestamp": "timestamp",
       "count": "count"}
# nvidia-smi --query-compute-apps names -> ours (its "name" is the process's).
APPS = {"pid": "pid", "process_name": "process", "name": "process", "used_memory": "process_hbm",
        "used_gpu_memory": "process_hbm", "gpu_name": "name", "gpu_bus_id": "pci_bus_id",
        "timestamp": "timestamp"}
WHOLE = {"utilization.gpu"}  # nvidia-smi prints a whole percent

_SENSORS = "a GPU's sensor, clock or setting: none is read on a TPU"
_ID = "no UUID or serial number is read for a TPU chip: -L names each by index and PCI address"
# nvidia-smi's names with no meaning here, and why.
NO_MEANING = {
    **dict.fromkeys(("uuid", "gpu_uuid", "serial", "gpu_serial"), _ID),
    "driver_version": "no NVIDIA driver here (libtpu's version: tpu-info -v)",
    "utilization.memory": "the memory bus's busy %, which only libtpu serves "
                          "(tpu-info --metric runtime_hbm_utilization; HBM in use: memory.used)",
    "memory.reserved": "not read (memory.total is what the runtime can use)",
    **dict.fromkeys(("pstate", "display_mode", "display_active", "persistence_mode",
                     "addressing_mode", "compute_mode", "compute_cap", "vbios_version",
                     "pci.domain", "pci.bus", "pci.device", "pci.device_id",
                     "pci.sub_device_id", "gpu_instance_id", "compute_instance_id",
                     "vgpu_driver_capability.heterogenous_multivgpu"), _SENSORS),
}
# Families of nvidia-smi names (the part before the first dot), none with a meaning here.
NO_MEANING_FAMILIES = ("temperature", "power", "enforced", "fan", "clocks",
                       "clocks_throttle_reasons", "clocks_event_reasons", "ecc",
                       "retired_pages", "remapped_rows", "encoder", "inforom", "pcie", "gom",
                       "mig", "fabric", "accounting", "driver_model", "protected_memory",
                       "vgpu_device_capability", "reset_status", "gsp")

ROWS = {"--query": None, "--query-gpu": "device", "--query-compute-apps": "app"}


@dataclass(frozen=True)
class Query:
    """The fields of one CSV spelling, the rows they make (``per``, as
    :func:`tpu_info.outputs.query.rows` takes it) and the nvidia-smi names
    with no meaning here, with why (``(name, why)``)."""

    flag: str
    fields: list[Field]
    per: str | None
    unsupported: tuple[tuple[str, str], ...] = ()


def no_meaning(name: str) -> str | None:
    """Why nvidia-smi's ``name`` has no meaning here; None when it is not one of those."""
    key = name.lower()
    if key in NO_MEANING:
        return NO_MEANING[key]
    if "." in key and key.split(".", 1)[0] in NO_MEANING_FAMILIES:
        return _SENSORS
    return None


def parse_fields(text: str, flag: str = "--query") -> Query:
    """``flag``'s comma-separated ``text`` -> its :class:`Query`.

    Raises:
        ValueError: an empty or unknown field name (one line).
    """
    names = [n.strip() for n in text.split(",")]
    ours = {"--query-gpu": GPU, "--query-compute-apps": APPS}.get(flag, {})
    per = ROWS[flag]
    fields, unsupported = [], []
    for name in names:
        mapped = ours.get(name) or ours.get(name.lower())
        field = _BY_NAME.get(mapped or name)
        if field is not None:
            if flag != "--query":  # the header says what was asked, as nvidia-smi's does
                field = replace(field, name=name, digits=0 if name in WHOLE else field.digits)
            fields.append(field)
        elif name and (why := no_meaning(name)) is not None:
            fields.append(Field(name, "device" if per == "device" else "look", "",
                                f"nvidia-smi's; no meaning here: {why}", lambda r: None))
            unsupported.append((name, why))
        else:
            more = ("ours and nvidia-smi's: tpu-info --help-query" if flag != "--query" else
                    f"fields: {', '.join(f.name for f in FIELDS)} (see --help-query)")
            raise ValueError(f"{flag}: unknown field {clean(name or text)!r}; {more}")
    return Query(flag, fields, per, tuple(dict.fromkeys(unsupported)))


def unsupported_line(q: Query) -> str:
    """One line naming the fields printed as ``[N/A]`` for having no meaning
    here, and why ("" when there are none)."""
    if not q.unsupported:
        return ""
    by_why: dict[str, list[str]] = {}
    for name, why in q.unsupported:
        by_why.setdefault(why, []).append(name)
    return (f"{q.flag} prints [N/A] for nvidia-smi fields with no meaning here: "
            + "; ".join(f"{', '.join(names)} ({why})" for why, names in by_why.items()))


def help_text() -> str:
    """nvidia-smi's names, for ``--help-query`` (after ours)."""
    from textwrap import wrap

    def para(head: str, text: str, indent: int = 4) -> list[str]:
        return wrap(text, 96, initial_indent=head, subsequent_indent=" " * indent)

    def pairs(table: dict[str, str]) -> str:
        return ", ".join(k if k == v else f"{k}={v}" for k, v in table.items())

    return "\n".join([
        "", "nvidia-smi's spellings (the header echoes the names as written; ours work too):",
        *para("  --query-gpu=FIELDS: a row per device: ", pairs(GPU)),
        *para("  --query-compute-apps=FIELDS: a row per process on a device: ", pairs(APPS)),
        "  nvidia-smi names with no meaning here print [N/A] (one line on stderr says so):",
        *para("    ", ", ".join(sorted(NO_MEANING))),
        *para("    ", ", ".join(f"{f}.*" for f in NO_MEANING_FAMILIES)), ""])
