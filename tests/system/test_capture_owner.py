"""Captures are for the program's owner, on its host (issue 14, items 5 and 7).

Real hooked JAX programs in subprocesses, real grpc on loopback: a capture
without the secret of the 0600 discovery record is refused while snapshots
and libtpu's service still answer; with it, it works, in-program and through
the serve="process" helper; device traces only when the program opted in,
bounded; no file stays in the program's temporary directory; a caller from
a non-loopback address is refused even with the secret; another uid gets one
clear line from ``tpu-info profile``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
import pytest

from tests.conftest import ROOT
from tpu_info.contract.errors import CaptureBusy
from tpu_info.net.client import Client
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

KEY = "tpu-info-capture-token"  # the wire contract (tpu_info.contract.discovery_record.CAPTURE_TOKEN_METADATA)

PROGRAM = r"""
import os, sys, threading, time
import jax, jax.numpy as jnp, metrics, profiler  # profiler: registers the capture
if os.environ.get("CAP_BYTES"):  # a lower cap on device files sent, to overflow it cheaply
    import metrics.export.device_capture
    metrics.export.device_capture.MAX_FILE_BYTES = int(os.environ["CAP_BYTES"])
metrics.install(engines=["jax"])
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
step = jax.jit(lambda x: (x * 2).sum())
step(jnp.ones(64)).block_until_ready()  # the backend has started: devices are there to read
print(metrics.exporter().address, flush=True)
while not done.is_set():
    step(jnp.ones(64)).block_until_ready()
    metrics.mark_step()
    time.sleep(0.005)
"""


class Program:
    """A hooked program with its own runtime and temporary directories."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.runtime = tmp_path / "rt"
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(self.runtime),
                        TPU_INFO_PORT="0", TMPDIR=str(self.tmp), JAX_PLATFORMS="cpu", **env)
        for key in ("TPU_INFO_BIND", "TPU_INFO_DEVICE_CAPTURE", "TPU_INFO_SERVE"):
            if key not in env:
                self.env.pop(key, None)
        self.proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self.env, cwd=ROOT)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        self.address = line.strip()
        self.port = int(self.address.rpartition(":")[2])

    @property
    def secret(self) -> str:
        record = json.loads((self.runtime / f"{self.proc.pid}.json").read_text())
        return record.get("capture_secret", "")

    def capture(self, target: str | None = None, *, token: str | None = None,
                timeout: float = 60, **request: object) -> pb.CaptureReply:
        """A raw ``Capture`` call (no client-side checks), with ``token`` as metadata."""
        metadata = [(KEY, token)] if token else None
        options = [("grpc.max_receive_message_length", 64 << 20)]
        with grpc.insecure_channel(target or self.address, options=options) as ch:
            return pb_grpc.MonitorStub(ch).Capture(pb.CaptureRequest(**request),
                                                   timeout=timeout, metadata=metadata)

    def files_left(self) -> list[Path]:
        return [p for p in self.tmp.rglob("*")]

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def start(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(tmp_path / "rt"))  # this user's records
    started: list[Program] = []

    def start(**env: str) -> Program:
        started.append(Program(tmp_path, **env))
        return started[-1]

    yield start
    for p in started:
        p.stop()


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


@pytest.mark.parametrize("serve", ["1", "process"])
def test_a_capture_needs_the_secret_while_snapshots_stay_open(start, serve) -> None:
    prog = start(TPU_INFO_SERVE=serve)
    refused = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
    assert _code(lambda: prog.capture(duration_ms=200)) in refused
    assert _code(lambda: prog.capture(duration_ms=200, token="not-the-secret")) in refused
    # Reading stays open to every local caller, as libtpu's service is.
    with Client(prog.address, timeout=10) as c:
        assert c.snapshot().process.pid == prog.proc.pid
        assert c.libtpu().devices
        assert "tpu.runtime.hbm.memory.usage.bytes" in c.supported_libtpu_metrics()
    assert prog.secret  # only the owner can read it: the record is 0600 in a 0700 directory
    assert (prog.runtime / f"{prog.proc.pid}.json").stat().st_mode & 0o077 == 0
    reply = prog.capture(duration_ms=200, token=prog.secret)
    assert json.loads(reply.trace)["traceEvents"]
    with Client(prog.address, timeout=10) as c:  # the client finds the secret by port
        assert json.loads(c.capture(0.2))["traceEvents"]


def test_device_traces_only_when_the_program_opted_in(start) -> None:
    prog = start()
    assert _code(lambda: prog.capture(duration_ms=200, device=True, token=prog.secret)
                 ) == grpc.StatusCode.FAILED_PRECONDITION
    assert not prog.files_left()
    opted = start(TPU_INFO_DEVICE_CAPTURE="1")
    # Bounded: a device window is at most 10 s (a host trace up to 300 s).
    assert _code(lambda: opted.capture(duration_ms=10_001, device=True, token=opted.secret)
                 ) == grpc.StatusCode.INVALID_ARGUMENT
    reply = opted.capture(duration_ms=300, device=True, token=opted.secret)
    assert reply.files and all(f.data and not f.server_path for f in reply.files)
    assert sum(len(f.data) for f in reply.files) <= 24 * 2**20


def test_no_capture_file_stays_on_the_programs_disk(start) -> None:
    # Device files over the (lowered) cap: before, they stayed in $TMPDIR for good.
    prog = start(TPU_INFO_DEVICE_CAPTURE="1", CAP_BYTES="100")
    reply = prog.capture(duration_ms=300, device=True, token=prog.secret)
    assert not [f for f in reply.files if f.server_path]
    assert any("left out" in n for n in reply.notes), list(reply.notes)
    assert prog.files_left() == []
    # The client went away mid-capture: the capture ends and its folder goes.
    assert _code(lambda: prog.capture(duration_ms=5000, device=True, token=prog.secret,
                                      timeout=0.5)) == grpc.StatusCode.DEADLINE_EXCEEDED
    with Client(prog.address, timeout=10) as c:
        for _ in range(100):
            try:
                c.capture(0.05, secret=prog.secret)
                break
            except CaptureBusy:
                time.sleep(0.1)
    assert prog.files_left() == []


def _other_local_address(family: socket.AddressFamily) -> tuple[str, str] | None:
    """(bind setting, dial host) of a non-loopback address of this host."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            ip = a.address.partition("%")[0]
            if a.family != family or ip.startswith(("127.", "fe80")) or ip == "::1":
                continue
            return ("0.0.0.0", ip) if family == socket.AF_INET else ("::", f"[{ip}]")
    return None


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
def test_a_caller_from_a_non_loopback_address_is_refused_even_with_the_secret(start,
                                                                              family) -> None:
    other = _other_local_address(family)
    if other is None:
        pytest.skip(f"this host has no non-loopback {family.name} address")
    bind, host = other
    prog = start(TPU_INFO_BIND=bind)
    # Dialling this host's own eth address makes the kernel report that address
    # as the peer: to the server, a caller from the network.
    remote = f"{host}:{prog.port}"
    assert _code(lambda: prog.capture(remote, duration_ms=100, token=prog.secret)
                 ) == grpc.StatusCode.PERMISSION_DENIED
    with grpc.insecure_channel(remote) as ch:  # reading is still served there
        pb_grpc.MonitorStub(ch).GetSnapshot(pb.SnapshotRequest(), timeout=10)
    assert prog.capture(f"127.0.0.1:{prog.port}", duration_ms=100, token=prog.secret).trace
    from tpu_info.contract.errors import CaptureRefused

    with pytest.raises(CaptureRefused, match="owner"):  # the client never sends it there
        Client(remote, timeout=10).capture(0.1)


def test_the_peer_and_secret_predicates() -> None:
    from metrics.export.owner import Caller, NotOwner, check, is_loopback_peer

    for peer in ("ipv4:127.0.0.1:5000", "ipv4:127.1.2.3:1", "ipv6:[::1]:5000",
                 "ipv6:[::ffff:127.0.0.1]:80", "unix:/tmp/sock"):
        assert is_loopback_peer(peer), peer
    for peer in ("ipv4:192.0.2.2:5000", "ipv6:[fd00::2]:5000", "ipv6:[::ffff:10.0.0.1]:1",
                 "ipv6:[fe80::1%25eth0]:5", "", "ipv4:", "localhost:5", "ipv4:localhost:5",
                 "ipv6:[::]:1", "ipv4:0.0.0.0:1", "unknown"):
        assert not is_loopback_peer(peer), peer
    check(Caller("s", "ipv4:127.0.0.1:1"), "s")
    for caller, secret in ((Caller("s", "ipv4:10.0.0.1:1"), "s"),
                           (Caller("", "ipv4:127.0.0.1:1"), "s"),
                           (Caller("", "ipv4:127.0.0.1:1"), ""),
                           (Caller("t", "ipv4:127.0.0.1:1"), "s")):
        with pytest.raises(NotOwner):
            check(caller, secret)


ANOTHER_USER = r"""
import gzip, os, shutil, sys, tempfile, psutil  # everything imported (root's own files), then drop root
import grpc._channel, grpc._interceptor  # grpc imports these lazily; a clone in a 0700 dir hides them
from tpu_info.commands import cli, files, profile
from tpu_info.net import capture_events
from tpu_info.outputs import host_timeline
from tpu_info.contract import errors
from tpu_info.net import client, discovery
from tpu_info.views import values as views
cli.build_parser().parse_args(sys.argv[1:])
os.setgid(65534); os.setuid(65534)
sys.exit(cli.main(sys.argv[1:]))
"""


def test_another_user_gets_one_line_and_exit_1(start, tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    prog = start()
    shared = Path(tempfile.mkdtemp())  # uid 65534 could write the trace here if allowed
    os.chmod(shared, 0o777)
    out = shared / "stolen.json"
    env = dict(prog.env, TPU_INFO_RUNTIME_DIR=str(shared / "rt-65534"))  # that user's own
    r = subprocess.run([sys.executable, "-c", ANOTHER_USER, "profile", "--target", prog.address,
                        "--duration", "0.2", "-o", str(out)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("tpu-info: recording")]
    assert len(errors) == 1 and "owner" in errors[0] and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()
    shutil.rmtree(shared)
    # The same uid reaching the port with a raw stub is refused by the program.
    code = subprocess.run([sys.executable, "-c", r"""
import os, sys, grpc
import grpc._channel, grpc._interceptor  # imported lazily by grpc: before dropping root
from tpu_info.proto import tpu_info_v1_pb2 as pb, tpu_info_v1_pb2_grpc as pb_grpc
os.setgid(65534); os.setuid(65534)
with grpc.insecure_channel(sys.argv[1]) as ch:
    try:
        pb_grpc.MonitorStub(ch).Capture(pb.CaptureRequest(duration_ms=200), timeout=30)
        print("OK")
    except grpc.RpcError as e:
        print(e.code().name)
""", prog.address], capture_output=True, text=True, env=prog.env, cwd=ROOT, timeout=60)
    assert code.stdout.strip() == "PERMISSION_DENIED", code.stderr


def test_a_folder_left_by_a_killed_capture_is_swept(start) -> None:
    prog = start(TPU_INFO_DEVICE_CAPTURE="1")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    abandoned = prog.tmp / f"tpu-info-capture-{dead}-x"  # as a kill -9 mid-capture leaves it
    (abandoned / "jax").mkdir(parents=True)
    (abandoned / "jax" / "big.xplane.pb").write_bytes(b"x" * 1000)
    prog.capture(duration_ms=100, device=True, token=prog.secret)
    assert prog.files_left() == []


def test_the_helper_refuses_without_asking_the_program(start) -> None:
    prog = start(TPU_INFO_SERVE="process")
    os.kill(prog.proc.pid, signal.SIGSTOP)  # a program that cannot answer anything now
    try:
        # Refused by the helper at once: a flood of these never reaches the program.
        assert _code(lambda: prog.capture(duration_ms=100, timeout=5)
                     ) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        os.kill(prog.proc.pid, signal.SIGCONT)
    assert prog.capture(duration_ms=100, token=prog.secret).trace
