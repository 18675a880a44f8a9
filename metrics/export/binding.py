"""Where each endpoint listens: one setting per endpoint, bound exactly as written.

``$TPU_INFO_BIND`` is the gRPC server's (both services, captures included),
``$TPU_INFO_PROMETHEUS_BIND`` the Prometheus ``/metrics`` endpoint's; each
defaults to loopback and opening one never opens the other. A setting is an
address or a comma-separated list of them (``127.0.0.1,10.0.0.5``).

grpc binds ``0.0.0.0`` as ``[::]``, every IPv4 *and* IPv6 address; here
``0.0.0.0`` means what it says, every IPv4 address of this host (those it
has when the server starts), and ``::`` every address of both families.
Going beyond loopback logs one warning per endpoint and setting; captures
stay loopback-only whatever the setting (:mod:`metrics.export.owner`).

Besides its TCP port, the gRPC server listens on a Unix socket in the
private runtime directory (:func:`add_local_socket`; the path is
:func:`metrics.export.discovery.socket_path`): only the program's user (and
root) can reach it, and its connections are not counted against the TCP
port's cap, so another local user holding every TCP connection cannot lock
the owner's reads out. Where no TCP socket can be had (gVisor, a seccomp'd
container: :func:`no_tcp` asks the OS before grpc is asked, so grpc's own
error lines never reach the program's stderr), or when the setting is
``unix`` (:func:`unix_only`), the server listens on that socket alone.

Example:
    >>> addresses("127.0.0.1")
    ['127.0.0.1']
    >>> is_loopback("127.0.0.1,::1"), is_loopback("0.0.0.0")
    (True, False)
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections.abc import Mapping
from typing import Protocol

from metrics import config
from tpu_info.net.targets import is_loopback_host

__all__ = ["GRPC_ENV", "PROMETHEUS_ENV", "LOOPBACK", "BindError", "setting", "addresses",
           "is_loopback", "dial_host", "warn_once", "add_local_socket", "UNIX", "unix_only",
           "no_tcp"]

log = logging.getLogger("metrics.export")

GRPC_ENV = config.BIND.name
PROMETHEUS_ENV = config.PROMETHEUS_BIND.name
LOOPBACK = "127.0.0.1"
_IPV4_ANY = "0.0.0.0"
_ANY = ("::", "[::]")
UNIX = "unix"  # the setting that asks for the local socket alone


class BindError(OSError):
    """The server could not bind the requested address and port."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def setting(explicit: str | None, env_name: str,
            environ: Mapping[str, str] | None = None) -> str:
    """``explicit``, else ``$env_name``, else loopback."""
    env = os.environ if environ is None else environ
    raw = explicit if explicit is not None else env.get(env_name, "")
    return raw.strip() or LOOPBACK


def _ipv4_addresses() -> list[str]:
    """Every IPv4 address of this host's interfaces, loopback first."""
    try:
        import psutil

        found = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family == socket.AF_INET}
    except Exception:  # noqa: BLE001 - no psutil, or no interface list on this OS
        found = set()
    found.add(LOOPBACK)
    return sorted(found, key=lambda a: (not a.startswith("127."), a))


def addresses(bind: str) -> list[str]:
    """The addresses to bind for a setting, each once, in order (``0.0.0.0``
    expanded to this host's IPv4 addresses; ``::`` kept: grpc binds it as
    every address of both families)."""
    out: list[str] = []
    for part in (p.strip() for p in bind.split(",")):
        if not part:
            continue
        expanded = _ipv4_addresses() if part == _IPV4_ANY else [part]
        out.extend(a for a in expanded if a not in out)
    return out or [LOOPBACK]


def unix_only(bind: str) -> bool:
    """Whether a setting asks for the local socket alone: ``unix`` (or
    ``unix:PATH``; the socket is always ``<pid>.sock`` in the runtime directory)."""
    word = bind.strip().lower()
    return word == UNIX or word.startswith(UNIX + ":")


def no_tcp(bind: str) -> str | None:
    """Why no TCP socket can serve the setting ``bind`` on this host (the
    OS's words), or None when one can. Asks with Python's own ``socket``
    (created and closed, never bound) for each address family the setting
    needs, so grpc is never asked to bind what it cannot (it would print
    its own error lines into the program's stderr)."""
    families = {socket.AF_INET6 if ":" in a.strip("[]") else socket.AF_INET
                for a in addresses(bind)}
    for family in sorted(families):
        try:
            socket.socket(family, socket.SOCK_STREAM).close()
        except OSError as e:
            name = "IPv6" if family == socket.AF_INET6 else "IPv4"
            return f"no {name} socket can be opened here: {e.strerror or e}"
    return None


def is_loopback(bind: str) -> bool:
    """Whether every address of a setting is loopback."""
    return all(part not in (_IPV4_ANY, *_ANY) and is_loopback_host(part)
               for part in (p.strip() for p in bind.split(",")) if part)


def dial_host(bind: str) -> str:
    """The host a client on this machine dials for a server bound to ``bind``:
    its first loopback address (``127.0.0.1`` for a wildcard), else its first."""
    parts = [p.strip() for p in bind.split(",") if p.strip()] or [LOOPBACK]
    for part in parts:
        if part in (_IPV4_ANY, *_ANY):
            return LOOPBACK
        if is_loopback_host(part):
            return part.strip("[]")
    return parts[0].strip("[]")


def warn_once(endpoint: str, bind: str, exposes: str) -> None:
    """Logs, once per endpoint and setting, that ``bind`` is beyond loopback."""
    if is_loopback(bind):
        return
    with _warned_lock:
        if (endpoint, bind) in _warned:
            return
        _warned.add((endpoint, bind))
    log.warning("tpu-info: %s listens on %s (not loopback): anyone who can reach it can %s",
                endpoint, bind, exposes)


class _Ports(Protocol):
    def add_insecure_port(self, address: str) -> int: ...


def add_local_socket(server: _Ports, path: str) -> bool:
    """Has ``server`` (a ``grpc.Server`` not started yet) listen on the Unix
    socket ``path`` too, mode 0600 (its directory is the private 0700 runtime
    directory). A socket left there by a process that had this pid is
    replaced; anything else at ``path`` is left alone. False (logged, never
    raised) when it cannot: serving goes on over TCP alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("tpu-info: no local socket at %s: %s", path, e)
        return False
    else:
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("tpu-info: no local socket: %s exists and is not a socket of ours", path)
            return False
        os.unlink(path)  # a dead process's (same pid): grpc would refuse it
    try:
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise RuntimeError("grpc could not bind it")
        os.chmod(path, 0o600)
    except (RuntimeError, OSError) as e:
        log.warning("tpu-info: no local socket at %s (%s); serving over TCP only", path, e)
        return False
    return True
