"""Faults and load, in short form (the long forms are bench/load.py and
bench/soak.py): the hook keeps serving, the tools keep their footing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest

from metrics.recording.events import EventLog
from metrics.recording.graphs import GraphLedger
from tests.conftest import ROOT
from tests.hooked import HookedProgram
from tpu_info.contract.errors import TpuInfoError, Unreachable
from tpu_info.net.client import Client
from tpu_info.net.fanout import fan_out
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc


def test_memory_caps_hold_in_short_soak():
    ledger, log = GraphLedger(max_graphs=500), EventLog(capacity=1000)
    for g in range(20_000):
        ledger.compiled(f"{g:064x}", "jit(f)", "jax", 0.001)
        ledger.executed(f"{g:064x}", "jit(f)", "jax")
    for _ in range(50_000):
        log.emit("step")
    assert len(ledger.snapshot()) == 500 and ledger.evicted == 19_500
    events, dropped = log.since(0)
    assert len(events) == 1000 and events[-1].seq == 50_000 and dropped == 49_000


def test_kill_9_during_fan_out_is_a_typed_error():
    with HookedProgram() as a, HookedProgram() as b:
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(timeout=10)
        results = fan_out([a.address, b.address], timeout=3)
    assert results[0].ok and results[0].value is not None
    assert isinstance(results[1].error, Unreachable)


def test_port_8431_held_by_a_foreign_process(tmp_path):
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8431))
        holder.listen()
    except OSError:
        holder.close()
        pytest.skip("port 8431 is already taken on this machine")
    try:
        env = {k: v for k, v in os.environ.items() if k != "TPU_INFO_PORT"}
        env.update(PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path))
        code = ("import metrics, sys; metrics.install(engines=[]); "
                "print(metrics.exporter().port, flush=True)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, cwd=ROOT, env=env)
        assert r.returncode == 0, r.stderr
        port = int(r.stdout.split()[0])
        assert port not in (0, 8431)
        assert "Traceback" not in r.stderr
    finally:
        holder.close()


def test_a_watcher_that_stops_reading_is_not_buffered_without_bound():
    with HookedProgram() as prog:
        proc = psutil.Process(prog.proc.pid)
        channel = grpc.insecure_channel(prog.address)
        stalled = [pb_grpc.MonitorStub(channel).StreamSnapshots(
            pb.StreamRequest(interval_ms=50), timeout=30) for _ in range(3)]
        next(stalled[0])  # started; now nobody reads
        time.sleep(1.0)
        rss_before = proc.memory_info().rss
        time.sleep(4.0)
        growth = proc.memory_info().rss - rss_before
        with Client(prog.address, timeout=5) as c:  # others are still served
            assert c.snapshot().process is not None
        for call in stalled:
            call.cancel()
        channel.close()
    assert growth < 20 * 2**20, growth


def test_short_load_has_no_rpc_errors():
    errors: list[Exception] = []
    with HookedProgram() as prog:
        stop = time.monotonic() + 3.0

        def watcher() -> None:
            try:
                with Client(prog.address, timeout=10) as c:
                    for _ in c.stream(interval_s=0.2, duration_s=3.0):
                        pass
            except TpuInfoError as e:
                errors.append(e)

        def poller() -> None:
            with Client(prog.address, timeout=5) as c:
                while time.monotonic() < stop:
                    try:
                        c.snapshot(events_since=2**62)
                    except TpuInfoError as e:
                        errors.append(e)
                    time.sleep(0.02)

        threads = [threading.Thread(target=watcher) for _ in range(8)]
        threads += [threading.Thread(target=poller) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []



def test_a_stopped_process_shows_as_disconnected_in_the_watcher():
    """SIGSTOP keeps the socket open but answers nothing: the dashboard's
    reader notices the silence and reports the target disconnected."""
    from tui.source import Conn, TargetReader

    updates = []
    with HookedProgram() as prog:
        reader = TargetReader(prog.address, interval_s=0.2, timeout_s=2.0, silence_s=2.0)
        stop = threading.Event()
        t = threading.Thread(target=reader.run, args=(updates.append, stop), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not updates and time.monotonic() < deadline:
            time.sleep(0.1)
        prog.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            while time.monotonic() < stopped_at + 20 and not any(
                    u.state == Conn.DISCONNECTED for u in updates):
                time.sleep(0.1)
        finally:
            prog.proc.send_signal(signal.SIGCONT)
            stop.set()
            reader.stop()
    down = [u for u in updates if u.state == Conn.DISCONNECTED]
    assert down and "no answer" in down[0].error
    assert down[0].since_unix is not None
