"""No number of hung records keeps ``tpu-info exporter`` from asking a live
program (issue 42 item 4).

A live hooked program starts first; then 500 discovery records of live
processes (the threads of one sleeping helper) newer than it point at ports
the kernel accepts on and nobody reads (hung programs). A fresh exporter
must ask the program in its first poll and in every poll after, however the
hung records are ordered. Before, a poll dialled records not known to
answer newest first, 64 per 20 s less those that hung: the program waited
for every hung record to have its turn (130-140 s at 500).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.test_exporter_many_records import HOLDER, PROGRAM, _record, _spawn
from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.contract.model import LocalScan

pytestmark = pytest.mark.slow

HUNG_RECORDS = 500


@pytest.fixture
def older_program(tmp_path: Path) -> Iterator[Path]:
    program, info = _spawn(PROGRAM)
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    _record(d, program.pid, info["port"], "real_program.py")  # type: ignore[index]
    time.sleep(0.05)
    holder, tids = _spawn(HOLDER, str(HUNG_RECORDS))
    hung = []
    for _ in range(8):
        h = socket.socket()
        h.bind(("127.0.0.1", 0))
        h.listen(4096)  # the kernel accepts, nobody answers: a hung program
        hung.append(h)
    for i, tid in enumerate(tids):  # type: ignore[arg-type]
        _record(d, tid, hung[i % len(hung)].getsockname()[1], "hung.py")
    try:
        yield d
    finally:
        for p in (program, holder):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(30)
        for h in hung:
            h.close()


def test_an_older_program_is_asked_in_every_poll_among_500_hung_newer_records(
        older_program: Path) -> None:
    ex = HostExporter(ExporterOptions(host_label="h", runtime_dir=older_program,
                                      timeout_s=2.0, libtpu_target=None), scan_chips=LocalScan)
    try:
        ups = []
        for _ in range(4):
            ex.poll()
            text = ex.body("", "")[0].decode()
            up = re.search(r'tpu_info_target_up\{[^}]*program="real_program.py"[^}]*\} (\S+)',
                           text)
            ups.append(up.group(1) if up else None)
            skipped = {m[0]: float(m[1]) for m in re.findall(
                r'tpu_info_exporter_targets_skipped\{[^}]*reason="([^"]+)"[^}]*\} (\S+)', text)}
            asked = float(re.search(r"tpu_info_exporter_targets\{[^}]*\} (\S+)", text)[1])
            assert sum(skipped.values()) + asked == HUNG_RECORDS + 1, (skipped, asked)
        assert ups == ["1.0"] * 4, ups
    finally:
        ex.stop()
