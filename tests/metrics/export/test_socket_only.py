"""Serving where TCP cannot (issue 40, items 1 and 5): the local socket alone,
its record, the readers that dial it; and libtpu's ports on a TPU host.

The whole program under a real seccomp filter is tests/system/test_no_tcp.py;
here ``binding.no_tcp`` says what the OS would, and the server is real.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from metrics import export
from metrics.export import binding
from metrics.export import discovery as writer
from metrics.export.binding import BindError
from tests.fixtures.sysfs_trees import MACHINES, build_sysfs
from tpu_info.contract import libtpu_ports
from tpu_info.contract.errors import Unreachable
from tpu_info.contract.model import Snapshot
from tpu_info.net import discovery, local_socket
from tpu_info.net.client import Client

NO_AF = "no IPv4 socket can be opened here: Address family not supported by protocol"


def _snapshot(since: int) -> Snapshot:
    return Snapshot(taken_at_unix=7.0)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rt = tmp_path / "rt"
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(rt))
    yield rt
    writer.unpublish()
    local_socket.remember(rt, ())


def test_no_tcp_serves_the_socket_alone_and_its_record_says_why(
        runtime_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(binding, "no_tcp", lambda bind: NO_AF)
    exporter = export.start(_snapshot, port=0)
    try:
        sock = runtime_dir / f"{os.getpid()}.sock"
        assert (exporter.port, exporter.address) == (0, f"unix:{sock.absolute()}")
        record = json.loads((runtime_dir / f"{os.getpid()}.json").read_text())
        assert (record["port"], record["no_tcp"], record["no_tcp_detail"]) == (
            0, "unavailable", NO_AF)
        lines = [r.getMessage() for r in caplog.records if r.name == "metrics.export"]
        assert len(lines) == 1 and "local socket" in lines[0] and NO_AF in lines[0]
        [found] = discovery.scan(runtime_dir, port_owners=_never).processes
        assert found.target == exporter.address and found.no_tcp == "unavailable"
        with Client(found.target, timeout=10) as c:
            assert c.snapshot().taken_at_unix == 7.0
        assert discovery.secret_for(found.target, [found]) == record["capture_secret"]
    finally:
        exporter.stop(grace=0)
    assert not sock.exists() and not (runtime_dir / f"{os.getpid()}.json").exists()


def test_tpu_info_bind_unix_asks_for_the_socket_alone(runtime_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_INFO_BIND", "unix")
    exporter = export.start(_snapshot, port=0)
    try:
        record = json.loads((runtime_dir / f"{os.getpid()}.json").read_text())
        assert (record["port"], record["host"], record["no_tcp"]) == (0, "", "asked")
        with Client(exporter.address, timeout=10) as c:
            assert c.snapshot().taken_at_unix == 7.0
    finally:
        exporter.stop(grace=0)


def test_no_tcp_and_no_socket_fails_and_the_record_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No local socket either (its path too long, say): the record says the server failed."""
    monkeypatch.setattr(binding, "no_tcp", lambda bind: NO_AF)
    monkeypatch.setattr(writer, "socket_path", lambda: None)
    rt = tmp_path / "rt"
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(rt))
    try:
        with pytest.raises(BindError, match="no local socket"):
            export.start(_snapshot, port=0)
        scan = discovery.scan(rt, port_owners=_never)
        [unserved] = scan.unserved
        assert scan.processes == () and "no local socket" in unserved.failed
        assert unserved.target == ""
    finally:
        writer.unpublish()


@pytest.mark.skipif(binding.no_tcp("127.0.0.1") is not None, reason="no TCP on this host")
def test_a_pinned_port_that_is_taken_leaves_a_failed_record(runtime_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(BindError):
            export.start(_snapshot, port=holder.getsockname()[1])
    [unserved] = discovery.scan(runtime_dir).unserved
    assert unserved.pid == os.getpid() and unserved.failed and not unserved.socket


def _never() -> None:
    raise AssertionError("a record with no port needs no look at who holds ports")


# libtpu's ports ------------------------------------------------------------------

class _Recorder:
    """A server that binds whatever port it is asked (0: the next of ``ephemeral``)."""

    asked: list[int | None] = []
    ephemeral: list[int] = []

    def __init__(self, snapshot_fn: object, *, port: int | None, **kwargs: object) -> None:
        self.requested_port = port
        self.asked.append(port)
        self.port = 0
        self.local_socket = ""

    def bind(self) -> int:
        self.port = self.requested_port or self.ephemeral.pop(0)
        return self.port

    def start(self) -> int:
        return self.port

    def stop(self, grace: float | None = 0) -> None:
        pass

    def halt(self) -> None:
        pass


@pytest.fixture
def recorder(runtime_dir: Path, monkeypatch: pytest.MonkeyPatch) -> type[_Recorder]:
    monkeypatch.delenv("TPU_INFO_PORT", raising=False)
    monkeypatch.setattr(export, "_port_free", lambda address, port: True)
    monkeypatch.setattr(binding, "no_tcp", lambda bind: None)  # TCP, as on most hosts
    _Recorder.asked, _Recorder.ephemeral = [], [40001, 40002, 40003]
    return _Recorder


@pytest.mark.parametrize(("machine", "libtpu", "ports", "first"), [
    ("v5e", False, "", 40001),           # TPU chips: never 8431
    ("v5e", False, "8431,40001", 40002),  # nor a port of TPU_RUNTIME_METRICS_PORTS
    ("unknown", True, "40001", 40002),   # no chips (a Google NIC), but libtpu installed
    ("unknown", False, "40001", 8431),   # no TPU host: 8431 when free
    ("empty", False, "", 8431),
])
def test_libtpus_ports_are_never_taken_on_a_tpu_host(
        recorder: type[_Recorder], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        machine: str, libtpu: bool, ports: str, first: int) -> None:
    monkeypatch.setenv("TPU_RUNTIME_METRICS_PORTS", ports)
    sys_root = str(build_sysfs(tmp_path, MACHINES[machine]))
    real = export._libtpu_reserved
    monkeypatch.setattr(export, "_libtpu_reserved", lambda: real(sys_root))
    monkeypatch.setattr(libtpu_ports, "libtpu_installed", lambda: libtpu)
    exporter = export.start(_snapshot, server_factory=recorder)
    try:
        assert exporter.port == first
        assert 8431 not in recorder.asked or first == 8431
    finally:
        exporter.stop(grace=0)


def test_a_pinned_port_is_the_users_choice_even_libtpus(
        recorder: type[_Recorder], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys_root = str(build_sysfs(tmp_path, MACHINES["v5e"]))
    real = export._libtpu_reserved
    monkeypatch.setattr(export, "_libtpu_reserved", lambda: real(sys_root))
    exporter = export.start(_snapshot, port=8431, server_factory=recorder)
    try:
        assert exporter.port == 8431 and recorder.asked == [8431]
    finally:
        exporter.stop(grace=0)


def test_libtpu_ports_and_chips() -> None:
    from tpu_info.host.devices import GENERATIONS

    assert {g.pci_device for g in GENERATIONS} == libtpu_ports.TPU_PCI_DEVICES
    assert libtpu_ports.libtpu_ports({"TPU_RUNTIME_METRICS_PORTS": " 8432,x,0,8431,70000,"}) \
        == (8431, 8432)
    assert libtpu_ports.libtpu_ports({}) == (8431,)


def test_a_unix_target_is_dialled_only_when_it_is_this_users_private_socket(
        tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(private / "1.sock"))
        assert local_socket.unix_path(f"unix:{private}/1.sock") == private / "1.sock"
    (private / "1.sock").unlink()
    with pytest.raises(Unreachable, match="no socket there"):
        Client(f"unix:{private}/1.sock")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(open_dir / "2.sock"))
        with pytest.raises(Unreachable, match="group or world writable"):
            Client(f"unix:{open_dir}/2.sock")
    (private / "3.sock").write_text("")
    with pytest.raises(ValueError, match="not a socket"):
        local_socket.unix_path(f"unix:{private}/3.sock")


# Readers ---------------------------------------------------------------------------

def _record(rdir: Path, **fields: object) -> Path:
    rec = writer.record(0, "", "jax", {}, pid=4242, argv=["train.py"], start_time=1.0)
    rec.update(fields)
    path = rdir / "4242.json"
    path.write_text(json.dumps(rec))
    return path


def test_what_a_record_without_a_port_must_say(tmp_path: Path) -> None:
    from tpu_info.contract.discovery_record import parse_record

    sock = str(tmp_path / "4242.sock")
    p = parse_record(json.loads(_record(tmp_path, socket=sock, no_tcp="unavailable")
                                .read_text()), tmp_path / "4242.json")
    assert p.target == f"unix:{sock}" and p.served
    failed = parse_record(json.loads(_record(tmp_path, failed="cannot bind").read_text()),
                          tmp_path / "4242.json")
    assert failed.target == "" and not failed.served
    for bad in ({}, {"socket": sock, "no_tcp": "maybe"}, {"failed": "\x1b[2J"}):
        with pytest.raises(ValueError):
            parse_record(json.loads(_record(tmp_path, **bad).read_text()),
                         tmp_path / "4242.json")


def test_unix_targets_are_checked_and_shown_by_their_socket() -> None:
    from tpu_info.net.targets import label, normalize, validate_target

    assert validate_target("unix:///run/x/1.sock") == "unix:/run/x/1.sock"
    assert validate_target("unix:1.sock") == "unix:1.sock"
    assert label("unix:/run/user/1000/tpu-info/4242.sock") == "unix:4242.sock"
    assert label("127.0.0.1:8431") == "127.0.0.1:8431"
    assert normalize("unix:/a/1.sock") == "unix:/a/1.sock"
    for bad in ("unix:", "unix:/a/\x00.sock", "unix:/" + "a" * 120):
        with pytest.raises(ValueError):
            validate_target(bad)


def test_doctor_says_how_each_program_is_served(rdir: Path) -> None:
    from tpu_info.commands.gather import libtpu_targets, serving_notes
    from tpu_info.net.discovery import Scan

    def p(**fields: object):  # noqa: ANN202
        from tpu_info.contract.discovery_record import parse_record

        return parse_record(json.loads(_record(rdir, **fields).read_text()), rdir / "4242.json")

    tcp = p(port=8000, host="127.0.0.1", socket=str(rdir / "4242.sock"))
    alone = p(socket=str(rdir / "4242.sock"), no_tcp="unavailable", no_tcp_detail="EAFNOSUPPORT")
    asked = p(socket=str(rdir / "4242.sock"), no_tcp="asked")
    failed = p(failed="cannot bind 127.0.0.1:9")
    notes = dict(serving_notes(Scan(rdir, (tcp,), unserved=(failed,))))
    assert notes == {"pid 4242 (127.0.0.1:8000)": "served on TCP port 8000 and on its local "
                     "socket", "pid 4242": "hooked, but its metrics server did not start: "
                     "cannot bind 127.0.0.1:9 (see that program's stderr)"}
    [(who, why)] = serving_notes(Scan(rdir, (alone,)))
    assert who == "pid 4242 (unix:4242.sock)" and "no TCP socket can be opened on this " \
        "host (EAFNOSUPPORT)" in why
    assert "TPU_INFO_BIND=unix" in serving_notes(Scan(rdir, (asked,)))[0][1]
    assert libtpu_targets({"TPU_RUNTIME_METRICS_PORTS": "8432"}) == ["localhost:8431",
                                                                     "localhost:8432"]


def test_the_exporter_asks_a_program_without_a_port(rdir: Path) -> None:
    from tpu_info.commands.exporter_targets import TargetChooser
    from tpu_info.contract.discovery_record import parse_record

    p = parse_record(json.loads(_record(rdir, socket=str(rdir / "4242.sock"),
                                        no_tcp="unavailable").read_text()), rdir / "4242.json")
    chooser = TargetChooser()
    asked, skipped = chooser.choose([p], {8431: {0}})
    assert asked == [p] and not skipped
