"""The hook's local socket (issue 29, item 2): the owner's way in, whoever
holds the TCP port. Served beside the discovery record, named in it, dialled
by this user's clients, gone with the record, never served by a fork child."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from metrics import export
from metrics.export import discovery as writer
from metrics.export.helper import HelperServer
from tests.hostile_clients import RawH2
from tpu_info.contract.discovery_record import parse_record
from tpu_info.contract.errors import Unreachable
from tpu_info.contract.model import Snapshot
from tpu_info.net import discovery, local_socket
from tpu_info.net.client import Client


def _snapshot(since: int) -> Snapshot:
    return Snapshot(taken_at_unix=5.0)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rt = tmp_path / "rt"
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(rt))
    yield rt
    local_socket.remember(rt, ())


@pytest.mark.slow
@pytest.mark.parametrize("factory", [None, HelperServer], ids=["in_process", "helper"])
def test_the_record_names_a_private_socket_that_clients_dial(runtime_dir: Path,
                                                             factory) -> None:
    exporter = export.start(_snapshot, port=0, server_factory=factory)
    try:
        record = json.loads((runtime_dir / f"{os.getpid()}.json").read_text())
        sock = runtime_dir / f"{os.getpid()}.sock"
        assert record["socket"] == str(sock.absolute())
        st = sock.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        [found] = discovery.scan(runtime_dir).processes
        assert found.socket == record["socket"]
        with Client(exporter.address, timeout=10) as c:
            assert c.dialled == f"unix:{sock}"
            assert c.snapshot().taken_at_unix == 5.0
    finally:
        exporter.stop(grace=0)
    assert not sock.exists() and not (runtime_dir / f"{os.getpid()}.json").exists()


def test_the_owner_is_answered_when_the_tcp_cap_is_full(runtime_dir: Path) -> None:
    exporter = export.start(_snapshot, port=0)
    held = []
    try:
        for _ in range(70):  # the cap is 64: the rest are closed at once
            held.append(RawH2("127.0.0.1", exporter.port, window=None))
        time.sleep(0.3)
        with Client(exporter.address, timeout=5) as tcp:  # no scan yet: over TCP
            with pytest.raises(Unreachable, match="refused the connection"):
                tcp.snapshot()
        discovery.scan(runtime_dir)
        with Client(exporter.address, timeout=5) as c:
            assert c.dialled.startswith("unix:") and c.snapshot().taken_at_unix == 5.0
    finally:
        for h in held:
            h.close()
        exporter.stop(grace=0)


def test_a_socket_that_is_not_this_users_or_not_private_is_not_dialled(
        runtime_dir: Path) -> None:
    exporter = export.start(_snapshot, port=0)
    try:
        discovery.scan(runtime_dir)
        sock = runtime_dir / f"{os.getpid()}.sock"
        assert local_socket.dial_address(exporter.address) == f"unix:{sock}"
        # Another user's socket (as a root test can make one), or a directory others
        # can write to: TCP, as for a hook without a socket.
        assert local_socket.dial_address(exporter.address, uid=os.geteuid() + 1) \
            == exporter.address
        os.chmod(runtime_dir, 0o770)
        try:
            assert local_socket.dial_address(exporter.address) == exporter.address
        finally:
            os.chmod(runtime_dir, 0o700)
        sock.unlink()  # gone (its program exiting): TCP
        assert local_socket.dial_address(exporter.address) == exporter.address
        with Client(exporter.address, timeout=5) as c:
            assert c.snapshot().taken_at_unix == 5.0
    finally:
        exporter.stop(grace=0)


def test_a_record_without_a_socket_reads_over_tcp_and_bad_sockets_are_corrupt(
        tmp_path: Path) -> None:
    base = {"schema": 1, "pid": 42, "port": 8431, "host": "127.0.0.1", "argv": [],
            "engine": "", "versions": {}, "start_time": 0.0}
    assert parse_record(base, tmp_path / "42.json").socket == ""  # an older hook
    ok = parse_record(dict(base, socket="/run/x/42.sock"), tmp_path / "42.json")
    assert local_socket.socket_of(ok) == tmp_path / "42.sock"  # beside the record, always
    for bad in ("/run/x/43.sock", "/tmp/evil\n42.sock", 5):
        with pytest.raises(ValueError, match="socket"):
            parse_record(dict(base, socket=bad), tmp_path / "42.json")


def test_a_killed_programs_socket_goes_with_its_record(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    (rt / "999999.json").write_text(json.dumps(writer.record(1234, "127.0.0.1", "", {},
                                                             pid=999999)))
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(rt / "999999.sock"))  # what a kill -9 leaves
    left.close()
    found = discovery.scan(rt, alive=lambda pid, start: False, port_owners=lambda: {})
    assert found.removed == 1 and os.listdir(rt) == []


def test_a_path_too_long_for_a_socket_serves_over_tcp(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 100)
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(deep))
    assert writer.socket_path() is None
    exporter = export.start(_snapshot, port=0)
    try:
        record = json.loads((deep / f"{os.getpid()}.json").read_text())
        assert record["socket"] == ""
        discovery.scan(deep)
        with Client(exporter.address, timeout=5) as c:
            assert c.dialled == exporter.address and c.snapshot().taken_at_unix == 5.0
    finally:
        exporter.stop(grace=0)


@pytest.mark.slow
def test_a_fork_child_closes_its_copy_of_the_socket(runtime_dir: Path) -> None:
    exporter = export.start(_snapshot, port=0)
    path = str(runtime_dir / f"{os.getpid()}.sock")
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's socket is left open here
            os.close(read)
            from metrics.recording import forksafe

            os.write(write, str(forksafe.close_unix_sockets_at(path)).encode())
            os._exit(0)
        os.close(write)
        left = os.read(read, 16)
        os.close(read)
        os.waitpid(pid, 0)
        assert left == b"0"
        discovery.scan(runtime_dir)
        with Client(exporter.address, timeout=5) as c:  # the parent still serves it
            assert c.dialled == f"unix:{path}" and c.snapshot().taken_at_unix == 5.0
    finally:
        exporter.stop(grace=0)


def test_the_owner_captures_over_the_socket(runtime_dir: Path) -> None:
    from metrics.export import owner
    from tpu_info.contract.captures import RemoteCapture

    seen = []

    def capture(duration_s: float, device: bool, stop, caller) -> RemoteCapture:
        owner.check(caller, writer.capture_secret())  # what the real one checks first
        seen.append(caller.peer)
        return RemoteCapture(trace=b'{"traceEvents": []}')

    exporter = export.start(_snapshot, port=0, capture_fn=capture)
    try:
        discovery.scan(runtime_dir)
        with Client(exporter.address, timeout=5) as c:
            assert c.dialled.startswith("unix:")
            assert json.loads(c.capture(0.1)) == {"traceEvents": []}
        assert [p.partition(":")[0] for p in seen] == ["unix"]  # with the record's secret
    finally:
        exporter.stop(grace=0)
