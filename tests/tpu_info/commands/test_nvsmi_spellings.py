"""nvidia-smi's and nvitop's spellings that work (issue 43): --query-gpu and
--query-compute-apps with nvidia-smi's field names (unsupported ones [N/A],
said once on stderr), -q's detail per chip, nvitop's --only, --pid, --user
and --only-visible.

The command runs in its own process (``cli.main`` in ``python -c``) on the TPU
machine's tree (the v5e sandbox: four chips, the fourth usable at
/dev/vfio/0), which it reads instead of /sys, /proc and /dev; a real hooked
JAX program (tests/hooked.py, on the CPU) holds that chip in the fake /proc,
with a process of another uid (654321, not hooked) beside it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.fixtures.sysfs_trees import MACHINES, SANDBOX_DEV, build_dev, build_proc, build_sysfs
from tests.hooked import HookedProgram

pytestmark = pytest.mark.slow  # a hooked JAX program and the command, each in its process

# cli.main reading the fixture tree (FAKE_ROOT/{sys,proc,dev}) instead of the host's.
RUN = ("import os, sys\n"
       "from tpu_info.host import devices\n"
       "scan, root = devices.scan_local, os.environ['FAKE_ROOT']\n"
       "devices.scan_local = lambda *a, **k: scan(root + '/sys', root + '/proc', root + '/dev',"
       " nvml_loader=None)\n"
       "from tpu_info.commands import cli\n"
       "sys.exit(cli.main(sys.argv[1:]))\n")
OTHER = 4242  # not hooked, uid 654321, holds tpu3 too


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host")
    runtime = tmp / "rt"
    runtime.mkdir(mode=0o700)
    with HookedProgram(env={"TPU_INFO_RUNTIME_DIR": str(runtime), "TPU_INFO_PORT": "0",
                            "XLA_FLAGS": ""}) as h:  # one CPU device
        build_sysfs(tmp, MACHINES["v5e_sandbox"])
        dev = build_dev(tmp, SANDBOX_DEV)
        pid = h.proc.pid
        build_proc(tmp, {pid: [f"{dev}/vfio/vfio", f"{dev}/vfio/0"], OTHER: [f"{dev}/vfio/0"]},
                   {pid: ("python3", os.getuid(), ["python3", "-c", "hooked"]),
                    OTHER: ("python3", 654321, ["/usr/bin/python3", "train.py"])})
        env = dict(os.environ, FAKE_ROOT=str(tmp), PYTHONPATH=str(ROOT), COLUMNS="160",
                   TPU_INFO_RUNTIME_DIR=str(runtime), TPU_INFO_PORT="0")

        def tpu_info(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-c", RUN, "--timeout", "30", *args],
                                  capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)

        tpu_info.pid = pid  # type: ignore[attr-defined]
        tpu_info.dev = dev  # type: ignore[attr-defined]
        yield tpu_info


def _rows(out: str) -> list[list[str]]:
    return list(csv.reader(out.splitlines(), skipinitialspace=True))


def test_query_gpu_takes_nvidia_smis_names(host):
    r = host("--query-gpu=index,name,pci.bus_id,memory.used,memory.total,memory.free,"
             "utilization.gpu,uuid,temperature.gpu,count", "--format=csv")
    assert r.returncode == 0, r.stderr
    head, chip, cpu = _rows(r.stdout)
    assert head == ["index", "name", "pci.bus_id", "memory.used [MiB]", "memory.total [MiB]",
                    "memory.free [MiB]", "utilization.gpu [%]", "uuid", "temperature.gpu",
                    "count"]  # echoed as asked, units as nvidia-smi's
    assert chip == ["3", "TPU v5e", "0000:00:0b.0", "[N/A]", "16384 MiB", "[N/A]", "[N/A]",
                    "[N/A]", "[N/A]", "2"]  # index: tpu3's number, as -L and -i say it
    assert cpu[:3] == ["0", "cpu", "[N/A]"] and cpu[3].endswith(" MiB")  # the program's CPU
    assert re.fullmatch(r"\d+ %", cpu[6]), cpu  # a whole percent, as nvidia-smi prints it
    (line,) = r.stderr.splitlines()  # the fields with no meaning here, said once
    assert line.startswith("tpu-info: --query-gpu prints [N/A] for nvidia-smi fields with no "
                           "meaning here: uuid (") and "temperature.gpu (" in line, line


def test_query_gpu_with_id_and_noheader_nounits(host):
    r = host("-i", "tpu3", "--query-gpu=index,memory.total,gpu_bus_id",
             "--format=csv,noheader,nounits")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[0] == "3, 16384, 0000:00:0b.0"


def test_query_compute_apps_is_a_row_per_process_on_a_device(host):
    r = host("--query-compute-apps=pid,process_name,used_memory,gpu_bus_id,gpu_uuid",
             "--format=csv")
    assert r.returncode == 0, r.stderr
    head, *rows = _rows(r.stdout)
    assert head == ["pid", "process_name", "used_memory [MiB]", "gpu_bus_id", "gpu_uuid"]
    by = {(row[0], row[3]): row for row in rows}
    assert set(by) == {(str(host.pid), "0000:00:0b.0"), (str(OTHER), "0000:00:0b.0"),
                       (str(host.pid), "[N/A]")}  # both on tpu3; the program on its CPU too
    assert by[str(OTHER), "0000:00:0b.0"][1:3] == ["python3 train.py", "[N/A]"]  # shared chip
    assert by[str(host.pid), "[N/A]"][2].endswith(" MiB")  # its own device: its memory
    assert "gpu_uuid" in r.stderr and r.stderr.count("\n") == 1


def test_pid_and_user_keep_processes_everywhere(host):
    mine = host("--query-compute-apps=pid", "--format=csv,noheader", "--pid", str(host.pid))
    assert set(mine.stdout.split()) == {str(host.pid)}, mine.stderr
    theirs = host("--query", "pid,process,user,engine", "--format=csv,noheader",
                  "--user", "654321")
    assert theirs.stdout == f"{OTHER}, python3 train.py, 654321, not hooked\n", theirs.stderr
    table = host("-p", "--pid", f"{host.pid},999999")
    assert table.returncode == 0, table.stderr
    assert str(host.pid) in table.stdout and str(OTHER) not in table.stdout
    none = host("-p", "--pid", "999999")
    assert "No process matches --pid 999999." in none.stdout
    doc = json.loads(host("--json", "--user", "654321").stdout)
    assert doc["targets"] == []  # the hooked program is this user's
    assert [set(c["owner_pids"]) for c in doc["chips"] if c["usable"]] == [{host.pid, OTHER}]
    doc = json.loads(host("--json", "--pid", str(host.pid), "--only", "3").stdout)
    assert [t["process"]["pid"] for t in doc["targets"]] == [host.pid]
    assert [c["name"] for c in doc["chips"]] == ["tpu3"]


def test_minus_q_prints_each_chip_key_value(host):
    r = host("-q")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "==============tpu-info -q=============="
    for line in lines:  # one "key : value" a line, the colon in one column, as nvidia-smi's
        if " : " in line or line.endswith(":"):
            assert line.index(": ") == 42, line
    text = r.stdout
    for key, value in [("Attached Devices", "2"), ("Product Name", "TPU v5e"),
                       ("Bus Id", "0000:00:0b.0"), ("Device Node", f"{host.dev}/vfio/0"),
                       ("Usable Here", "Yes"), ("Process ID", str(OTHER)),
                       ("Process ID", str(host.pid)), ("Engine", "not hooked")]:
        assert re.search(rf"^ *{key} +: {re.escape(value)}$", text, re.M), (key, value, text)
    assert "\nTPU 3\n" in text and f"\nDevice cpu:0 of pid {host.pid}\n" in text


def test_minus_q_honours_id_all_and_pid(host):
    one = host("-q", "-i", "3", "--pid", str(OTHER)).stdout
    assert "\nTPU 3\n" in one and "Device cpu:0" not in one  # the program is not kept
    assert f"Process ID                        : {OTHER}" in one
    assert f": {host.pid}\n" not in one
    every = host("-q", "--all").stdout
    assert re.findall(r"^TPU (\d)$", every, re.M) == ["0", "1", "2", "3"]
    assert every.count("Usable Here                           : No") == 3
    bad = host("-q", "-i", "tpu1")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "add --all to show it" in bad.stderr


def test_only_visible_is_the_default(host):
    default, visible = host("--query-gpu=index", "--format=csv,noheader"), \
        host("--only-visible", "--query-gpu=index", "--format=csv,noheader")
    assert default.stdout == visible.stdout and default.stdout.startswith("3\n")
    both = host("--only-visible", "--all")
    assert both.returncode == 2 and both.stdout == "" and both.stderr.count("\n") == 1
    assert "--only-visible (the default: the chips usable here) and --all" in both.stderr


def test_the_only_spelling_selects_as_minus_i(host):
    r = host("--only", "0", "3", "--all", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert r.stdout.splitlines()[:2] == ["0, 0000:00:08.0", "3, 0000:00:0b.0"], r.stderr
    bad = host("--only", "7")
    assert bad.returncode == 2 and "--only 7: no such device here (devices: tpu3)" in bad.stderr
