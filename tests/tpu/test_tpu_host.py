"""On a TPU host (issue 40): a hooked JAX program on the chip, read by
``tpu-info`` from another process, and its saved run after it ends.

One program for the module (opening the chip costs ~10 s and one process
holds it at a time); each test reads it with ``python3 -m tpu_info`` under
``JAX_PLATFORMS=cpu``. The last test stops it. Run with ``make test-tpu``.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.google_names import GOOGLE_LIST, ORBAX_SHOWN, sections
from tests.tpu.conftest import ChipProgram

pytestmark = pytest.mark.tpu

# "1.23 GiB / 15.75 GiB" (or MiB, KiB): a used and a total, not "N/A / 16.00 GiB"
HBM_PAIR = re.compile(r"\d+(\.\d+)? [KMG]iB / \d+(\.\d+)? GiB")
# gRPC's C core logging into the program's stderr ("E1205 12:34:56.789012 1234
# add_port.cc:83] Failed to add port ..."); libtpu's own log lines are allowed.
GRPC_LINE = re.compile(rb"^[EWIF]\d{4} [\d:. ]+\S*(grpc|chttp2|add_port|tcp_|socket_utils|"
                       rb"ev_epoll|resolve_address|server)\S*\.cc:\d+\]", re.M)


def _device_rows(out: str) -> list[str]:
    """The Devices table's TPU rows (``tpu0 TPU v5e ...``)."""
    return [ln for ln in out.splitlines() if re.match(r"\s*tpu\d+\s", ln)]


def test_the_program_runs_on_the_chip(chip_program: ChipProgram):
    assert chip_program.platform == "tpu", chip_program.kind


def test_table_lists_one_chip_with_the_programs_hbm(chip_program: ChipProgram):
    r = chip_program.tpu_info()
    assert r.returncode == 0, r.stderr
    rows = _device_rows(r.stdout)
    assert len(rows) == 1, r.stdout  # the sandbox shows 4 PCI functions, one /dev/vfio node
    assert HBM_PAIR.search(rows[0]), rows[0]  # used from the program's hook, not N/A
    assert str(chip_program.pid) in r.stdout, r.stdout  # the process is seen
    assert "No hooked processes found" not in r.stdout


def test_json_has_the_process_and_the_chips_hbm(chip_program: ChipProgram):
    r = chip_program.tpu_info("--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    usable = [c for c in doc["chips"] if c["usable"]]
    assert len(usable) == 1, doc["chips"]
    chip = usable[0]
    assert chip["hbm_used_bytes"] and chip["hbm_total_bytes"], chip
    assert chip_program.pid in chip["owner_pids"], chip
    (target,) = [t for t in doc["targets"]
                 if t.get("process") and t["process"]["pid"] == chip_program.pid]
    assert any(d["platform"] == "tpu" and d["hbm_used_bytes"] for d in target["devices"]), target


def test_report(chip_program: ChipProgram):
    r = chip_program.tpu_info("report")
    assert r.returncode == 0, r.stderr
    assert "CompileTime" in r.stdout and "MarkStep" in r.stdout, r.stdout[-2000:]


def test_doctor_says_it_serves_on_the_local_socket_only(chip_program: ChipProgram):
    r = chip_program.tpu_info("doctor")
    assert r.returncode == 0, r.stderr
    line = next((ln for ln in r.stdout.splitlines() if f"pid {chip_program.pid}" in ln), "")
    assert re.search(r"local socket", line) and re.search(r"\bonly\b", line), r.stdout


def test_googles_57_names_each_give_a_value_or_a_reason(chip_program: ChipProgram):
    args = [a for n in GOOGLE_LIST for a in ("--metric", n)]
    r = chip_program.tpu_info(*args)
    assert r.returncode == 0, r.stderr
    got = sections(r.stdout, GOOGLE_LIST)
    assert set(got) == set(GOOGLE_LIST), set(GOOGLE_LIST) - set(got)
    for name, text in got.items():
        bare = text.replace("N/A:", "")
        assert "N/A" not in bare or "N/A:" in text, (name, text)  # never a bare N/A
        assert "N/A:" in text or re.search(r"\d", text), (name, text)
    assert "N/A" not in got["hbm_usage"] and HBM_PAIR.search(got["hbm_usage"]), got["hbm_usage"]
    for name, value in ORBAX_SHOWN.items():  # the program's jax.monitoring records, as orbax's
        assert value in got[name] and "N/A" not in got[name], (name, got[name])


def test_after_it_ends_stderr_is_clean_and_the_saved_run_keeps_the_hbm(
        chip_program: ChipProgram):
    chip_program.stop()
    err = chip_program.stderr_path.read_bytes()
    assert b"\x00" not in err, err[-2000:]
    assert not GRPC_LINE.search(err) and b"add_port" not in err, err[-2000:]
    r = chip_program.tpu_info("runs", "--json")
    assert r.returncode == 0, r.stderr
    runs = [x for x in json.loads(r.stdout)["runs"] if x["pid"] == chip_program.pid]
    assert runs, r.stdout
    path = runs[0]["file"]
    r = chip_program.tpu_info("--from", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    devices = [d for t in doc["targets"] for d in t.get("devices", [])]
    assert any(d["platform"] == "tpu" and d["hbm_used_bytes"] for d in devices), doc["targets"]
    r = chip_program.tpu_info("report", "--from", path)
    assert r.returncode == 0 and "MarkStep" in r.stdout, r.stderr
    assert "reported no devices" not in r.stdout
