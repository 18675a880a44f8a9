"""Local accelerator discovery against generated sysfs, /proc and /dev trees."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.sysfs_trees import MACHINES, build_dev, build_proc, build_sysfs
from tpu_info.host import devices
from tpu_info.host.devices import (
    GIB,
    accelerator_type,
    find_gpus,
    find_owners,
    find_tpu_chips,
    generation_for,
    scan_local,
)

NO_NVML = None

EXPECTED = {  # generation: (chips, HBM GiB per chip, cores, devices per chip, first path)
    "v2": (4, 16, 2, 2, "accel0"),
    "v3": (4, 32, 2, 2, "accel0"),
    "v4": (4, 32, 2, 1, "accel0"),
    "v5e": (4, 16, 1, 1, "vfio/12"),
    "v5p": (4, 95, 2, 1, "vfio/20"),
    "v6e": (8, 32, 1, 1, "vfio/3"),
    "7x": (4, 192, 2, 2, "vfio/40"),
}


@pytest.mark.parametrize("gen", sorted(EXPECTED))
def test_each_generation(tmp_path: Path, gen: str):
    n, hbm_gib, cores, per_chip, first = EXPECTED[gen]
    sys_root = build_sysfs(tmp_path, MACHINES[gen])
    dev = str(tmp_path / "dev")
    chips, why = find_tpu_chips(str(sys_root), dev)
    assert why is None
    assert [c.kind for c in chips] == [gen] * n
    assert [c.index for c in chips] == list(range(n))
    assert chips[0].device_path == os.path.join(dev, first)
    assert all(c.vendor == "tpu" and c.name == f"tpu{c.index}" for c in chips)
    assert {c.hbm_total_bytes for c in chips} == {hbm_gib * GIB}
    assert {(c.cores_per_chip, c.devices_per_chip) for c in chips} == {(cores, per_chip)}
    # PCI address order, and never the Intel / virtio / non-TPU Google neighbours.
    assert [c.pci_address for c in chips] == sorted(c.pci_address for c in chips)
    assert "0000:00:03.0" not in {c.pci_address for c in chips}
    # Nothing under the fake /dev: the reason says so; HBM use needs libtpu.
    assert "does not exist" in chips[0].reasons["device_path"]
    assert "libtpu" in chips[0].reasons["hbm_used_bytes"]


def test_vfio_path_is_the_iommu_group_not_the_index(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v5e"])
    dev = build_dev(tmp_path, [f"vfio/{g}" for g in (12, 13, 14, 15)] + ["vfio/vfio"])
    chips, _ = find_tpu_chips(str(sys_root), str(dev))
    assert [os.path.basename(c.device_path or "") for c in chips] == ["12", "13", "14", "15"]
    assert all("device_path" not in c.reasons for c in chips)


def test_generation_ids():
    assert generation_for("0x005e").name == "v4"
    assert generation_for("0x0063").name == "v5e"
    assert generation_for("0x0062").name == "v5p"
    assert generation_for("0x006f").name == "v6e"
    assert generation_for("0x0076").name == "7x"
    assert generation_for("0x0027", "0x004e").name == "v2"
    assert generation_for("0x0027", "0x004f").name == "v3"
    assert generation_for("0x0027", "0x0000") is None
    assert generation_for("0x1234") is None
    assert generation_for(" 0x006F\n").name == "v6e"


def test_missing_links_fall_back_to_index_with_a_reason(tmp_path: Path):
    from tests.fixtures.sysfs_trees import Pci

    sys_root = build_sysfs(tmp_path, [Pci("0000:00:05.0", device="0x006f"),
                                      Pci("0000:00:06.0", device="0x005e")])
    chips, _ = find_tpu_chips(str(sys_root), "/dev")
    assert [c.device_path for c in chips] == ["/dev/vfio/0", "/dev/accel1"]
    assert "iommu_group" in chips[0].reasons["device_path"]
    assert "accel" in chips[1].reasons["device_path"]


def test_empty_machine(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["empty"])
    scan = scan_local(str(sys_root), str(tmp_path / "proc"), nvml_loader=NO_NVML)
    assert scan.chips == ()
    assert "no TPU chips found" in scan.reasons["tpu"]
    assert "owners" not in scan.reasons  # /proc is not read when there is nothing to own
    assert accelerator_type(scan) is None


def test_unknown_google_device_is_named(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["unknown"])
    chips, why = find_tpu_chips(str(sys_root))
    assert chips == [] and "0000:00:03.0 (0x0abc)" in (why or "")


def test_no_sysfs_at_all(tmp_path: Path):
    chips, why = find_tpu_chips(str(tmp_path / "nothing"))
    assert chips == [] and "cannot list" in (why or "")


def test_owners_from_proc(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v5e"])
    dev = build_dev(tmp_path, [f"vfio/{g}" for g in (12, 13, 14, 15)])
    proc = build_proc(tmp_path, {
        100: [f"{dev}/vfio/vfio", f"{dev}/vfio/12", f"{dev}/vfio/13"],
        200: [f"{dev}/vfio/14", "/tmp/log.txt"],
        300: [f"{dev}/vfio/14"],
        400: [f"{dev}/vfio/140", f"{dev}/accel0"],  # look-alikes own nothing here
    })
    scan = scan_local(str(sys_root), str(proc), str(dev), nvml_loader=NO_NVML)
    assert [c.owner_pids for c in scan.tpus] == [(100,), (100,), (200, 300), ()]
    assert "owners" not in scan.reasons
    assert all("owner_pids" not in c.reasons for c in scan.tpus)
    assert accelerator_type(scan) == "TPU v5e x4"


def test_owners_of_accel_chips(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v4"])
    proc = build_proc(tmp_path, {77: ["/dev/accel0", "/dev/accel1", "/dev/accel2",
                                      "/dev/accel3"]})
    scan = scan_local(str(sys_root), str(proc), "/dev", nvml_loader=NO_NVML)
    assert [c.owner_pids for c in scan.tpus] == [(77,)] * 4


def _denying(pids: set[int]):
    def listdir(path: str) -> list[str]:
        parts = Path(path).parts
        if parts[-1] == "fd" and int(parts[-2]) in pids:
            raise PermissionError(13, "Permission denied", path)
        return os.listdir(path)
    return listdir


def test_unreadable_fds_are_a_reason_not_an_error(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v6e"])
    proc = build_proc(tmp_path, {10: ["/dev/vfio/3"], 20: ["/dev/vfio/4"], 30: []})
    scan = scan_local(str(sys_root), str(proc), "/dev", nvml_loader=NO_NVML,
                      listdir=_denying({20, 30}))
    assert "no permission" in scan.reasons["owners"]
    assert "2 of 3 processes" in scan.reasons["owners"]
    first, second = scan.tpus[:2]
    assert first.owner_pids == (10,)
    assert first.reasons["owner_pids"].startswith("may be incomplete")
    assert second.owner_pids == ()
    assert second.reasons["owner_pids"].startswith("none found")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_fds_for_real(tmp_path: Path):
    proc = build_proc(tmp_path, {5: ["/dev/vfio/0"]})
    (proc / "5" / "fd").chmod(0)
    try:
        owners = find_owners(["/dev/vfio/0"], str(proc))
    finally:
        (proc / "5" / "fd").chmod(0o755)
    assert owners.unreadable == 1 and owners.owners == {}


def test_vanished_processes_and_missing_proc(tmp_path: Path):
    proc = build_proc(tmp_path, {5: ["/dev/vfio/0"]})
    (proc / "6").mkdir()  # a pid whose fd dir is gone (exited, kernel thread)
    owners = find_owners(["/dev/vfio/0"], str(proc))
    assert owners.owners == {"/dev/vfio/0": (5,)} and owners.reason is None
    gone = find_owners(["/dev/vfio/0"], str(tmp_path / "noproc"))
    assert gone.owners == {} and "cannot list" in (gone.reason or "")
    assert find_owners([], "/nonexistent").owners == {}


# NVML -----------------------------------------------------------------------

class FakeNvmlError(Exception):
    pass


def fake_nvml(count: int = 2, *, init_fails: bool = False, util_fails: bool = False):
    calls: list[str] = []

    def init():
        calls.append("init")
        if init_fails:
            raise FakeNvmlError("Driver Not Loaded")

    def util(h):
        if util_fails:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=37 + h, memory=5)

    mod = SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * GIB, used=(h + 1) * GIB,
                                                          free=0),
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0"),
        nvmlDeviceGetMinorNumber=lambda h: h,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=900 + h),
                                                        SimpleNamespace(pid=900 + h)],
    )
    return mod, calls


def test_nvml_gpus():
    mod, calls = fake_nvml()
    gpus, why = find_gpus(lambda: mod)
    assert why is None and calls == ["init", "shutdown"]
    assert [g.name for g in gpus] == ["gpu0", "gpu1"]
    g = gpus[1]
    assert (g.vendor, g.kind, g.device_path) == ("nvidia", "NVIDIA H100 80GB HBM3", "/dev/nvidia1")
    assert (g.hbm_total_bytes, g.hbm_used_bytes, g.busy_percent) == (80 * GIB, 2 * GIB, 38.0)
    assert g.pci_address == "00000000:19:00.0" and g.owner_pids == (901,)
    assert g.reasons == {}


def test_nvml_field_failure_is_a_reason():
    mod, _ = fake_nvml(1, util_fails=True)
    (g,), _ = find_gpus(lambda: mod)
    assert g.busy_percent is None and "Not Supported" in g.reasons["busy_percent"]


def test_nvml_absent_or_broken(tmp_path: Path):
    def missing():
        raise ImportError("No module named 'pynvml'")

    gpus, why = find_gpus(missing)
    assert gpus == [] and "nvidia-ml-py" in (why or "")
    mod, calls = fake_nvml(init_fails=True)
    gpus, why = find_gpus(lambda: mod)
    assert gpus == [] and "Driver Not Loaded" in (why or "") and "shutdown" not in calls
    mod, _ = fake_nvml(0)
    assert find_gpus(lambda: mod) == ([], "NVML found no NVIDIA GPUs")
    assert find_gpus(None)[1] == "NVML lookup disabled"


def test_real_pynvml_is_optional():
    # On this machine nvidia-ml-py is not installed: an empty list and a reason.
    gpus, why = find_gpus()
    if why is not None:
        assert gpus == []


def test_scan_combines_tpus_and_gpus(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v4"])
    proc = build_proc(tmp_path, {})
    mod, _ = fake_nvml(1)
    scan = scan_local(str(sys_root), str(proc), nvml_loader=lambda: mod)
    assert [c.name for c in scan.chips] == ["tpu0", "tpu1", "tpu2", "tpu3", "gpu0"]
    assert len(scan.tpus) == 4 and len(scan.gpus) == 1 and scan.reasons == {}


def test_no_heavy_imports():
    import sys

    assert devices.__name__ in sys.modules
    src = Path(devices.__file__).read_text()
    for banned in ("import torch", "import jax", "import metrics", "from metrics"):
        assert banned not in src
