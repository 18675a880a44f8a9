"""On a TPU host (issue 43): nvidia-smi's and nvitop's spellings read the
hooked JAX program on the chip: -q's block for the chip, --query-gpu's row,
--query-compute-apps' row with the program's HBM on its chip, --pid and --user.

Run with ``make test-tpu`` (one program on the chip for the module)."""

from __future__ import annotations

import csv
import getpass
import re

import pytest

from tests.tpu.conftest import ChipProgram

pytestmark = pytest.mark.tpu


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(text.splitlines(), skipinitialspace=True))


def _the_chip(chip_program: ChipProgram) -> tuple[str, str]:
    """The usable chip's number and PCI address, as -L prints them."""
    r = chip_program.tpu_info("-L")
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()  # the sandbox passes one chip through
    m = re.match(r"TPU (\d+): TPU \S+ \(.*PCI ([0-9a-f:.]+)\)$", line)
    assert m, line
    return m.group(1), m.group(2)


def test_query_gpu_is_the_chip_with_the_programs_hbm(chip_program: ChipProgram):
    index, bus = _the_chip(chip_program)
    r = chip_program.tpu_info("--query-gpu=index,name,pci.bus_id,memory.used,memory.total,"
                              "memory.free,utilization.gpu,temperature.gpu",
                              "--format=csv,noheader,nounits")
    assert r.returncode == 0, r.stderr
    (row,) = _rows(r.stdout)  # the program's TPU device is the chip's row, not its own
    assert row[:3] == [index, row[1], bus] and row[1].startswith("TPU v5"), row
    used, total, free = (int(x) for x in row[3:6])
    assert 0 < used < total and abs(free - (total - used)) <= 1, row  # MiB, rounded
    assert row[7] == "[N/A]" and "temperature.gpu" in r.stderr


def test_compute_apps_give_the_program_its_hbm_on_its_chip(chip_program: ChipProgram):
    _, bus = _the_chip(chip_program)
    r = chip_program.tpu_info("--query-compute-apps=pid,used_memory,gpu_bus_id",
                              "--format=csv,noheader", "--pid", str(chip_program.pid))
    assert r.returncode == 0, r.stderr
    (row,) = _rows(r.stdout)
    assert row[0] == str(chip_program.pid) and row[2] == bus, row
    assert re.fullmatch(r"[1-9]\d* MiB", row[1]), row  # it holds the chip alone


def test_minus_q_details_the_chip(chip_program: ChipProgram):
    index, bus = _the_chip(chip_program)
    r = chip_program.tpu_info("-q", "-i", index)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert f"\nTPU {index}\n" in text and re.search(rf"Bus Id +: {re.escape(bus)}$", text, re.M)
    assert re.search(r"^        Used +: [1-9]\d* MiB$", text, re.M), text
    assert re.search(rf"^        Process ID +: {chip_program.pid}$", text, re.M), text


def test_pid_and_user_keep_the_program(chip_program: ChipProgram):
    me = chip_program.tpu_info("-p", "--user", getpass.getuser())
    assert str(chip_program.pid) in me.stdout, me.stdout
    other = chip_program.tpu_info("-p", "--pid", "1")
    assert str(chip_program.pid) not in other.stdout
    assert "No process matches --pid 1." in other.stdout
