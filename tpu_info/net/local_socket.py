"""Which address reaches a hooked process of this user: its local Unix socket, when it has one.

A hooked program's gRPC server listens on its TCP port and on
``<pid>.sock`` in the private 0700 runtime directory beside its discovery
record (``metrics.export.binding.add_local_socket``). Any local user can
connect to the TCP port, and the server accepts only so many connections
(64), first come first served; the socket is reachable only by the
program's user (and root) and has its own cap, so what other users do to
the TCP port never locks the owner's reads out.

The CLI finds the socket through discovery: each scan of the runtime
directory (:func:`tpu_info.net.discovery.scan`) calls :func:`remember` with
the live records it found, and :class:`tpu_info.net.client.Client` asks
:func:`dial_address` for the address of its ``host:port`` target. A socket
is used only while it is still a socket of this user's in a private
directory (checked at each dial); otherwise the target is dialled over TCP
as before, so an older hook without a socket still answers.

A process served on its socket alone (no TCP on its host) is the target
``unix:PATH`` (its record's :attr:`~tpu_info.contract.discovery_record.DiscoveredProcess.target`,
or named with ``--target``): :func:`unix_path` dials it only when it is this
user's socket in a private directory, and says why not otherwise.

Example:
    >>> dial_address("127.0.0.1:8431")  # no record of this user names it
    '127.0.0.1:8431'
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path

from tpu_info.contract.discovery_record import (
    DiscoveredProcess,
    runtime_dir,
    unsafe_directory_reason,
)
from tpu_info.net.targets import UNIX, is_loopback_host, is_unix, normalize

__all__ = ["remember", "dial_address", "socket_of", "unix_path", "why_unusable"]

_known: dict[str, Path] = {}  # normalize(target) -> the socket beside its record
_lock = threading.Lock()


def socket_of(p: DiscoveredProcess) -> Path | None:
    """The local socket of a record that names one: ``<pid>.sock`` beside
    the record as this reader found it (the path written in the record is
    never followed elsewhere)."""
    return p.path.with_name(f"{p.pid}.sock") if p.socket else None


def remember(directory: Path, processes: Iterable[DiscoveredProcess]) -> None:
    """Replaces what is known of ``directory``'s sockets with those of the
    live records ``processes`` (one scan's) that have one and serve on loopback."""
    fresh = {normalize(p.target): path for p in processes
             if is_loopback_host(p.host) and (path := socket_of(p)) is not None}
    with _lock:
        for key in [k for k, v in _known.items() if v.parent == directory]:
            del _known[key]
        _known.update(fresh)


def why_unusable(path: Path, uid: int) -> str | None:
    """Why ``path`` is not a socket to dial (None: this user's socket, in a
    directory only this user can write)."""
    try:
        st = os.lstat(path)
        parent = os.lstat(path.parent)
    except OSError as e:
        return f"no socket there ({e.strerror or e})"
    if not stat.S_ISSOCK(st.st_mode):
        return "it is not a socket"
    if st.st_uid != uid:
        return f"it is uid {st.st_uid}'s socket, not yours (uid {uid})"
    reason = unsafe_directory_reason(parent, uid)
    return f"its directory {reason}" if reason else None


def _usable(path: Path, uid: int) -> bool:
    return why_unusable(path, uid) is None


def unix_path(target: str, uid: int | None = None) -> Path:
    """The socket a ``unix:PATH`` target names (a bare file name is in the
    runtime directory), when it is one to dial.

    Raises:
        ValueError: not a ``unix:`` target, or not this user's socket in a
            private directory (saying which).
    """
    if not is_unix(target):
        raise ValueError(f"{target} is not unix:PATH")
    raw = target.strip()[len(UNIX):].removeprefix("//")
    path = Path(raw) if os.path.isabs(raw) else runtime_dir() / raw
    path = Path(os.path.abspath(path))
    why = why_unusable(path, os.geteuid() if uid is None else uid)
    if why is not None:
        raise ValueError(f"not dialled: {why}; only your own hooked programs' sockets, "
                         "in a private directory, are")
    return path


def dial_address(target: str, uid: int | None = None) -> str:
    """``unix:<path>`` for a loopback target a remembered record of this
    user names, while its socket is usable; else ``target`` itself."""
    with _lock:
        path = _known.get(normalize(target.strip()))
    if path is None:
        return target
    if not _usable(path, os.geteuid() if uid is None else uid):
        return target
    return f"unix:{path}"
