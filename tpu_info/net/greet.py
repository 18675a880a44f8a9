"""Which of many targets greet as an HTTP/2 server, all looked at at once.

``tpu-info exporter`` may find hundreds of records whose programs hang (a
port the kernel accepts on and nobody reads). A gRPC dial to one costs a
thread for the whole poll and a socket gRPC keeps for 20 s, so such dials
are rationed; a live program must not wait behind them for its turn (issue
42 item 4). :func:`greeters` opens one non-blocking connection per target
in one thread, sends the HTTP/2 client preface and an empty SETTINGS frame
(as :func:`tpu_info.net.probe.look` does for one), and says which answered
with a SETTINGS frame within ``timeout``; every socket is closed before it
returns, so a hung target costs one file descriptor for at most ``timeout``.

Example:
    >>> sorted(greeters([], timeout=0.1))
    []
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Sequence

__all__ = ["greeters"]

_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x4
MAX_OPEN = 256  # sockets open at once


def _address(target: str) -> tuple[int, object] | None:
    if target.startswith("unix:"):
        return socket.AF_UNIX, target[5:]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))


def _open(target: str) -> socket.socket | None:
    where = _address(target)
    if where is None:
        return None
    family, addr = where
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    sock.setblocking(False)
    try:
        sock.connect(addr)  # type: ignore[arg-type]
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        sock.close()
        return None
    return sock


class _Look:
    __slots__ = ("target", "sent", "got")

    def __init__(self, target: str) -> None:
        self.target, self.sent, self.got = target, False, b""


def greeters(targets: Sequence[str], timeout: float, max_open: int = MAX_OPEN) -> set[str]:
    """The targets (``host:port`` or ``unix:PATH``) whose server sent an
    HTTP/2 SETTINGS frame within ``timeout`` seconds of the first connect;
    at most ``max_open`` sockets open at once (the rest wait their turn
    within the same time)."""
    end = time.monotonic() + max(timeout, 0.01)
    todo = list(dict.fromkeys(targets))[::-1]
    out: set[str] = set()
    sel = selectors.DefaultSelector()
    looks: dict[socket.socket, _Look] = {}
    try:
        while (todo or looks) and time.monotonic() < end:
            while todo and len(looks) < max_open:
                target = todo.pop()
                opened = _open(target)
                if opened is not None:
                    looks[opened] = _Look(target)
                    sel.register(opened, selectors.EVENT_WRITE)
            if not looks:
                break
            for key, _mask in sel.select(max(0.0, end - time.monotonic())):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                look = looks[sock]
                try:
                    if not look.sent:
                        sock.send(_HELLO)
                        look.sent = True
                        sel.modify(sock, selectors.EVENT_READ)
                        continue
                    chunk = sock.recv(9)
                    look.got += chunk
                    if len(look.got) >= 4 and look.got[3] == _SETTINGS:
                        out.add(look.target)
                    elif len(look.got) < 4 and chunk:
                        continue
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # refused, reset
                    pass
                sel.unregister(sock)  # answered, closed or refused: done
                del looks[sock]
                sock.close()
    finally:
        for sock in looks:
            sock.close()
        sel.close()
    return out
