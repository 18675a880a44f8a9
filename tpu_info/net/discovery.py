"""Finds hooked processes on this host through their discovery records.

Each hooked process writes ``<pid>.json`` into a private runtime directory
and removes it at exit; the writer is ``metrics.export.discovery``, and the
rules both sides share (where the directory is, what makes it private, what
a valid record looks like) are :mod:`tpu_info.contract.discovery_record`. This module
is the reader. It imports neither ``metrics`` nor torch nor jax.
:func:`secret_for` finds the capture secret of a target's record.

A record is skipped, with a reason kept in :attr:`Scan.skipped` and logged,
when its pid is dead (or was reused by a younger process), when it is corrupt,
when it is not owned by the current user, when it is a symlink or not a
regular file, or when another user's socket listens on its port (its server
is gone and someone else holds the port: never read). A directory that is a
symlink, owned by someone else, or group/world writable is not read at all.

A record of a dead process is removed when found (with the local socket
file its process left beside it, :mod:`tpu_info.net.local_socket`), if it is this user's own
regular file (never through a symlink, never another user's), it is still the
file that was read (same inode, size and times), and no socket of this user
listens on its port (a live process in another pid namespace that shares the
directory keeps its record). A record of a live process is never removed. A ``<pid>.sock`` without a
record (its process was killed before writing one, or could not write it) is
removed on the same terms once its pid is gone.
:class:`Rescanner` is :func:`scan` for loops: it reads the records again only
when the directory changed.

Example:
    >>> from tpu_info import discovery
    >>> for p in discovery.find_processes():      # doctest: +SKIP
    ...     print(p.pid, f"{p.host}:{p.port}", p.engine)
    4242 localhost:8431 jax
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tpu_info.contract.discovery_record import (
    MAX_RECORD_BYTES,
    SCHEMA_VERSION,
    DiscoveredProcess,
    parse_record,
    process_start_unix,
    runtime_dir,
    unsafe_directory_reason,
)
from tpu_info.net import local_socket
from tpu_info.net.targets import is_loopback_host, is_unix

log = logging.getLogger("tpu_info.net.discovery")

# A record older than its process by more than this means the pid was reused.
_PID_REUSE_SLACK_S = 2.0

# Reasons a record was skipped (stable strings: `tpu-info doctor` groups by them).
DEAD = "dead pid"
CORRUPT = "corrupt"
FOREIGN = "not owned by the current user"
SYMLINK = "symlink"
NOT_A_FILE = "not a regular file"
UNSUPPORTED = "unsupported schema"
UNREADABLE = "unreadable"
PORT_TAKEN = "port held by another user"
BAD_DIRECTORY = "unsafe runtime directory"


@dataclass(frozen=True, slots=True)
class Skipped:
    """A record (or the directory) that was not used, and why."""

    path: Path
    reason: str
    detail: str = ""
    removed: bool = False

    def __str__(self) -> str:
        detail = ", ".join(d for d in (self.detail, "removed" if self.removed else "") if d)
        return f"{self.path}: {self.reason}" + (f" ({detail})" if detail else "")


@dataclass(frozen=True, slots=True)
class Scan:
    """What one look at the runtime directory found."""

    directory: Path
    processes: tuple[DiscoveredProcess, ...] = ()
    skipped: tuple[Skipped, ...] = field(default_factory=tuple)
    files_read: int = 0
    # Live hooked processes whose server did not start (their records say
    # why: ``failed``); nothing to read, only to tell (``doctor``).
    unserved: tuple[DiscoveredProcess, ...] = ()
    # Sockets of exited processes without a record, removed by this look.
    sockets_removed: int = 0

    @property
    def removed(self) -> int:
        """How many records of dead processes this look removed."""
        return sum(1 for s in self.skipped if s.removed)

    def summary(self, first: int = 5) -> list[str]:
        """What was skipped, in at most ``first + 2`` lines: removed records
        counted in one line, the first ``first`` others one line each, the
        rest counted by reason (``9,998 more records skipped: ...``)."""
        lines = []
        if self.removed or self.sockets_removed:
            what = [f"{n:,} {kind}" for n, kind in ((self.removed, "record(s)"),
                                                   (self.sockets_removed, "lone socket(s)")) if n]
            lines.append(f"removed {' and '.join(what)} of exited processes from "
                         f"{self.directory}")
        kept = [s for s in self.skipped if not s.removed
                and not (s.reason == UNREADABLE and s.detail == "vanished")]
        lines += [str(s) for s in kept[:first]]
        if len(kept) > first:
            by_reason = Counter(s.reason for s in kept[first:])
            lines.append(f"{len(kept) - first:,} more records skipped: " + ", ".join(
                f"{n:,} {reason}" for reason, n in by_reason.most_common()))
        return lines


def pid_alive(pid: int, start_time: float | None = None) -> bool:
    """Whether ``pid`` runs and (when ``start_time`` is known) is not a
    younger process that reused the pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return False
    if start_time:
        try:
            created = process_start_unix(pid)
        except Exception:  # noqa: BLE001 - no psutil or a race: trust kill(0)
            return True
        if created > start_time + _PID_REUSE_SLACK_S:
            return False
    return True


def _read_record(path: Path, uid: int) -> DiscoveredProcess | Skipped:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Skipped(path, UNREADABLE, "vanished")  # its process just exited
    if stat.S_ISLNK(st.st_mode):
        return Skipped(path, SYMLINK)
    if not stat.S_ISREG(st.st_mode):
        return Skipped(path, NOT_A_FILE)
    if st.st_uid != uid:
        return Skipped(path, FOREIGN, f"owned by uid {st.st_uid}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            fst = os.fstat(f.fileno())
            if fst.st_uid != uid or not stat.S_ISREG(fst.st_mode):  # swapped after lstat
                return Skipped(path, FOREIGN, f"owned by uid {fst.st_uid}")
            raw = f.read(MAX_RECORD_BYTES + 1)
    except OSError as e:
        return Skipped(path, UNREADABLE, e.strerror or str(e))
    if len(raw) > MAX_RECORD_BYTES:
        return Skipped(path, CORRUPT, f"larger than {MAX_RECORD_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return Skipped(path, CORRUPT, f"not JSON: {e}")
    if isinstance(data, dict) and isinstance(data.get("schema"), int) \
            and data["schema"] != SCHEMA_VERSION:
        return Skipped(path, UNSUPPORTED, f"schema {data['schema']}, expected {SCHEMA_VERSION}")
    try:
        return parse_record(data, path)
    except ValueError as e:
        return Skipped(path, CORRUPT, str(e))


def _identity(path: Path) -> tuple[int, ...] | None:
    """What changes when a file is replaced (rename) or rewritten in place."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid,
            stat.S_IFMT(st.st_mode))


def _remove_dead(path: Path, seen: tuple[int, ...] | None, uid: int) -> bool:
    """Unlinks ``path`` if it is still the file judged dead (``seen``, taken
    before it was read) and this user's regular file: a process that reused
    the pid renames in a new file, which has another identity. ``lstat``
    only: a symlink is never followed."""
    if seen is None or seen[5] != uid or seen[6] != stat.S_IFREG or _identity(path) != seen:
        return False
    try:
        os.unlink(path)
    except OSError:
        return False
    sock = path.with_suffix(".sock")  # left by a killed process (its exit removes it)
    try:
        st = sock.lstat()
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid:
            os.unlink(sock)
    except OSError:
        pass
    return True


def _remove_lone_sockets(path: Path, listed: Iterable[str], uid: int,
                        alive: Callable[[int, float], bool]) -> int:
    """Removes the ``<pid>.sock`` files without a record whose process is
    gone (killed before it wrote its record, or whose record could not be
    written): this user's sockets only, ``lstat`` only, judged as a record
    is, with the socket's creation standing for the start time (a younger
    process that reused the pid is no owner of it). Returns how many."""
    names = set(listed)
    removed = 0
    for name in names:
        stem, dot, suffix = name.partition(".")
        if suffix != "sock" or not stem.isdigit() or f"{stem}.json" in names:
            continue
        sock = path / name
        try:
            st = sock.lstat()
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid \
                    or alive(int(stem), st.st_mtime):
                continue
            os.unlink(sock)
            removed += 1
        except (OSError, ValueError):
            continue
    return removed


PortOwners = Callable[[], "Mapping[int, set[int]] | None"]


def _port_owners() -> Mapping[int, set[int]] | None:
    from tpu_info.host.listeners import ProcNet

    return ProcNet().owners_by_port()


class _Owners:
    """``port_owners()`` asked at most once per look, and only if needed."""

    def __init__(self, ask: PortOwners) -> None:
        self._ask = ask
        self._asked = False
        self._owners: Mapping[int, set[int]] | None = None

    def of(self, port: int) -> set[int] | None:
        if not self._asked:
            self._asked, self._owners = True, self._ask()
        return None if self._owners is None else self._owners.get(port, set())


def _port_taken(p: DiscoveredProcess, owners: _Owners, uid: int) -> Skipped | None:
    """A live record whose port another user's socket listens on: its server
    is gone (or moved) and someone else holds the port now; never read. A
    record with no port (its local socket alone, or no server) holds none."""
    if not p.port:
        return None
    others = sorted((owners.of(p.port) or set()) - {uid})
    if not others:
        return None
    return Skipped(p.path, PORT_TAKEN, f"pid {p.pid}'s port {p.port} is held by uid "
                   f"{others[0]}: the record is stale or its port was taken")


def scan(
    directory: str | os.PathLike[str] | None = None,
    *,
    alive: Callable[[int, float], bool] = pid_alive,
    uid: int | None = None,
    remove_dead: bool = True,
    port_owners: PortOwners = _port_owners,
) -> Scan:
    """Reads every record in ``directory`` (default :func:`runtime_dir`).

    Args:
        directory: the runtime directory to read.
        alive: ``alive(pid, start_time)``; records whose process is gone are skipped.
        uid: the user whose records count (default the effective uid).
        remove_dead: remove this user's records of dead processes (see the module
            docstring for when a record is kept anyway).
        port_owners: ``{port: uids listening}`` on this host (None: cannot
            tell); asked once per scan, only when there is a record to judge.

    Returns:
        The live processes (ordered by pid) and everything skipped, with reasons.
    """
    path = Path(directory) if directory is not None else runtime_dir()
    uid = os.geteuid() if uid is None else uid
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Scan(path)  # nothing hooked has run yet: not a problem
    except OSError as e:
        return Scan(path, skipped=(Skipped(path, BAD_DIRECTORY, e.strerror or str(e)),))
    reason = unsafe_directory_reason(st, uid)
    if reason:
        return Scan(path, skipped=(Skipped(path, BAD_DIRECTORY, reason),))
    try:
        listed = os.listdir(path)
    except OSError as e:
        return Scan(path, skipped=(Skipped(path, BAD_DIRECTORY, e.strerror or str(e)),))
    names = sorted(n for n in listed if n.endswith(".json"))
    sockets = _remove_lone_sockets(path, listed, uid, alive) if remove_dead else 0
    found: list[DiscoveredProcess] = []
    unserved: list[DiscoveredProcess] = []
    skipped: list[Skipped] = []
    owners = _Owners(port_owners)
    for name in names:
        seen = _identity(path / name) if remove_dead else None
        result = _read_record(path / name, uid)
        if isinstance(result, DiscoveredProcess) and not alive(result.pid, result.start_time):
            dead, removed, detail = result, False, f"pid {result.pid}"
            if remove_dead:
                if dead.port and uid in (owners.of(dead.port) or ()):
                    detail += f"; kept: a socket of yours listens on its port {dead.port}"
                else:
                    removed = _remove_dead(dead.path, seen, uid)
            result = Skipped(dead.path, DEAD, detail, removed=removed)
        elif isinstance(result, DiscoveredProcess):
            result = _port_taken(result, owners, uid) or result
        if isinstance(result, DiscoveredProcess) and not result.served:
            unserved.append(result)
        elif isinstance(result, DiscoveredProcess):
            found.append(result)
        else:
            skipped.append(result)
    found.sort(key=lambda p: p.pid)
    local_socket.remember(path, found)  # the owner's way in to each (tpu_info.net.client)
    return Scan(path, tuple(found), tuple(skipped), files_read=len(names),
                unserved=tuple(sorted(unserved, key=lambda p: p.pid)), sockets_removed=sockets)


class Rescanner:
    """:func:`scan` for a loop that asks every few seconds.

    The records are read again only when the directory changed (its inode,
    mode, owner, mtime or ctime): starting, exiting and removing records all
    change it. Otherwise only the live processes found last time are checked
    again (``alive``, and who holds their ports), and a change makes the next
    look a full one (which removes a dead process's record). A directory
    changed within ``settle_s`` of now is read every time, since two changes
    within one timestamp tick look like one.

    Args:
        directory: the runtime directory (default :func:`runtime_dir`).
        alive, uid, port_owners: as for :func:`scan`.
        clock: wall clock, compared with the directory's mtime.
        settle_s: how recent a change must be to be read again regardless.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 alive: Callable[[int, float], bool] = pid_alive, uid: int | None = None,
                 port_owners: PortOwners = _port_owners,
                 clock: Callable[[], float] = time.time, settle_s: float = 2.0) -> None:
        self.directory = Path(directory) if directory is not None else runtime_dir()
        self.alive = alive
        self.uid = os.geteuid() if uid is None else uid
        self.port_owners = port_owners
        self.clock = clock
        self.settle_s = settle_s
        self._key: tuple[int, ...] | None = None
        self._last: Scan | None = None

    def _stamp(self) -> tuple[tuple[int, ...] | None, bool]:
        try:
            st = self.directory.lstat()
        except OSError:
            return None, False
        key = (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_mtime_ns, st.st_ctime_ns)
        settled = self.clock() - max(st.st_mtime, st.st_ctime) > self.settle_s
        return key, settled

    def scan(self) -> Scan:
        """The directory's records now; cheap when nothing changed."""
        key, settled = self._stamp()
        last = self._last
        if last is not None and key is not None and key == self._key and settled:
            owners = _Owners(self.port_owners)
            if all(self.alive(p.pid, p.start_time) and not _port_taken(p, owners, self.uid)
                   for p in last.processes):
                return Scan(last.directory, last.processes,
                            tuple(s for s in last.skipped if not s.removed),
                            unserved=last.unserved)
        result = scan(self.directory, alive=self.alive, uid=self.uid,
                      port_owners=self.port_owners)
        self._key, self._last = (key, result) if settled else (None, None)
        return result


def find_processes(
    runtime_dir: str | os.PathLike[str] | None = None,
    *,
    alive: Callable[[int, float], bool] = pid_alive,
) -> list[DiscoveredProcess]:
    """The live hooked processes of the current user on this host.

    Skipped records are logged in a few lines (:meth:`Scan.summary`; at INFO
    when they are all dead pids, else WARNING); use :func:`scan` to get them
    as data. Records of dead processes are removed (see :func:`scan`).

    Args:
        runtime_dir: the directory to read (default :func:`runtime_dir`).
        alive: ``alive(pid, start_time)`` liveness check (injectable for tests).
    """
    result = scan(runtime_dir, alive=alive)
    lines = result.summary()
    if result.removed or result.sockets_removed:
        log.info("discovery: %s", lines.pop(0))
    quiet = all(s.reason == DEAD for s in result.skipped)
    for line in lines:
        log.log(logging.INFO if quiet else logging.WARNING, "skipping discovery record %s", line)
    return list(result.processes)


def secret_for(target: str, processes: Iterable[DiscoveredProcess] | None = None,
               *, pid: int | None = None) -> str | None:
    """The capture secret for ``target``: from this user's record of the
    process serving it on loopback (same port, and ``pid`` when given).

    A ``unix:PATH`` target's secret is that of the record beside the socket
    (this user's socket in a private directory: only its process made it).

    Returns:
        The secret; ``""`` when the record has none (a hook older than
        secrets, which captures without one); ``None`` when no record of
        this user names the target, or the target is not on loopback:
        captures are for the program's owner, on its host.
    """
    if is_unix(target):  # a local socket: the record beside it names it
        try:
            sock = local_socket.unix_path(target)
        except ValueError:
            return None
        for p in scan().processes if processes is None else processes:
            mine = local_socket.socket_of(p)
            if mine is not None and Path(os.path.abspath(mine)) == sock \
                    and pid in (None, p.pid):
                return p.capture_secret
        return None
    host, _, port = target.strip().rpartition(":")
    if not is_loopback_host(host) or not port.isdigit():
        return None
    for p in scan().processes if processes is None else processes:
        if p.port == int(port) and is_loopback_host(p.host) and pid in (None, p.pid) \
                and serves(p.pid, p.port):
            return p.capture_secret
    return None


def serves(pid: int, port: int, proc_root: str | os.PathLike[str] = "/proc") -> bool:
    """Whether ``pid`` or one of its children (the serve="process" helper)
    holds a socket listening on ``port``: the secret goes only to the process
    its record names, never to whoever took the port of a helper that died.
    Read from ``proc_root`` as 8431's owners are (:mod:`tpu_info.host.listeners`);
    False when it cannot tell."""
    from tpu_info.host.listeners import ProcNet

    net = ProcNet(proc_root)
    for sock in net.listeners(port) or ():
        if sock.pid is not None and pid in (sock.pid, net.parent(sock.pid)):
            return True
    return False
