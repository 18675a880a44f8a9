"""The host scan on the TPU machine as it is (a v5e host in a gVisor sandbox):
four PCI functions, iommu groups 2, 1, 3, 0, and only /dev/vfio/0 passed
through, so one chip is usable: the fourth by PCI address."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from tests.fixtures.sysfs_trees import MACHINES, SANDBOX_DEV, build_dev, build_proc, build_sysfs
from tpu_info.host.devices import accelerator_type, scan_local
from tpu_info.host.processes import describe, short_name

ME = pwd.getpwuid(os.getuid()).pw_name


def sandbox(tmp_path: Path, fds: dict[int, list[str]] | None = None,
            who: dict[int, tuple[str, int, list[str]]] | None = None):
    sys_root = build_sysfs(tmp_path, MACHINES["v5e_sandbox"])
    dev = build_dev(tmp_path, SANDBOX_DEV)
    fds = {p: [t.replace("DEV", str(dev)) for t in ts] for p, ts in (fds or {}).items()}
    proc = build_proc(tmp_path, fds, who)
    return scan_local(str(sys_root), str(proc), str(dev), nvml_loader=None), dev


def test_one_chip_is_usable_the_fourth(tmp_path: Path):
    scan, dev = sandbox(tmp_path)
    assert [c.pci_address for c in scan.tpus] == [f"0000:00:{b:02x}.0" for b in (8, 9, 10, 11)]
    assert [c.device_path for c in scan.tpus] == [f"{dev}/vfio/{g}" for g in (2, 1, 3, 0)]
    assert [c.usable for c in scan.tpus] == [False, False, False, True]
    assert "does not exist" in scan.tpus[0].reasons["device_path"]
    assert "device_path" not in scan.tpus[3].reasons
    assert accelerator_type(scan) == "TPU v5e x1"


def test_owners_are_named_from_proc(tmp_path: Path):
    scan, _ = sandbox(tmp_path, {4242: ["DEV/vfio/vfio", "DEV/vfio/0"]},
                      {4242: ("python3", os.getuid(), ["python3", "train.py", "--steps", "9"])})
    assert scan.tpus[3].owner_pids == (4242,)
    (o,) = scan.owners
    assert (o.pid, o.name, o.user, o.command) == (4242, "train.py", ME,
                                                 "python3 train.py --steps 9")


def test_no_chip_usable_says_so(tmp_path: Path):
    sys_root = build_sysfs(tmp_path, MACHINES["v5e_sandbox"])
    scan = scan_local(str(sys_root), str(tmp_path / "proc"), str(tmp_path / "nodev"),
                      nvml_loader=None)
    assert accelerator_type(scan) == "TPU v5e x4 (none usable here)"


def test_describe_what_proc_hides(tmp_path: Path):
    proc = build_proc(tmp_path, {}, {5: ("python3", 654321, [])})
    o = describe(5, str(proc))
    assert (o.name, o.user, o.command) == ("python3", "654321", "")  # uid without a name
    assert describe(6, str(proc)).name == ""  # exited


@pytest.mark.parametrize(("argv", "comm", "name"), [
    (["/root/.pyenv/versions/3.11/bin/python3", "-c", "import jax"], "python3", "python3 -c"),
    (["python3", "-u", "/home/me/train.py", "--lr", "1e-3"], "python3", "train.py"),
    (["python", "-m", "trainer.main"], "python", "-m trainer.main"),
    (["/usr/bin/java", "-jar", "x.jar"], "java", "java"),
    ([], "kworker", "kworker"),
])
def test_an_owner_is_named_by_its_program(argv: list[str], comm: str, name: str) -> None:
    # The plain owner on the TPU machine read '/root/.…' (its interpreter's
    # full path cut to the column) where Google's -p says python3.
    assert short_name(argv, comm) == name
