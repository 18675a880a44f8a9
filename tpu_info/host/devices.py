"""Local accelerators: TPU chips from sysfs, NVIDIA GPUs from NVML, owners from /proc.

Every outside path is an argument with the real default (``/sys``,
``/proc``, ``/dev``), so tests point them at fixture trees. Nothing raises
for a machine that lacks something: what could not be read becomes a reason
in :attr:`LocalScan.reasons <tpu_info.contract.model.LocalScan.reasons>` or
:attr:`ChipRecord.reasons <tpu_info.contract.model.ChipRecord.reasons>`, which
``tpu-info doctor`` prints and the tables show beside "N/A".

How TPU chips are found (as Google's ``tpu-info`` does): each
``/sys/bus/pci/devices/*`` whose ``vendor`` is ``0x1ae0`` (Google) and whose
``device`` id names a generation is one chip. From v5e on a chip is opened
through ``/dev/vfio/<iommu group>``; before, through ``/dev/accelN``. A
chip whose node does not exist here is on the host but not usable by this
host's programs (a sandbox passes through one of the host's four chips):
:attr:`ChipRecord.usable <tpu_info.contract.model.ChipRecord.usable>` is
False. A process owns a chip when one of its ``/proc/<pid>/fd/*`` links
points there; :attr:`LocalScan.owners` names each owner (name, user, command).

Example:
    >>> scan = scan_local(sysfs_root="/nonexistent", nvml_loader=None)
    >>> scan.chips
    ()
    >>> sorted(scan.reasons)
    ['gpu', 'tpu']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from tpu_info.contract.model import ChipRecord, LocalScan
from tpu_info.host.processes import describe_all

SYSFS_ROOT = "/sys"
PROC_ROOT = "/proc"
DEV_ROOT = "/dev"

GOOGLE_PCI_VENDOR = "0x1ae0"
GIB = 2**30


@dataclass(frozen=True, slots=True)
class TpuGeneration:
    """What a TPU generation is, as far as the host can tell without libtpu.

    ``hbm_bytes`` is per chip (v2 and v3 chips hold two TensorCores with half
    each); ``devices_per_chip`` is how many devices JAX shows per chip
    (megacore generations fuse their two TensorCores into one).
    """

    name: str
    pci_device: str
    hbm_bytes: int
    cores_per_chip: int
    devices_per_chip: int
    vfio: bool


V2 = TpuGeneration("v2", "0x0027", 16 * GIB, 2, 2, vfio=False)
V3 = TpuGeneration("v3", "0x0027", 32 * GIB, 2, 2, vfio=False)
V4 = TpuGeneration("v4", "0x005e", 32 * GIB, 2, 1, vfio=False)
V5E = TpuGeneration("v5e", "0x0063", 16 * GIB, 1, 1, vfio=True)
V5P = TpuGeneration("v5p", "0x0062", 95 * GIB, 2, 1, vfio=True)
V6E = TpuGeneration("v6e", "0x006f", 32 * GIB, 1, 1, vfio=True)
V7X = TpuGeneration("7x", "0x0076", 192 * GIB, 2, 2, vfio=True)

GENERATIONS: tuple[TpuGeneration, ...] = (V2, V3, V4, V5E, V5P, V6E, V7X)
_BY_DEVICE_ID = {g.pci_device: g for g in GENERATIONS if g.pci_device != "0x0027"}
# v2 and v3 share device id 0x0027; the PCI subsystem id tells them apart.
_V2_V3_BY_SUBSYSTEM = {"0x004e": V2, "0x004f": V3}


def generation_for(device_id: str, subsystem_id: str = "") -> TpuGeneration | None:
    """The TPU generation of a Google PCI device, or None if it is not a TPU.

    >>> generation_for("0x0063").name
    'v5e'
    >>> generation_for("0x0027", "0x004f").name
    'v3'
    """
    device_id = device_id.strip().lower()
    if device_id == "0x0027":
        return _V2_V3_BY_SUBSYSTEM.get(subsystem_id.strip().lower())
    return _BY_DEVICE_ID.get(device_id)


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def _chip_path(pci_dir: str, gen: TpuGeneration, index: int,
               dev_root: str) -> tuple[str, str | None]:
    """The chip's device node, and a reason when it had to be guessed."""
    if gen.vfio:
        try:
            group = os.path.basename(os.readlink(os.path.join(pci_dir, "iommu_group")))
            return os.path.join(dev_root, "vfio", group), None
        except OSError:
            return (os.path.join(dev_root, "vfio", str(index)),
                    "no iommu_group link in sysfs; assumed the chip's index")
    try:
        accel = sorted(n for n in os.listdir(os.path.join(pci_dir, "accel"))
                       if n.startswith("accel"))
    except OSError:
        accel = []
    if accel:
        return os.path.join(dev_root, accel[0]), None
    return (os.path.join(dev_root, f"accel{index}"),
            "no accel class entry in sysfs; assumed the chip's index")


def find_tpu_chips(sysfs_root: str = SYSFS_ROOT,
                   dev_root: str = DEV_ROOT) -> tuple[list[ChipRecord], str | None]:
    """TPU chips on the PCI bus, in PCI address order, without owners.

    Returns:
        The chips, and a reason when there are none (for ``doctor``).
    """
    pci_root = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(pci_root))
    except OSError as e:
        return [], f"cannot list {pci_root} ({e.strerror or e}); not a Linux PCI host?"
    found: list[tuple[str, str, TpuGeneration]] = []
    unknown: list[str] = []
    for addr in addresses:
        pci_dir = os.path.join(pci_root, addr)
        try:
            if _read(os.path.join(pci_dir, "vendor")).lower() != GOOGLE_PCI_VENDOR:
                continue
            device_id = _read(os.path.join(pci_dir, "device"))
        except OSError:
            continue
        try:
            subsystem = _read(os.path.join(pci_dir, "subsystem_device"))
        except OSError:
            subsystem = ""
        gen = generation_for(device_id, subsystem)
        if gen is None:
            unknown.append(f"{addr} ({device_id})")
            continue
        found.append((addr, pci_dir, gen))
    chips: list[ChipRecord] = []
    for index, (addr, pci_dir, gen) in enumerate(found):
        path, guessed = _chip_path(pci_dir, gen, index, dev_root)
        reasons = {"hbm_used_bytes": "HBM use comes from libtpu or the process's hook, "
                                     "not from sysfs",
                   "busy_percent": "busy % comes from libtpu's duty-cycle gauge, "
                                   "not from sysfs"}
        usable = os.path.exists(path)
        if guessed:
            reasons["device_path"] = guessed
        elif not usable:
            reasons["device_path"] = (f"{path} does not exist: the chip is on this host's PCI "
                                      "bus but not usable here (not passed through, or the "
                                      "TPU driver is not loaded)")
        chips.append(ChipRecord(
            index=index, vendor="tpu", kind=gen.name, device_path=path, pci_address=addr,
            hbm_total_bytes=gen.hbm_bytes, cores_per_chip=gen.cores_per_chip,
            devices_per_chip=gen.devices_per_chip, reasons=reasons, usable=usable,
        ))
    if chips:
        return chips, None
    if unknown:
        return [], ("Google PCI devices of unknown generation: " + ", ".join(unknown)
                    + "; this tpu-info may be too old for them")
    return [], f"no TPU chips found (no PCI device with vendor {GOOGLE_PCI_VENDOR} in {pci_root})"


@dataclass(frozen=True, slots=True)
class OwnerScan:
    """Which processes hold which device nodes open.

    ``unreadable`` counts processes whose open files could not be listed
    (another user's, without root); ``reason`` explains it when nonzero.
    """

    owners: Mapping[str, tuple[int, ...]]
    scanned: int = 0
    unreadable: int = 0
    reason: str | None = None


def find_owners(paths: Iterable[str], proc_root: str = PROC_ROOT,
                listdir: Callable[[str], list[str]] = os.listdir) -> OwnerScan:
    """Pids whose ``/proc/<pid>/fd/*`` links point to one of ``paths``.

    Links are read with :func:`os.readlink`, so targets need not exist here.
    Permission errors are counted, never raised.

    Args:
        paths: device nodes to look for, as the kernel names them.
        proc_root: where ``/proc`` is.
        listdir: how a directory is listed (tests inject permission errors,
            which root never sees).
    """
    wanted = set(paths)
    if not wanted:
        return OwnerScan(owners={})
    try:
        pids = sorted(int(n) for n in listdir(proc_root) if n.isdigit())
    except OSError as e:
        return OwnerScan(owners={}, reason=f"cannot list {proc_root} ({e.strerror or e}); "
                                           "chip owners are unknown")
    owners: dict[str, set[int]] = {}
    scanned = unreadable = 0
    for pid in pids:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = listdir(fd_dir)
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # the process exited, or is a kernel thread
            continue
        scanned += 1
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(target, set()).add(pid)
    reason = None
    if unreadable:
        reason = (f"no permission to read the open files of {unreadable} of "
                  f"{scanned + unreadable} processes in {proc_root}; run as root (sudo) "
                  "to see every chip owner")
    return OwnerScan(owners={k: tuple(sorted(v)) for k, v in owners.items()},
                     scanned=scanned, unreadable=unreadable, reason=reason)


def _import_pynvml() -> ModuleType:
    import pynvml  # nvidia-ml-py; optional

    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def find_gpus(nvml_loader: Callable[[], Any] | None = _import_pynvml,
              dev_root: str = DEV_ROOT) -> tuple[list[ChipRecord], str | None]:
    """NVIDIA GPUs through NVML, when ``pynvml`` imports and a driver answers.

    Args:
        nvml_loader: returns the ``pynvml`` module (tests pass a fake); None
            skips NVML.
        dev_root: where ``nvidiaN`` nodes live.

    Returns:
        The GPUs, and a reason when there are none.
    """
    if nvml_loader is None:
        return [], "NVML lookup disabled"
    try:
        nvml = nvml_loader()
    except ImportError:
        return [], "NVML not available (pip install nvidia-ml-py to see NVIDIA GPUs)"
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_* of an optional library
        why = _text(e) or type(e).__name__
        return [], f"NVML present but the NVIDIA driver did not answer ({why})"
    try:
        return _read_gpus(nvml, dev_root)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _nvml_call(reasons: dict[str, str], field: str, fn: Callable[..., Any], *args: Any,
               default: Any = None) -> Any:
    """``fn(*args)``, or ``default`` with the NVML error kept as ``field``'s reason."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - NVMLError_* of an optional library
        reasons[field] = f"NVML: {_text(e) or type(e).__name__}"
        return default


def _read_gpus(nvml: Any, dev_root: str) -> tuple[list[ChipRecord], str | None]:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as e:  # noqa: BLE001
        return [], f"NVML could not count devices ({_text(e)})"
    if count == 0:
        return [], "NVML found no NVIDIA GPUs"
    gpus = []
    for i in range(count):
        reasons: dict[str, str] = {}
        h = _nvml_call(reasons, "device", nvml.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        name = _text(_nvml_call(reasons, "kind", nvml.nvmlDeviceGetName, h,
                                default="NVIDIA GPU"))
        mem = _nvml_call(reasons, "hbm_used_bytes", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is None:
            reasons.setdefault("hbm_total_bytes", reasons["hbm_used_bytes"])
        util = _nvml_call(reasons, "busy_percent", nvml.nvmlDeviceGetUtilizationRates, h)
        pci = _nvml_call(reasons, "pci_address", nvml.nvmlDeviceGetPciInfo, h)
        minor = _nvml_call(reasons, "device_path", nvml.nvmlDeviceGetMinorNumber, h)
        procs = _nvml_call(reasons, "owner_pids", nvml.nvmlDeviceGetComputeRunningProcesses, h,
                           default=[])
        gpus.append(ChipRecord(
            index=i, vendor="nvidia", kind=name,
            device_path=None if minor is None else os.path.join(dev_root, f"nvidia{int(minor)}"),
            pci_address="" if pci is None else _text(pci.busId),
            hbm_total_bytes=None if mem is None else int(mem.total),
            hbm_used_bytes=None if mem is None else int(mem.used),
            busy_percent=None if util is None else float(util.gpu),
            owner_pids=tuple(sorted({int(p.pid) for p in procs})),
            reasons=reasons,
        ))
    return gpus, None


def _with_owners(chip: ChipRecord, owners: OwnerScan) -> ChipRecord:
    pids = owners.owners.get(chip.device_path or "", ())
    reasons = dict(chip.reasons)
    if owners.reason and owners.unreadable == 0:
        reasons["owner_pids"] = owners.reason
    elif owners.reason:
        reasons["owner_pids"] = (("may be incomplete: " if pids else "none found, but ")
                                 + owners.reason)
    return replace(chip, owner_pids=pids, reasons=reasons)


def scan_local(
    sysfs_root: str = SYSFS_ROOT,
    proc_root: str = PROC_ROOT,
    dev_root: str = DEV_ROOT,
    nvml_loader: Callable[[], Any] | None = _import_pynvml,
    listdir: Callable[[str], list[str]] = os.listdir,
) -> LocalScan:
    """Every local accelerator with its owners, and why anything is missing.

    ``reasons`` keys: ``tpu`` (no chips), ``gpu`` (no NVML or no GPUs),
    ``owners`` (could not read every process's open files).
    """
    reasons: dict[str, str] = {}
    tpus, why = find_tpu_chips(sysfs_root, dev_root)
    if why:
        reasons["tpu"] = why
    if tpus:
        owners = find_owners((c.device_path for c in tpus if c.device_path), proc_root,
                             listdir)
        if owners.reason:
            reasons["owners"] = owners.reason
        tpus = [_with_owners(c, owners) for c in tpus]
    gpus, why = find_gpus(nvml_loader, dev_root)
    if why:
        reasons["gpu"] = why
    chips = tuple(tpus) + tuple(gpus)
    return LocalScan(chips=chips, reasons=reasons,
                     owners=describe_all((p for c in chips for p in c.owner_pids), proc_root))


def accelerator_type(scan: LocalScan) -> str | None:
    """``TPU v5e x1`` style summary of the TPU chips this host's programs can
    use (all of them, and so said, when none is usable); None without any.

    >>> accelerator_type(LocalScan())
    """
    usable = [c for c in scan.tpus if c.usable]
    chips = usable or list(scan.tpus)
    kinds = sorted({c.kind for c in chips})
    if not kinds:
        return None
    text = ", ".join(f"TPU {k} x{sum(1 for c in chips if c.kind == k)}" for k in kinds)
    return text if usable else f"{text} (none usable here)"
