"""The frames the program and its serving helper speak over their private
socketpair: an 8-byte header (JSON length, payload length), a JSON object
with ``op``, and raw bytes (see :mod:`metrics.export.helper`).

Example:
    >>> import socket
    >>> a, b = socket.socketpair()
    >>> Channel(a).send({"op": "ping"}, b"x")
    >>> Channel(b).recv()
    ({'op': 'ping'}, b'x')
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from typing import Any

__all__ = ["Channel", "send_quietly"]

_HEADER = struct.Struct(">II")
_MAX_FRAME = 256 * 1024 * 1024


class Channel:
    """Framed messages over one stream socket; sends are thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        head = json.dumps(header).encode()
        with self._send_lock:
            self.sock.sendall(_HEADER.pack(len(head), len(payload)) + head + payload)

    def recv(self) -> tuple[dict[str, Any], bytes] | None:
        """The next message, or None when the other end closed."""
        sizes = self._exactly(_HEADER.size)
        if sizes is None:
            return None
        head_len, payload_len = _HEADER.unpack(sizes)
        if head_len > _MAX_FRAME or payload_len > _MAX_FRAME:
            raise ValueError("oversized frame from the other end")
        head = self._exactly(head_len)
        payload = self._exactly(payload_len) if payload_len else b""
        if head is None or payload is None:
            return None
        return json.loads(head), payload

    def _exactly(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def send_quietly(channel: Channel, header: dict[str, Any], payload: bytes = b"") -> None:
    """Sends, unless the other end is gone (it then learns nothing more)."""
    try:
        channel.send(header, payload)
    except OSError:
        pass
