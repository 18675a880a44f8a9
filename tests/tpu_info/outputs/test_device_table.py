"""The device table on the TPU machine as it is: one of four chips usable (the
fourth PCI function, JAX's TPU_0), no TCP (libtpu's service unreachable), a
hooked JAX program holding the chip. The table lists that chip with the
program's HBM and the runtime's total, names its owner, counts the others."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.fixtures.snapshots import header
from tests.tpu_info.host.test_sandbox_host import sandbox
from tpu_info.commands.args import build_parser
from tpu_info.contract.model import DeviceRecord, MemoryReading, ProcessRecord, Snapshot
from tpu_info.outputs.jsonview import to_json
from tpu_info.outputs.render import reasons, render_text
from tpu_info.views.derived import readings
from tpu_info.views.values import TargetView

LIMIT = 16_909_336_064  # JAX's memory_stats()['bytes_limit'] on the v5e: 15.75 GiB
USED = 134_800_000
NO_LIBTPU = TargetView("localhost:8431", error="cannot connect (no TCP here)", source="libtpu")
HOLDS = {4242: ["DEV/vfio/vfio", "DEV/vfio/0"]}
WHO = {4242: ("python3", os.getuid(), ["python3", "train.py"]),
       777: ("python3", os.getuid(), ["python3", "plain.py", "--lr", "3"])}


def hooked(pid: int = 4242, busy: float | None = 42.0) -> TargetView:
    s = Snapshot(
        taken_at_unix=0.0, uptime_seconds=60.0,
        process=ProcessRecord(pid=pid, name="train.py", host="tpu-vm-1", user="alice",
                              engine="jax", versions={"jax": "0.10.2"}),
        devices=(DeviceRecord(id=0, kind="TPU v5 lite", platform="tpu",
                              memory=MemoryReading(USED, USED, LIMIT, "memory_stats"),
                              busy_percent=busy, busy_reason="" if busy else "none counted yet"),))
    return TargetView("unix:/run/tpu-info/4242.sock", s)


def _flat(out: str) -> str:
    return " ".join(out.split())


def _chip_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"tpu\d", line)]


def test_one_chip_listed_and_the_others_counted(tmp_path: Path):
    scan, dev = sandbox(tmp_path, HOLDS, WHO)
    out = render_text([NO_LIBTPU, hooked()], 120, local=scan, header=header())
    (row,) = _chip_rows(out)
    assert row.startswith("tpu3")
    assert "accelerator TPU v5e x1" in out
    assert (f"3 more TPU chips on this host are not usable here (no {dev}/vfio/2, "
            f"{dev}/vfio/1, {dev}/vfio/3); --all lists them") in _flat(out)
    everything = render_text([NO_LIBTPU, hooked()], 120, local=scan, header=header(),
                             all_chips=True)
    assert [r[:4] for r in _chip_rows(everything)] == ["tpu0", "tpu1", "tpu2", "tpu3"]
    assert "--all lists" not in everything


def test_hbm_comes_from_the_owners_hook_with_the_runtimes_total(tmp_path: Path):
    scan, _ = sandbox(tmp_path, HOLDS, WHO)
    out = render_text([NO_LIBTPU, hooked()], 120, local=scan, header=header())
    (row,) = _chip_rows(out)
    # JAX's TPU_0 is chip tpu3 (joined by owner, not by index); 15.75 GiB, not 16.00.
    assert "0.13 GiB / 15.75 GiB" in row and "~42%" in row and "4242 train.py" in row
    assert "tpu:0" not in out  # the process's device is that chip: not listed again
    assert "HBM of tpu3: from pid 4242's hook" in _flat(out)
    assert "~ busy %: the hook's estimate, not libtpu's duty cycle" in _flat(out)
    assert "come from the hooks of the programs that hold the chips" in _flat(out)
    doc = to_json([NO_LIBTPU, hooked()], local=scan, header=header())
    chips = {c["name"]: c for c in doc["chips"]}
    assert [c["usable"] for c in doc["chips"]] == [False, False, False, True]
    assert chips["tpu3"]["hbm_used_bytes"] == USED and chips["tpu3"]["hbm_total_bytes"] == LIMIT
    assert (chips["tpu3"]["hbm_source"], chips["tpu3"]["busy_source"]) == ("hook", "estimate")
    assert chips["tpu3"]["owners"][0]["command"] == "python3 train.py"
    json.dumps(doc)


def test_no_busy_estimate_says_why(tmp_path: Path):
    scan, _ = sandbox(tmp_path, HOLDS, WHO)
    run = readings([NO_LIBTPU, hooked(busy=None)], local=scan, header=header())
    (chip,) = run.chips
    assert chip.busy.value is None and "none counted yet" in chip.busy.reason


def test_an_owner_without_the_hook_is_named(tmp_path: Path):
    scan, _ = sandbox(tmp_path, {777: ["DEV/vfio/0"]}, WHO)
    out = render_text([NO_LIBTPU], 160, local=scan, header=header())
    (row,) = _chip_rows(out)
    assert "777 plain.py" in row and "N/A / 16.00 GiB" in row
    proc = re.search(r"^ *777 +python3 plain\.py --lr 3 +\S+ +not hooked +- .* tpu3$", out,
                     re.M)
    assert proc, out
    why = dict(reasons([NO_LIBTPU], local=scan, header=header()))
    assert "pid 777 (plain.py) holds the chip without the hook" in why["devices/tpu3/hbm_used"]
    assert "HBM total of tpu3: the v5e's nominal size" in _flat(out)


def test_a_hooked_process_on_another_host_is_not_joined(tmp_path: Path):
    scan, _ = sandbox(tmp_path, HOLDS, WHO)
    far = hooked()
    far = TargetView("10.0.0.9:8431", Snapshot(
        0.0, process=ProcessRecord(4242, "train.py", host="elsewhere"),
        devices=far.snapshot.devices))
    run = readings([NO_LIBTPU, far], local=scan, header=header())
    (chip,) = run.chips
    assert chip.hbm_used.value is None and chip.hbm_total.value == 16 * 2**30
    assert [d.label for t in run.targets for d in t.devices] == ["tpu:0"]


def test_the_all_flag():
    assert build_parser().parse_args(["--all"]).all_chips is True
    assert build_parser().parse_args([]).all_chips is False
