"""localhost:8431 is read by default only when it is libtpu this user may trust.

Who listens is read from /proc: fixture trees stand in for other users'
processes (this machine has one uid), real sockets and real hooked processes
(one with a file named libtpu.so mapped, one without) for our own, and, as
root, a real other-uid server on the real port 8431 inside a private network
namespace for the whole command.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tpu_info.commands.gather import gather, local_targets
from tpu_info.host.listeners import ProcNet, judge_libtpu_port

ME = 1000
OTHER = 54321
LIBTPU_MAP = ("7f0000000000-7f0000100000 r-xp 00000000 08:01 1234  "
              "/home/u/.venv/lib/python3.11/site-packages/libtpu/libtpu.so\n")
PLAIN_MAP = "7f0000000000-7f0000100000 r-xp 00000000 08:01 99  /usr/lib/libc.so.6\n"


def _hex_port(port: int) -> str:
    return f"{port:04X}"


def fake_proc(root: Path, sockets: list[tuple[int, int, int]], procs: dict[int, dict] | None = None,
              tcp6: list[tuple[int, int, int]] | None = None) -> Path:
    """A /proc tree: ``sockets`` are (port, uid, inode) listening in net/tcp
    (``tcp6`` likewise); ``procs`` maps pid -> {"inodes", "maps", "comm"}."""
    header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
              "   uid  timeout inode\n")
    (root / "net").mkdir(parents=True)
    for name, rows, addr in (("tcp", sockets, "0100007F"),
                             ("tcp6", tcp6 or [], "00000000000000000000000001000000")):
        lines = [header]
        for n, (port, uid, inode) in enumerate(rows):
            lines.append(f"   {n}: {addr}:{_hex_port(port)} {'0' * len(addr)}:0000 0A "
                         f"00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} 1 "
                         "0000000000000000 100 0 0 10 0\n")
        # A connected (not listening) socket on the same port is ignored.
        lines.append(f"   9: {addr}:{_hex_port(8431)} {addr}:D431 01 00000000:00000000 "
                     f"00:00000000 00000000 {OTHER:5d}        0 4242 1 0 20 4 30 10 -1\n")
        (root / "net" / name).write_text("".join(lines))
    for pid, info in (procs or {}).items():
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        for fd, inode in enumerate(info.get("inodes", ()), start=3):
            (d / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")
        (d / "fd" / "0").symlink_to("/dev/null")
        (d / "comm").write_text(info.get("comm", "python3") + "\n")
        if "maps" in info:
            (d / "maps").write_text(info["maps"])
    return root


@pytest.mark.parametrize("uid,maps,visible,read,needle", [
    (OTHER, LIBTPU_MAP, True, False, "uid 54321"),       # another user's libtpu: theirs
    (OTHER, None, False, False, "not you or root"),
    (ME, LIBTPU_MAP, True, True, "libtpu loaded"),      # the usual TPU VM case
    (ME, PLAIN_MAP, True, False, "without libtpu loaded"),
    (ME, None, False, True, "not visible"),
    (ME, None, True, True, "not readable"),
    (0, LIBTPU_MAP, True, True, "libtpu loaded"),       # a root service with libtpu
    (0, PLAIN_MAP, True, False, "without libtpu loaded"),
    (0, None, False, True, "not visible"),              # root's, as seen by a user
])
def test_who_may_be_read_as_libtpu(tmp_path: Path, uid: int, maps: str | None, visible: bool,
                                   read: bool, needle: str):
    procs = {4242: {"inodes": [777], **({"maps": maps} if maps else {})}} if visible else {}
    net = ProcNet(fake_proc(tmp_path / "proc", [(8431, uid, 777)], procs))
    [s] = net.listeners(8431)
    assert (s.uid, s.inode, s.pid) == (uid, 777, 4242 if visible else None)
    v = judge_libtpu_port(net.listeners(8431), 8431, ME)
    assert v.read is read and needle in v.why, v.why
    if not read:
        assert v.why.endswith("to read it anyway: tpu-info --target localhost:8431")
        assert "\n" not in v.why


def test_nothing_listening_or_no_proc(tmp_path: Path):
    net = ProcNet(fake_proc(tmp_path / "proc", [(9999, ME, 5)]))
    v = judge_libtpu_port(net.listeners(8431), 8431, ME)
    assert not v.read and not v.listening and "nothing listens" in v.why
    v = judge_libtpu_port(ProcNet(tmp_path / "nowhere").listeners(8431), 8431, ME)
    assert not v.read and "cannot tell" in v.why


def test_another_users_socket_on_ipv6_loopback_spoils_it(tmp_path: Path):
    root = fake_proc(tmp_path / "proc", [(8431, ME, 1)], {10: {"inodes": [1], "maps": LIBTPU_MAP}},
                     tcp6=[(8431, OTHER, 2)])
    v = judge_libtpu_port(ProcNet(root).listeners(8431), 8431, ME)
    assert not v.read and "uid 54321" in v.why


def test_holders_are_looked_up_once_per_socket(tmp_path: Path):
    root = fake_proc(tmp_path / "proc", [(8431, ME, 777)],
                     {4242: {"inodes": [777], "maps": LIBTPU_MAP}})
    net = ProcNet(root, fresh_s=0)  # every question reads /proc/net/tcp again
    assert net.listeners(8431)[0].pid == 4242
    shutil.rmtree(root / "4242")  # a second look must not walk /proc/<pid>/fd again
    assert net.listeners(8431)[0].pid == 4242
    tcp = root / "net" / "tcp"
    tcp.write_text(tcp.read_text().replace(" 777 ", " 778 "))  # a new socket
    assert net.listeners(8431)[0].pid is None


def test_record_whose_port_another_user_holds_is_not_read(tmp_path: Path):
    """The hook's server died (or moved) and another user took its port."""
    from tpu_info.net import discovery

    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    pid = os.getpid()
    (rt / f"{pid}.json").write_text(json.dumps({
        "schema": 1, "pid": pid, "port": 5555, "host": "127.0.0.1", "argv": ["t.py"],
        "engine": "jax", "versions": {}, "start_time": 0.0}))
    net = ProcNet(fake_proc(tmp_path / "proc", [(5555, OTHER, 1)]))
    s = discovery.scan(rt, port_owners=net.owners_by_port)
    assert s.processes == ()
    [k] = s.skipped
    assert k.reason == discovery.PORT_TAKEN and "uid 54321" in k.detail and not k.removed
    assert (rt / f"{pid}.json").exists()
    picked = local_targets(s, net, libtpu_target=None)
    assert picked.processes == [] and any("port 5555" in why for _, why in picked.notes)
    net = ProcNet(fake_proc(tmp_path / "proc2", [(5555, os.geteuid(), 1)]))
    assert [p.port for p in discovery.scan(rt, port_owners=net.owners_by_port).processes] == [
        5555]


# Real sockets ---------------------------------------------------------------------

class Listener:
    """A TCP server that counts connections and closes them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _inode_of(port: int) -> int:
    for name in ("tcp", "tcp6"):
        for line in Path("/proc/net", name).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port:
                return int(f[9])
    raise AssertionError(f"port {port} not in /proc/net/tcp")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_gather_never_connects_to_another_users_server(tmp_path: Path):
    """The socket is real; /proc says another user holds it."""
    fake = Listener()
    try:
        root = fake_proc(tmp_path / "proc", [(fake.port, OTHER, _inode_of(fake.port))])
        g = gather([], timeout=2, use_discovery=False, scan_devices=False, proc_root=root,
                   libtpu_target=f"localhost:{fake.port}")
        assert g.views == [] and fake.connections == 0
        [(where, why)] = [n for n in g.notes if n[0] == f"localhost:{fake.port}"]
        assert "not read: uid 54321" in why and f"--target localhost:{fake.port}" in why
        # Named explicitly, it is read (and fails: it is no monitor).
        g = gather([f"localhost:{fake.port}"], timeout=2, use_discovery=False,
                   scan_devices=False, proc_root=root, libtpu_target=f"localhost:{fake.port}")
        assert fake.connections >= 1 and [v.target for v in g.failed] == [
            f"localhost:{fake.port}"]
        assert any("you named it" in why for _, why in g.notes)
    finally:
        fake.close()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_own_socket_without_libtpu_is_not_read():
    fake = Listener()
    try:
        net = ProcNet()
        [s] = net.listeners(fake.port)
        assert (s.uid, s.pid, s.libtpu) == (os.geteuid(), os.getpid(), False)
        g = gather([], timeout=2, use_discovery=False, scan_devices=False,
                   libtpu_target=f"localhost:{fake.port}")
        assert fake.connections == 0
        assert any("without libtpu loaded" in why for _, why in g.notes)
    finally:
        fake.close()


HOOKED = r"""
import mmap, sys, metrics
if sys.argv[1] != "-":
    f = open(sys.argv[1], "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)   # libtpu*.so in /proc/self/maps
metrics.install(engines=[])
print(metrics.exporter().address.rpartition(":")[2], flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_own_process_with_libtpu_loaded_is_read(tmp_path: Path):
    lib = tmp_path / "site-packages" / "libtpu" / "libtpu.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF" + b"\0" * 4092)
    # Served in the program, as libtpu serves from the process that loaded it
    # (a helper would be the listener, without libtpu mapped).
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_PORT="0", TPU_INFO_SERVE="thread",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    procs = [subprocess.Popen([sys.executable, "-c", HOOKED, arg], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for arg in (str(lib), "-")]
    try:
        with_lib, without = (int(p.stdout.readline()) for p in procs)
        g = gather([], timeout=5, use_discovery=False, scan_devices=False,
                   libtpu_target=f"localhost:{with_lib}")
        assert [v.target for v in g.views] == [f"localhost:{with_lib}"] and not g.failed
        assert any("libtpu loaded" in why and str(procs[0].pid) in why for _, why in g.notes)
        g = gather([], timeout=5, use_discovery=False, scan_devices=False,
                   libtpu_target=f"localhost:{without}")
        assert g.views == []
        assert any(f"pid {procs[1].pid}" in why and "without libtpu" in why
                   for _, why in g.notes)
        # Its own discovery record names the port: then it is read.
        g = gather([], timeout=5, scan_devices=False, runtime_dir=tmp_path / "rt",
                   libtpu_target=f"localhost:{without}")
        assert sorted(v.target.rpartition(":")[2] for v in g.views) == sorted(
            [str(with_lib), str(without)])
        assert any("a discovery record of yours names this port" in why
                   for _, why in g.notes)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)


NETNS = r"""
import json, os, signal, socket, subprocess, sys, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:                       # another user's fake "libtpu" on the real port
    os.setgid(54321)
    os.setuid(54321)
    s = socket.socket()
    s.bind(("127.0.0.1", 8431))
    s.listen()
    os.write(w, b"R")
    while True:
        c, _ = s.accept()
        os.write(w, b"C")
        c.close()
os.read(r, 1)
env = dict(os.environ, TPU_INFO_RUNTIME_DIR="/nonexistent-tpu-info-netns", COLUMNS="200")
runs = {name: subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "2", *args],
                             capture_output=True, text=True, env=env)
        for name, args in (("doctor", ["doctor"]), ("plain", []), ("json", ["--json"]))}
time.sleep(0.2)
os.set_blocking(r, False)

def connections():
    try:
        return os.read(r, 1000).count(b"C")
    except BlockingIOError:
        return 0

by_default = connections()
named = subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "2", "--no-discovery",
                        "--target", "localhost:8431"], capture_output=True, text=True, env=env)
time.sleep(0.2)
print(json.dumps({"connections_by_default": by_default, "connections_named": connections(),
                  "doctor": runs["doctor"].stdout, "plain_rc": runs["plain"].returncode,
                  "json": runs["json"].stdout, "named_rc": named.returncode,
                  "stderr": runs["plain"].stderr + runs["doctor"].stderr}))
os.kill(pid, signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                    or shutil.which("ip") is None, reason="needs root and unshare -n")
def test_plain_tpu_info_ignores_another_users_server_on_8431():
    """In a private network namespace (8431 of this machine stays untouched),
    uid 54321 listens on 127.0.0.1:8431; plain `tpu-info`, `--json` and
    `doctor` never connect, doctor says why, `--target localhost:8431` does."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", NETNS], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("unshare -n is not permitted here")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["connections_by_default"] == 0, out
    assert out["plain_rc"] == 0 and "Traceback" not in out["stderr"]
    [line] = [ln for ln in out["doctor"].splitlines() if "localhost:8431" in ln]
    assert "not read: uid 54321" in line and "pid " in line
    assert line.endswith("to read it anyway: tpu-info --target localhost:8431")
    notes = json.loads(out["json"])["notes"]
    assert any(n["where"] == "localhost:8431" and "not read" in n["reason"] for n in notes)
    assert out["named_rc"] == 1 and out["connections_named"] >= 1  # named: read; no monitor


def test_one_read_answers_every_question_while_fresh(tmp_path: Path):
    now = [0.0]
    root = fake_proc(tmp_path / "proc", [(8431, ME, 1)])
    net = ProcNet(root, fresh_s=1.0, clock=lambda: now[0])
    assert net.owners_by_port() == {8431: {ME}}
    (root / "net" / "tcp").write_text("header\n")
    assert [s.uid for s in net.listeners(8431)] == [ME]  # the same look
    now[0] = 1.5
    assert net.listeners(8431) == []


def test_rescanner_notices_a_port_taken_while_nothing_else_changed(tmp_path: Path):
    import time

    from tpu_info.net import discovery

    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    pid = os.getpid()
    (rt / f"{pid}.json").write_text(json.dumps({
        "schema": 1, "pid": pid, "port": 5555, "host": "127.0.0.1", "argv": ["t.py"],
        "engine": "jax", "versions": {}, "start_time": 0.0}))
    root = fake_proc(tmp_path / "proc", [(5555, os.geteuid(), 1)])
    r = discovery.Rescanner(rt, port_owners=ProcNet(root, fresh_s=0).owners_by_port,
                            clock=lambda: time.time() + 60)
    assert len(r.scan().processes) == 1 and r.scan().files_read == 0
    tcp = root / "net" / "tcp"
    tcp.write_text(tcp.read_text().replace(f"{os.geteuid():5d}        0 1 ",
                                           f"{OTHER:5d}        0 1 "))
    s = r.scan()
    assert s.processes == () and s.skipped[0].reason == discovery.PORT_TAKEN


def test_only_sockets_that_localhost_reaches_count(tmp_path: Path):
    root = fake_proc(tmp_path / "proc", [(8431, ME, 1)], {10: {"inodes": [1], "maps": LIBTPU_MAP}})
    tcp = root / "net" / "tcp"
    other_address = tcp.read_text().splitlines()[1].replace("0100007F:", "0500000A:").replace(
        f"{ME:5d}        0 1 ", f"{OTHER:5d}        0 2 ")  # 10.0.0.5:8431, another user
    tcp.write_text(tcp.read_text() + other_address + "\n")
    net = ProcNet(root)
    assert [(s.uid, s.inode) for s in net.listeners(8431)] == [(ME, 1)]
    assert judge_libtpu_port(net.listeners(8431), 8431, ME).read


@pytest.mark.skipif(not Path("/proc/net/tcp6").exists(), reason="needs Linux /proc and IPv6")
@pytest.mark.parametrize("family,address", [(socket.AF_INET, "127.0.0.1"),
                                            (socket.AF_INET, "0.0.0.0"),
                                            (socket.AF_INET6, "::1"), (socket.AF_INET6, "::")])
def test_real_sockets_are_found_with_their_holder(family: int, address: str):
    with socket.socket(family) as s:
        try:
            s.bind((address, 0))
        except OSError:
            pytest.skip(f"cannot bind {address}")
        s.listen()
        [found] = ProcNet().listeners(s.getsockname()[1])
        assert (found.uid, found.pid, found.loopback) == (os.geteuid(), os.getpid(), True)
