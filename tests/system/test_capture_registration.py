"""``profiler`` registers its capture with the exporter; ``metrics`` never
imports ``profiler`` (issue 16, "Decisions in the wrong room"), and every
hooked program can be traced all the same (issue 32, item 4).

Real hooked programs in subprocesses, real grpc on loopback, the owner's
secret from the real discovery record: a program that never imported the
profiler answers its owner with the capture's window (still refusing
everyone else first; before: FAILED_PRECONDITION, "add `import profiler`"),
the capture never loads the profiler, and ``tpu-info profile`` writes a
trace; after ``import profiler`` (in any order with ``install``) the same
call answers the profiler's whole trace; ``tpu-info run`` programs are
traced without importing it themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.conftest import ROOT
from tpu_info.contract.captures import CHROME_JSON, WINDOW_FORMAT
from tpu_info.contract.discovery_record import CAPTURE_TOKEN_METADATA
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

# No engine: the capture path is the same, and the program starts in a second.
PROGRAM = r"""
import sys, metrics
metrics.install(serve=sys.argv[1])
print(metrics.exporter().address, flush=True)
for line in sys.stdin:
    if line.strip() == "import profiler":
        import profiler
    print(sorted(m for m in sys.modules if m == "profiler" or m.startswith("profiler.")),
          flush=True)
"""


class Program:
    def __init__(self, tmp_path: Path, serve: str) -> None:
        self.runtime = tmp_path / "rt"
        self.env = dict(os.environ, PYTHONPATH=str(ROOT),
                        TPU_INFO_RUNTIME_DIR=str(self.runtime), TPU_INFO_PORT="0")
        self.proc = subprocess.Popen([sys.executable, "-c", PROGRAM, serve],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=self.env, cwd=ROOT)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        self.address = line.strip()

    def ask(self, command: str) -> list[str]:
        """Runs ``command`` in the program; returns the profiler modules it has."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return eval(self.proc.stdout.readline())  # noqa: S307 - our own program's repr

    @property
    def secret(self) -> str:
        return _record(self.runtime)["capture_secret"]

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _record(runtime: Path) -> dict:
    for _ in range(300):
        records = list(runtime.glob("*.json"))
        if records:
            return json.loads(records[0].read_text())
        time.sleep(0.1)
    raise AssertionError(f"no discovery record in {runtime}")


def _capture(address: str, token: str | None) -> pb.CaptureReply:
    metadata = [(CAPTURE_TOKEN_METADATA, token)] if token else None
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.MonitorStub(ch).Capture(pb.CaptureRequest(duration_ms=100),
                                               timeout=60, metadata=metadata)


def _error(address: str, token: str | None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _capture(address, token)
    return info.value


@pytest.mark.parametrize("serve", ["thread", "process"])
def test_a_capture_without_the_profiler_never_loads_it(tmp_path, serve) -> None:
    prog = Program(tmp_path, serve)
    try:
        assert prog.ask("modules") == []
        # Nobody but the owner learns anything.
        assert _error(prog.address, None).code() in (grpc.StatusCode.PERMISSION_DENIED,
                                                     grpc.StatusCode.UNAUTHENTICATED)
        # The owner gets the window (before: FAILED_PRECONDITION, "add `import profiler`").
        reply = _capture(prog.address, prog.secret)
        assert reply.format == WINDOW_FORMAT
        window = json.loads(reply.trace)["otherData"]  # valid Chrome JSON for old clients
        assert 0.09 < window["duration_s"] < 30 and window["capture_start_unix"] > 0
        assert any("import profiler" in n for n in reply.notes)
        assert prog.ask("modules") == []  # metrics never imports the profiler
        if serve == "thread":  # what `tpu-info profile` does: writes the trace, exit 0
            r = subprocess.run([sys.executable, "-m", "tpu_info", "profile", "--target",
                                prog.address, "--duration", "0.1", "-o",
                                str(tmp_path / "t.json")], capture_output=True, text=True,
                               timeout=60, cwd=ROOT, env=prog.env)
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
            assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
            assert prog.ask("modules") == []
        assert "profiler" in prog.ask("import profiler")  # after install(): registers itself
        reply = _capture(prog.address, prog.secret)
        assert reply.format == CHROME_JSON and json.loads(reply.trace)["traceEvents"]
    finally:
        prog.stop()


def test_tpu_info_run_programs_are_traced_without_importing_the_profiler(tmp_path) -> None:
    runtime = tmp_path / "rt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(runtime),
               TPU_INFO_PORT="0", TPU_INFO_SERVE="thread", JAX_PLATFORMS="cpu")
    program = "import sys, jax\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-m", "tpu_info", "run", "--", sys.executable,
                             "-c", program], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    try:
        record = _record(runtime)
        address = f"127.0.0.1:{record['port']}"
        assert json.loads(_capture(address, record["capture_secret"]).trace)["traceEvents"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()
