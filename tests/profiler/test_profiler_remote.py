"""Remote captures: the Capture RPC, the typed client, and `tpu-info profile`
against a real hooked JAX program in another process."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

import metrics
import profiler  # noqa: F401 - registers the capture the `served` fixture's server runs
from metrics import export
from tests.conftest import ROOT, patient
from tests.profiler.test_profiler_format import validate_trace
from tpu_info.contract.discovery_record import CAPTURE_TOKEN_METADATA
from tpu_info.contract.errors import CaptureBusy, ServerError
from tpu_info.net.client import Client
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc

CLI = [sys.executable, "-m", "tpu_info"]

# A training loop that only uses the Core API (install, track, mark_step):
# a recompile every 10 steps, a transfer each way every step. It imports the
# profiler (nothing else of it): that registers the capture the server runs.
PROGRAM = r"""
import sys, threading, time
import jax, jax.numpy as jnp, metrics, profiler
metrics.install(engines=["jax"])
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
@jax.jit
def train_step(x):
    return (x * 2).sum()
step = metrics.track(train_step)
print(metrics.exporter().address, flush=True)
i = 0
while not done.is_set():
    step(jnp.ones(8 + i // 10)).block_until_ready()
    jax.device_get(jax.device_put(jnp.arange(64.0)))
    metrics.mark_step()
    i += 1
    time.sleep(0.02)
"""


def start_program(tmp_path: Path, **extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TPU_INFO_RUNTIME_DIR"] = str(tmp_path / "rt")
    env["TPU_INFO_PORT"] = "0"
    env.setdefault("JAX_PLATFORMS", "cpu")
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT)
    line = p.stdout.readline()
    assert line, p.stderr.read()
    p.address = line.strip()  # type: ignore[attr-defined]
    p.env = env  # type: ignore[attr-defined]
    return p


@pytest.fixture
def program(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(tmp_path / "rt"))  # this user's records
    p = start_program(tmp_path)
    yield p
    p.stdin.close()
    p.wait(timeout=30)


@pytest.fixture
def device_program(tmp_path, monkeypatch):
    """A program that opted in to device traces."""
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(tmp_path / "rt"))
    p = start_program(tmp_path, TPU_INFO_DEVICE_CAPTURE="1")
    yield p
    p.stdin.close()
    p.wait(timeout=30)


def tpu_info(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


@pytest.mark.slow
def test_tpu_info_profile_captures_another_process(program, tmp_path) -> None:
    out = tmp_path / "trace.json.gz"
    # Ten steps at least (a recompile every ten): a loaded machine runs fewer a second.
    seconds = min(patient(1.5), 8.0)
    r = tpu_info("--timeout", "10", "profile", "--target", program.address, "--duration",
                 f"{seconds:.1f}", "-o", str(out), env=program.env)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout and "perfetto" in r.stdout
    events = validate_trace(json.loads(gzip.decompress(out.read_bytes())))
    steps = [e for e in events if e.get("cat") == "step"]
    assert len(steps) >= 10
    compiles = [e for e in events if e.get("cat") == "compile" and e["ph"] == "X"]
    recompiles = [c for c in compiles if c["args"]["kind"] == "recompile"]
    assert recompiles, [c["name"] for c in compiles]
    assert all(len(c["args"]["graph_hash"]) == 64 for c in recompiles)
    assert "changed" in recompiles[0]["args"]["cause"]
    assert sum(e.get("cat") == "transfer" for e in events) >= len(steps)  # each step moves data
    assert any(e["name"] == "executions" and e["args"]["executions"] > 0 for e in events
               if e["ph"] == "C")
    pids = {e["pid"] for e in events}
    assert pids == {program.pid}


@pytest.mark.slow
def test_tpu_info_profile_by_pid_with_device_traces(device_program, tmp_path) -> None:
    out = tmp_path / "out" / "run.json"
    r = tpu_info("--timeout", "10", "profile", "--pid", str(device_program.pid),
                 "--duration", "0.5", "-o", str(out), "--device", env=device_program.env)
    assert r.returncode == 0, r.stderr
    validate_trace(json.loads(out.read_bytes()))
    written = [line.removeprefix("device trace: ").split(" (")[0]
               for line in r.stdout.splitlines() if line.startswith("device trace: ")]
    assert written and all(Path(p).is_file() for p in written)
    # Named from -o, beside it; the server's names are labels only.
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["run.json", *(Path(p).name for p in written)])
    assert all(Path(p).name.startswith("run.device-") for p in written)


@pytest.mark.slow
def test_a_concurrent_remote_capture_is_refused_cleanly(program, tmp_path) -> None:
    first: list[bytes] = []
    # Long enough that the CLI below (seconds to start on a loaded machine) meets it running.
    seconds = min(patient(3.0), 20.0)
    t = threading.Thread(target=lambda: first.append(
        Client(program.address, timeout=10).capture(seconds)))
    t.start()
    time.sleep(0.7)
    with Client(program.address, timeout=10) as c:
        with pytest.raises(CaptureBusy, match="already running") as info:
            c.capture(0.5)
    assert info.value.target == program.address
    r = tpu_info("profile", "--target", program.address, "--duration", "1", "-o",
                 str(tmp_path / "b.json"), env=program.env)
    assert r.returncode == 1
    assert [line for line in r.stderr.splitlines() if "already running" in line]
    assert "Traceback" not in r.stderr
    t.join(30 + seconds)
    validate_trace(json.loads(first[0]))


@pytest.fixture
def served(tmp_path, monkeypatch):
    """This process serving, with the hook's own capture function (owner
    check included) and its discovery record in a private directory."""
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(tmp_path / "rt"))
    metrics.recorder()
    exporter = export.start(metrics.snapshot, port=0, capture_fn=metrics._capture)
    yield exporter
    exporter.stop(grace=0)


def owner_token(exporter) -> list[tuple[str, str]]:
    """The metadata the owner sends: the secret from the discovery record."""
    secret = json.loads(Path(exporter.published).read_text())["capture_secret"]
    return [(CAPTURE_TOKEN_METADATA, secret)]


def test_capture_rpc_checks_duration(served) -> None:
    with grpc.insecure_channel(served.address) as ch:
        stub = pb_grpc.MonitorStub(ch)
        for ms in (0, 300_001):
            with pytest.raises(grpc.RpcError) as info:
                stub.Capture(pb.CaptureRequest(duration_ms=ms), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "5 minutes" in info.value.details()
        reply = stub.Capture(pb.CaptureRequest(duration_ms=50), timeout=10,
                             metadata=owner_token(served))
    assert reply.format == "chrome-json" and reply.protocol_version >= 1
    validate_trace(json.loads(reply.trace))
    with Client(served.address, timeout=10) as c:
        with pytest.raises(ValueError):
            c.capture(301)


def test_client_hung_up_ends_the_capture(served) -> None:
    with grpc.insecure_channel(served.address) as ch:
        stub = pb_grpc.MonitorStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Capture(pb.CaptureRequest(duration_ms=60_000), timeout=0.5,
                         metadata=owner_token(served))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    started = time.monotonic()
    with Client(served.address, timeout=10) as c:   # the slot is free again soon
        while True:
            try:
                c.capture(0.05)
                break
            except CaptureBusy:
                assert time.monotonic() - started < 5
                time.sleep(0.1)


def test_old_hook_without_capture_is_a_clear_error() -> None:
    exporter = export.start(metrics.snapshot, port=0)
    try:
        with Client(exporter.address, timeout=10) as c:
            with pytest.raises(ServerError, match="does not capture traces"):
                c.capture(1)
    finally:
        exporter.stop(grace=0)


@pytest.mark.parametrize("args,needle", [
    (["profile", "--duration", "400", "-o", "t.json"], "at most 300 seconds"),
    (["profile", "--duration", "0", "-o", "t.json"], "positive number"),
    (["profile", "--duration", "5"], "-o/--output"),
    (["profile", "--pid", "1", "--target", "localhost:1", "-o", "t.json"], "not allowed"),
    (["profile", "--pid", "999999999", "-o", "t.json"], "no hooked process with pid"),
])
@pytest.mark.slow
def test_profile_usage_errors_are_one_line(args, needle, tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = tpu_info(*args, env=env)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
