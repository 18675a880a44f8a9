"""Who listens on a local TCP port, read from ``/proc`` (Linux).

``/proc/net/tcp`` and ``/proc/net/tcp6`` list every listening socket with its
owner's uid and its inode; ``/proc/<pid>/fd`` maps the inode to the processes
holding it (readable for this user's processes, or for root), and
``/proc/<pid>/maps`` says whether one of them has ``libtpu*.so`` loaded. This
is how ``tpu-info`` decides whether ``localhost:8431`` is libtpu worth reading
(:func:`judge_libtpu_port`) and whether a discovery record's port is still held
by this user. Where ``/proc/net/tcp`` cannot be read, :meth:`ProcNet.listeners`
returns ``None``: "cannot tell".

Example:
    >>> net = ProcNet("/proc")                           # doctest: +SKIP
    >>> [(s.uid, s.pid, s.libtpu) for s in net.listeners(8431)]  # doctest: +SKIP
    [(1000, 4242, True)]
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

_LISTEN = "0A"
_LIBTPU = re.compile(rb"/libtpu[^/\s]*\.so")
_MAPS_CHUNK = 1 << 16
_ANY = (ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::"))


def _address(field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``/proc/net/tcp``'s hex address: 32-bit words in host byte order."""
    raw = bytes.fromhex(field)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def no_tcp_reason() -> str | None:
    """Why no TCP socket can be opened on this host (gVisor, a seccomp'd
    container: the OS's words), or None where one can. Nothing listens on a
    TCP port there, libtpu's metric service included."""
    import socket

    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except OSError as e:
        return e.strerror or str(e)
    return None


def reaches_loopback(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a socket bound to ``addr`` answers ``localhost``: a loopback
    address or a wildcard (IPv4-mapped ones included)."""
    mapped = getattr(addr, "ipv4_mapped", None)
    addr = mapped or addr
    return addr.is_loopback or addr in _ANY


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket: its port, owner uid and inode, and (when this
    user may look) a process holding it and whether libtpu is loaded there.

    Attributes:
        loopback: bound to a loopback or wildcard address (``localhost`` reaches it).
        pid: a process holding the socket; None when none is visible to us.
        command: that process's name (``/proc/<pid>/comm``).
        libtpu: ``libtpu*.so`` mapped in it; None when its maps could not be read.
    """

    port: int
    uid: int
    inode: int
    loopback: bool = True
    pid: int | None = None
    command: str = ""
    libtpu: bool | None = None

    def owner(self) -> str:
        """``uid 1000 (alice), pid 4242 (python3)`` as far as known."""
        try:
            import pwd

            who = f"uid {self.uid} ({pwd.getpwuid(self.uid).pw_name})"
        except (ImportError, KeyError):
            who = f"uid {self.uid}"
        if self.pid is not None:
            who += f", pid {self.pid}" + (f" ({self.command})" if self.command else "")
        return who


@dataclass(frozen=True, slots=True)
class PortVerdict:
    """Whether to read a local port as libtpu, and the one line that says why."""

    read: bool
    why: str
    listening: bool = True


class ProcNet:
    """Listening sockets and their owners, from ``proc_root`` (default ``/proc``).

    Which process holds a socket is looked up once per socket (by inode) and
    kept while that socket listens, so a loop that asks every few seconds
    reads ``/proc/net/tcp`` and nothing else; and one read of it answers every
    question asked within ``fresh_s`` (a host with thousands of connections
    makes the kernel spend tens of milliseconds writing the table).
    """

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc", *,
                 fresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(proc_root)
        self.fresh_s = fresh_s
        self.clock = clock
        self._holders: dict[int, Listener] = {}
        self._read_at: float | None = None
        self._socks: list[Listener] | None = None

    def sockets(self) -> list[Listener] | None:
        """Every listening TCP socket that ``localhost`` reaches (without
        holders); None when ``/proc/net/tcp`` and ``tcp6`` are both unreadable.
        A socket bound to another address (``10.0.0.5:8431``) is left out: it
        neither answers ``localhost`` nor keeps another from binding loopback."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < self.fresh_s:
            return self._socks
        self._read_at, self._socks = now, self._read_sockets()
        return self._socks

    def refresh(self) -> None:
        """The next read is a fresh one (a program just started: its port is
        newer than the table kept)."""
        self._read_at = None

    def _read_sockets(self) -> list[Listener] | None:
        out: list[Listener] = []
        readable = False
        for name in ("tcp", "tcp6"):
            try:
                text = (self.root / "net" / name).read_text(encoding="ascii", errors="replace")
            except OSError:
                continue
            readable = True
            for line in text.splitlines()[1:]:
                if f" {_LISTEN} " not in line:
                    continue  # most lines are connections; only listeners matter
                fields = line.split()
                if len(fields) < 10 or fields[3] != _LISTEN:
                    continue
                try:
                    addr, _, port = fields[1].rpartition(":")
                    sock = Listener(int(port, 16), int(fields[7]), int(fields[9]),
                                    reaches_loopback(_address(addr)))
                except ValueError:
                    continue
                if sock.loopback:
                    out.append(sock)
        return out if readable else None

    def owners_by_port(self) -> dict[int, set[int]] | None:
        """``{port: uids of the sockets listening on it}``; None: cannot tell."""
        socks = self.sockets()
        if socks is None:
            return None
        out: dict[int, set[int]] = {}
        for s in socks:
            out.setdefault(s.port, set()).add(s.uid)
        return out

    def listeners(self, port: int) -> list[Listener] | None:
        """The sockets listening on ``port``, with their holders where visible."""
        socks = self.sockets()
        if socks is None:
            return None
        live = {s.inode for s in socks}
        for inode in [i for i in self._holders if i not in live]:
            del self._holders[inode]
        mine = [s for s in socks if s.port == port]
        unknown = {s.inode: s for s in mine if s.inode not in self._holders}
        if unknown:
            found = self._find_holders(unknown)
            for inode, s in unknown.items():
                self._holders[inode] = found.get(inode, s)
        return [self._holders.get(s.inode, s) for s in mine]

    def _find_holders(self, wanted: dict[int, Listener]) -> dict[int, Listener]:
        """Walks ``/proc/<pid>/fd`` of the processes we may read (the
        sockets' owners' first) until every wanted inode has a holder."""
        links = {f"socket:[{inode}]": inode for inode in wanted}
        uids = {s.uid for s in wanted.values()}
        try:
            pids = [int(n) for n in os.listdir(self.root) if n.isdigit()]
        except OSError:
            return {}

        def owned_first(pid: int) -> int:
            try:
                return 0 if os.stat(self.root / str(pid)).st_uid in uids else 1
            except OSError:
                return 2

        found: dict[int, Listener] = {}
        for pid in sorted(pids, key=owned_first):
            fd_dir = self.root / str(pid) / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue  # another user's process (we are not root), or gone
            for fd in fds:
                try:
                    inode = links.get(os.readlink(fd_dir / fd))
                except OSError:
                    continue
                if inode is not None and inode not in found:
                    found[inode] = replace(wanted[inode], pid=pid,
                                           command=self._command(pid),
                                           libtpu=self._has_libtpu(pid))
            if len(found) == len(wanted):
                break
        return found

    def parent(self, pid: int) -> int | None:
        """``pid``'s parent (``/proc/<pid>/stat``), or None when it is gone."""
        try:
            stat = (self.root / str(pid) / "stat").read_text(errors="replace")
            return int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def _command(self, pid: int) -> str:
        try:
            name = (self.root / str(pid) / "comm").read_text(errors="replace").strip()
        except OSError:
            return ""
        return "".join(c if c.isprintable() else "?" for c in name)[:64]

    def _has_libtpu(self, pid: int) -> bool | None:
        try:
            with open(self.root / str(pid) / "maps", "rb") as f:
                tail = b""
                while chunk := f.read(_MAPS_CHUNK):
                    if _LIBTPU.search(tail + chunk):
                        return True
                    tail = chunk[-256:]
        except OSError:
            return None
        return False


def judge_libtpu_port(listeners: list[Listener] | None, port: int, uid: int) -> PortVerdict:
    """Whether ``localhost:port`` is libtpu that this user may read by default.

    Every socket listening on ``port`` must be this user's or root's, and
    where its process is visible, have ``libtpu*.so`` loaded. On a TPU VM
    libtpu runs inside the user's own training program (same uid); a root
    service is trusted as root is trusted anyway (root could change this very
    program), but is still checked for libtpu when we can see it (when we are
    root). Another user's socket is never read by default, libtpu or not: its
    owner controls what it sends.
    """
    remedy = f"; to read it anyway: tpu-info --target localhost:{port}"
    if listeners is None:
        return PortVerdict(False, f"not read: cannot tell who listens on port {port} "
                           f"(/proc/net/tcp is not readable){remedy}")
    if not listeners:
        return PortVerdict(False, f"nothing listens on localhost:{port}", listening=False)
    for s in listeners:
        if s.uid not in (uid, 0):
            return PortVerdict(False, f"not read: {s.owner()} listens on port {port}: not "
                               "you or root, so it could pose as libtpu" + remedy)
        if s.libtpu is False:
            return PortVerdict(False, f"not read: {s.owner()} listens on port {port} without "
                               "libtpu loaded, and no discovery record of yours names it" + remedy)
    s = listeners[0]
    how = "libtpu loaded" if s.libtpu else (
        "its process is not visible" if s.pid is None else "its memory map is not readable")
    return PortVerdict(True, f"read as libtpu: {s.owner()} listens on port {port} ({how})")
