"""``tpu-info exporter`` among many dead records never drops a program silently
(issue 29, item 4).

300 discovery records of live processes (the threads of one sleeping
helper: ``kill(tid, 0)`` and ``/proc/<tid>`` answer for a thread as for a
process, so the reader takes each for a live hooked process) point at ports
where nothing answers: half refuse, half accept and hang. A real hooked
program (the hook's gRPC server in a subprocess) starts after them. Before
the fix the exporter asked "the first 256" by pid, so the program never had
a series nor a ``tpu_info_target_up``, and every poll left 64 more sockets
open. Now answering and newest targets come first, what is not asked is
counted in ``tpu_info_exporter_targets_skipped{reason}``, and the sockets
stay bounded.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.commands.exporter_targets import DIAL_BUDGET
from tpu_info.contract.model import LocalScan

pytestmark = pytest.mark.slow

RECORDS = 300
HOLDER = r"""
import json, sys, threading
threading.stack_size(64 * 1024)
stop, ids, ready = threading.Event(), [], threading.Semaphore(0)
def hold():
    ids.append(threading.get_native_id()); ready.release(); stop.wait()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=hold, daemon=True).start()
for _ in range(int(sys.argv[1])):
    ready.acquire()
print(json.dumps(ids), flush=True)
sys.stdin.read()
"""
PROGRAM = r"""
import json, sys
from metrics import export
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
rec = Recorder()
rec.ledger.compiled("a" * 64, "jit(step)", "jax", seconds=0.1)
srv = export.start(lambda since: build(rec, (), since), port=0, workers=2)
print(json.dumps({"port": srv.port}), flush=True)
sys.stdin.read()
"""


def _spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], object]:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    return p, json.loads(p.stdout.readline())


def _record(d: Path, pid: int, port: int, program: str) -> None:
    path = d / f"{pid}.json"
    path.write_text(json.dumps({"schema": 1, "pid": pid, "port": port, "host": "127.0.0.1",
                                "argv": [program], "engine": "jax", "versions": {},
                                "start_time": time.time()}))
    path.chmod(0o600)


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A runtime directory of RECORDS dead-port records, then a real program's."""
    holder, tids = _spawn(HOLDER, str(RECORDS))
    hung, ports = [], []
    for _ in range(4):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])  # closed: refuses
        s.close()
        h = socket.socket()
        h.bind(("127.0.0.1", 0))
        h.listen(1024)  # the kernel accepts, nobody answers: a hung program
        hung.append(h)
        ports.append(h.getsockname()[1])
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    for i, tid in enumerate(tids):  # type: ignore[arg-type]
        _record(d, tid, ports[i % len(ports)], "stale.py")
    time.sleep(0.05)
    program, info = _spawn(PROGRAM)
    _record(d, program.pid, info["port"], "real_program.py")  # type: ignore[index]
    try:
        yield d, program.pid
    finally:
        for p in (program, holder):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(30)
        for h in hung:
            h.close()


def test_a_program_among_many_dead_records_is_asked_and_the_rest_counted(crowded) -> None:
    d, pid = crowded
    ex = HostExporter(ExporterOptions(host_label="h", runtime_dir=d, timeout_s=2.0,
                                      libtpu_target=None), scan_chips=LocalScan)
    try:
        sockets = []
        for _ in range(4):
            ex.poll()
            sockets.append(_sockets())
            text = ex.body("", "")[0].decode()
            up = re.search(r'tpu_info_target_up\{[^}]*program="real_program.py"[^}]*\} (\S+)',
                           text)
            assert up is not None and up.group(1) == "1.0", "the program was not asked"
            assert re.search(r'tpu_info_graphs\{[^}]*program="real_program.py"', text), \
                "no series"
            skipped = {m[0]: float(m[1]) for m in re.findall(
                r'tpu_info_exporter_targets_skipped\{[^}]*reason="([^"]+)"[^}]*\} (\S+)', text)}
            asked = float(re.search(r"tpu_info_exporter_targets\{[^}]*\} (\S+)", text)[1])
            assert sum(skipped.values()) + asked == RECORDS + 1, (skipped, asked)
            assert skipped["port_closed"] == RECORDS // 2  # never dialled
        # The dials that may hang are few per gRPC connect timeout, so the
        # sockets do not grow poll after poll (before: 64 more each poll).
        assert max(sockets) - min(sockets) <= 4, sockets
        assert max(sockets) <= DIAL_BUDGET + 32, sockets
    finally:
        ex.stop()
