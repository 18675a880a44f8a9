"""Serving from a helper process (``install(serve="process")``): the same
services and answers, the program's pid in them, and no helper left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import psutil
import pytest

from metrics import export
from metrics.export.helper import HelperServer
from tests.hooked import HookedProgram
from tpu_info.contract.errors import ServerError
from tpu_info.contract.model import Snapshot
from tpu_info.net.client import Client


def _helpers_of(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children()
            if "metrics.export.helper" in " ".join(c.cmdline())]


def _gone_within(proc: psutil.Process, seconds: float) -> bool:
    try:
        proc.wait(seconds)
        return True
    except psutil.TimeoutExpired:
        return False


@pytest.mark.slow
def test_a_helper_serves_the_program_and_leaves_with_it(tmp_path):
    env = {"TPU_INFO_SERVE": "process", "TPU_INFO_RUNTIME_DIR": str(tmp_path)}
    with HookedProgram(env=env) as prog:
        [helper] = _helpers_of(prog.proc.pid)
        with Client(prog.address, timeout=10) as c:
            snap = c.snapshot()
            assert snap.process.pid == prog.proc.pid  # the program, not the helper
            f = [g for g in snap.graphs if g.name == "jit(f)"]  # two shapes: two graphs
            assert len(f) == 2 and sum(g.executions or 0 for g in f) == 5
            assert snap.counter("ExecuteComputation") == 5
            assert sum(g.compiles for g in snap.graphs) == snap.counter("UncachedCompile")
            assert [e.kind for e in snap.events].count("compile") >= 2
            assert snap.distribution("OutboundData").count == 20
            streamed = list(c.stream(interval_s=0.05, events_since=snap.last_seq,
                                     duration_s=0.6))
            assert len(streamed) >= 3
            # Events come once each along a stream, in order.
            seqs = [e.seq for s in [snap, *streamed] for e in s.events]
            assert seqs == sorted(set(seqs))
            chip = c.libtpu()  # libtpu's service, answered by the helper too
            assert chip.devices
            record = json.loads((tmp_path / f"{prog.proc.pid}.json").read_text())
            # Recorded in the program, for its owner (the secret of its record).
            trace = json.loads(c.capture(0.3, secret=record["capture_secret"]))
            assert "traceEvents" in trace
        assert record["port"] == prog.port
        assert prog.stop() == 0
        assert _gone_within(helper, 10)
        assert not (tmp_path / f"{prog.proc.pid}.json").exists()


@pytest.mark.slow
def test_the_helper_leaves_when_the_program_is_killed(tmp_path):
    env = {"TPU_INFO_SERVE": "process", "TPU_INFO_RUNTIME_DIR": str(tmp_path)}
    with HookedProgram(env=env) as prog:
        [helper] = _helpers_of(prog.proc.pid)
        os.kill(prog.proc.pid, signal.SIGKILL)
        prog.proc.wait(10)
        assert _gone_within(helper, 15)


@pytest.mark.slow
def test_a_taken_port_is_a_bind_error_and_no_helper_stays():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        before = {c.pid for c in psutil.Process().children()}
        with pytest.raises(export.BindError):
            export.start(lambda since: Snapshot(taken_at_unix=0.0), port=port,
                         server_factory=HelperServer)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [c for c in psutil.Process().children() if c.pid not in before]
            if not [c for c in left if c.is_running() and c.status() != "zombie"]:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the helper of a failed bind is still running")


@pytest.mark.slow
def test_a_failing_snapshot_is_an_error_answer_not_a_dead_helper():
    calls = []

    def snapshot_fn(since: int) -> Snapshot:
        calls.append(since)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return Snapshot(taken_at_unix=1.0)

    exporter = export.start(snapshot_fn, port=0, server_factory=HelperServer)
    try:
        with Client(exporter.address, timeout=10) as c:
            with pytest.raises(ServerError, match="boom"):
                c.snapshot()
            time.sleep(0.15)  # past the refresh interval: the helper asks again
            assert c.snapshot().taken_at_unix == 1.0
    finally:
        exporter.stop()


@pytest.mark.slow
def test_a_recompile_reaches_watchers_of_the_helper_through_a_flood_of_steps():
    from metrics.recording.recorder import Recorder
    from metrics.recording.snapshot import build

    rec = Recorder()
    exporter = export.start(lambda since: build(rec, (), since), port=0,
                            server_factory=HelperServer)
    try:
        with Client(exporter.address, timeout=10) as c:
            seen = c.snapshot().last_seq
            rec.events.emit_many("step", [1.0] * 5000)
            rec.events.emit("recompile", name="jit(f)", detail="x: f32[8] -> f32[9]")
            rec.events.emit_many("step", [2.0] * 5000)
            time.sleep(0.15)  # past the helper's refresh interval
            snap = c.snapshot(events_since=seen)
            kinds = [e.kind for e in snap.events]
            assert "recompile" in kinds and len(kinds) <= 1000
            [e] = [e for e in snap.events if e.kind == "recompile"]
            assert e.detail == "x: f32[8] -> f32[9]" and e.name == "jit(f)"
    finally:
        exporter.stop()


@pytest.mark.slow
def test_serving_from_a_helper_is_the_default(tmp_path):
    """Issue 14: in the program, a one-process flood costs it most of its step
    rate (bench/attack.py); from the helper, ten snapshot builds a second."""
    env = {"TPU_INFO_SERVE": "", "TPU_INFO_RUNTIME_DIR": str(tmp_path)}
    with HookedProgram(env=env) as prog:
        assert len(_helpers_of(prog.proc.pid)) == 1
        with Client(prog.address, timeout=10) as c:
            assert c.snapshot().process.pid == prog.proc.pid


@pytest.mark.parametrize(("raw", "serve"), [
    ("", "process"), ("process", "process"), (" Process ", "process"), ("thread", "thread"),
    ("1", "thread"), ("true", "thread"), ("0", False), ("no", False), ("bogus", "process"),
])
def test_tpu_info_serve_words(raw: str, serve: object):
    from metrics import config  # the one parse of every TPU_INFO_* variable

    assert config.serve_word(raw) == serve


def _unread_in(pid: int) -> bool:
    """Whether one of ``pid``'s Unix sockets has bytes it has not read (``ss``)."""
    out = subprocess.run(["ss", "-xpn"], capture_output=True, text=True).stdout
    return any(f"pid={pid}," in line and int(line.split()[2]) > 0
               for line in out.splitlines()[1:] if len(line.split()) > 2
               and line.split()[2].isdigit())


@pytest.mark.slow
def test_the_helper_leaves_when_the_program_dies_with_its_request_unread(tmp_path):
    # The program is killed while the helper's snapshot request sits unread in
    # its socket: the helper's read is reset (ECONNRESET), not at end of file.
    # Before, main() raised, the interpreter's finalization waited in gRPC's
    # shutdown, and the helper kept the port (and the record) for minutes.
    env = {"TPU_INFO_SERVE": "process", "TPU_INFO_RUNTIME_DIR": str(tmp_path)}
    with HookedProgram(env=env) as prog:
        [helper] = _helpers_of(prog.proc.pid)
        record = tmp_path / f"{prog.proc.pid}.json"
        os.kill(prog.proc.pid, signal.SIGSTOP)  # it reads nothing more
        client = Client(prog.address, timeout=30)
        asking = threading.Thread(target=lambda: _quietly(client.snapshot), daemon=True)
        asking.start()  # a client's read: the helper asks the program for a snapshot
        deadline = time.monotonic() + 60
        while not _unread_in(prog.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _unread_in(prog.proc.pid), "the helper's request never reached the program"
        os.kill(prog.proc.pid, signal.SIGKILL)
        prog.proc.wait(10)
        assert _gone_within(helper, 30)
        assert not record.exists()
        with socket.socket() as s:  # the port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", prog.port))
        client.close()


def _quietly(call) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - the program is killed under it
        pass
