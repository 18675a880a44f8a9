"""nvidia-smi's -L and -i on the TPU machine's tree (one of four chips usable,
the fourth PCI function, /dev/vfio/0): -L lists it, --all every chip, -i
selects chips for the table and --json, an unknown id is one line, exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.tpu_info.host.test_sandbox_host import sandbox
from tpu_info.commands import cli
from tpu_info.commands.gather import Gathered
from tpu_info.contract.model import LocalScan
from tpu_info.host import devices


@pytest.fixture
def scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    scan, dev = sandbox(tmp_path)
    monkeypatch.setattr(devices, "scan_local", lambda *a, **k: scan)
    monkeypatch.setattr(cli, "_gather", lambda args, targets: Gathered(views=[], local=scan))
    monkeypatch.setenv("COLUMNS", "120")
    return dev


def test_minus_l_lists_the_usable_chip(scan, capsys):
    assert cli.main(["-L"]) == cli.EXIT_OK
    assert capsys.readouterr().out == f"TPU 3: TPU v5e ({scan}/vfio/0, PCI 0000:00:0b.0)\n"
    assert cli.main(["--list-gpus", "-i", "tpu3"]) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith("TPU 3: TPU v5e")


def test_minus_l_all_lists_every_chip(scan, capsys):
    assert cli.main(["-L", "--all"]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"TPU {i}: TPU v5e ({scan}/vfio/{g}, PCI 0000:00:{b:02x}.0"
                     + (", not usable here)" if i < 3 else ")")
                     for i, g, b in ((0, 2, 8), (1, 1, 9), (2, 3, 10), (3, 0, 11))]


def test_minus_l_without_a_device_says_so(monkeypatch, capsys):
    monkeypatch.setattr(devices, "scan_local", lambda *a, **k: LocalScan())
    assert cli.main(["-L"]) == cli.EXIT_PARTIAL
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("tpu-info: no accelerator found on this host "
                                         "(tpu-info doctor says why)\n")


def test_minus_i_selects_one_chip_for_the_table_and_json(scan, capsys):
    assert cli.main(["-i", "0,2", "--all"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert [r[:4] for r in out.splitlines() if re.match(r"tpu\d", r)] == ["tpu0", "tpu2"]
    assert "--all lists" not in out and "more TPU chips" not in out
    assert cli.main(["--id", "tpu3", "--json"]) == cli.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["chips"]] == ["tpu3"]


@pytest.mark.parametrize("argv, says", [
    (["-i", "7"], "-i 7: no such device here (devices: tpu3); tpu-info -L lists them"),
    (["-i", "tpu1", "--json"], "-i tpu1: tpu1 is on this host's PCI bus but not usable here; "
                               "add --all to show it"),
    (["-L", "-i", "gpu0"], "-i gpu0: no such device here (devices: tpu3)"),
    (["-i", "x"], "-i takes device ids as the Devices table names them"),
    (["-L", "--json"], "-L lists this host's devices and exits: it takes no --json"),
])
def test_an_unknown_id_is_one_line_exit_2(scan, argv, says, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and says in out.err, out.err
    assert "Traceback" not in out.err
