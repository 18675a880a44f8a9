"""What listens on a TCP target whose gRPC connection failed: one short look.

When a call ends ``UNAVAILABLE``, "cannot connect" and "does not speak
gRPC" are not the only causes: a gRPC server at its connection cap (a
hooked program allows 64, ``metrics.export.limits.MAX_CONNECTIONS``)
accepts each new connection and closes it at once, which is what a client
sees when other clients hold every connection. :func:`look` opens one
connection, sends the HTTP/2 client preface and an empty SETTINGS frame,
and reads the first bytes back, so the client can name the real cause.

Example:
    >>> look("127.0.0.1:1", timeout=0.5)  # doctest: +SKIP
    <Verdict.NOTHING: 'nothing accepts connections there'>
"""

from __future__ import annotations

import enum
import socket
import time

__all__ = ["Verdict", "look"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x4


class Verdict(enum.Enum):
    """What :func:`look` found."""

    NOTHING = "nothing accepts connections there"
    CLOSED_AT_ONCE = "accepted the connection and closed it at once"
    HTTP2 = "an HTTP/2 server answers"
    SILENT = "accepted the connection and sent nothing back"
    OTHER = "answered with something that is not HTTP/2"


def look(host: str, port: int, timeout: float) -> Verdict:
    """Connects to ``host:port`` and says what answers, within ``timeout``
    seconds (at least 50 ms) for the connect and the first bytes together."""
    end = time.monotonic() + max(timeout, 0.05)
    try:
        sock = socket.create_connection((host, port), timeout=max(timeout, 0.05))
    except OSError:
        return Verdict.NOTHING
    with sock:
        try:
            sock.settimeout(max(end - time.monotonic(), 0.01))
            sock.sendall(_PREFACE + _EMPTY_SETTINGS)
            first = sock.recv(9)
        except TimeoutError:
            return Verdict.SILENT
        except OSError:  # reset or broken pipe: closed before or as we wrote
            return Verdict.CLOSED_AT_ONCE
    if not first:
        return Verdict.CLOSED_AT_ONCE
    if len(first) >= 4 and first[3] == _SETTINGS:
        return Verdict.HTTP2
    return Verdict.OTHER
