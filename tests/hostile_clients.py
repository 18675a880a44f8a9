"""Hostile clients of the hook's endpoints, over real sockets (test and bench helper).

What another local process can do to a hooked program without any
privilege: hold idle TCP connections, open HTTP/2 streams that advertise a
zero flow-control window and never read, flood pings, hold HTTP/1 requests
half-sent (slowloris), or call as fast as it can. HTTP/2 is written by hand
(a few frames: preface, SETTINGS, HEADERS with literal HPACK fields, DATA,
PING), so nothing here needs more than the standard library and our protos.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
INITIAL_WINDOW_SIZE = 0x4
ENHANCE_YOUR_CALM = 0xB


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream & 0x7FFFFFFF) + payload


def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(headers: list[tuple[str, str]]) -> bytes:
    """Header fields as HPACK literals without indexing (no Huffman, no table)."""
    out = b""
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _hpack_int(len(n)) + n + _hpack_int(len(v)) + v
    return out


def grpc_message(payload: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def read_frame(sock: socket.socket) -> tuple[int, int, int, bytes] | None:
    """The next frame ``(type, flags, stream, payload)``, None when closed."""
    head = _exactly(sock, 9)
    if head is None:
        return None
    length = int.from_bytes(head[:3], "big")
    payload = _exactly(sock, length) if length else b""
    if payload is None:
        return None
    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


class RawH2:
    """A hand-written HTTP/2 client connection.

    ``window=0`` advertises a zero initial stream window: the server may
    send headers but no DATA, so every answer waits in its buffers for as
    long as this connection lives. A reader thread acknowledges SETTINGS and
    PING (as a real client would) and records GOAWAY; DATA is never
    acknowledged with WINDOW_UPDATE.
    """

    def __init__(self, host: str, port: int, window: int | None = 0,
                 connect_timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.settimeout(None)
        self.goaway: tuple[int, bytes] | None = None  # (error code, debug data)
        self.closed = threading.Event()
        self.resets: dict[int, int] = {}
        self.received: dict[int, int] = {}  # frame type -> frames read (diagnostics)
        self._next_stream = 1
        self._lock = threading.Lock()
        settings = b"" if window is None else struct.pack(">HI", INITIAL_WINDOW_SIZE, window)
        self._send(PREFACE + frame(SETTINGS, 0, 0, settings))
        threading.Thread(target=self._read, daemon=True, name="raw-h2-reader").start()

    def _send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        while True:
            f = read_frame(self.sock)
            if f is None:
                break
            kind, flags, stream, payload = f
            self.received[kind] = self.received.get(kind, 0) + 1
            try:
                if kind == SETTINGS and not flags & ACK:
                    self._send(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    self._send(frame(PING, ACK, 0, payload))
                elif kind == GOAWAY:
                    self.goaway = (int.from_bytes(payload[4:8], "big"), payload[8:])
                elif kind == RST_STREAM:
                    self.resets[stream] = int.from_bytes(payload[:4], "big")
            except OSError:
                break
        self.closed.set()

    def call(self, method: str, request: bytes, authority: str = "localhost") -> int:
        """Starts a unary or server-streaming call; returns its stream id."""
        with self._lock:
            stream = self._next_stream
            self._next_stream += 2
        headers = hpack_literal([(":method", "POST"), (":scheme", "http"), (":path", method),
                                 (":authority", authority), ("content-type", "application/grpc"),
                                 ("te", "trailers")])
        self._send(frame(HEADERS, END_HEADERS, stream, headers)
                   + frame(DATA, END_STREAM, stream, grpc_message(request)))
        return stream

    def ping(self, count: int = 1) -> bool:
        """Sends ``count`` pings; False when the server has closed the connection."""
        try:
            self._send(frame(PING, 0, 0, b"\x00" * 8) * count)
        except OSError:
            return False
        return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def idle_connections(host: str, port: int, n: int, preface: bool = False,
                     within_s: float = 20.0) -> list[socket.socket]:
    """``n`` TCP connections that send nothing (or only the HTTP/2 preface),
    as many as connect within ``within_s`` (a server that stopped accepting
    leaves connects hanging in its backlog).

    Connections the server closes at once are still returned (closed or
    not, they are this client's, not the server's)."""
    out = []
    stop = time.monotonic() + within_s
    for _ in range(n):
        if time.monotonic() > stop:
            break
        try:
            s = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            continue
        if preface:
            try:
                s.sendall(PREFACE)
            except OSError:
                pass
        out.append(s)
    return out


def slowloris(host: str, port: int, n: int, within_s: float = 20.0) -> list[socket.socket]:
    """``n`` HTTP/1 connections that send a request line and never finish the
    headers (as many as connect within ``within_s``)."""
    out = []
    stop = time.monotonic() + within_s
    for _ in range(n):
        if time.monotonic() > stop:
            break
        try:
            s = socket.create_connection((host, port), timeout=1.0)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            continue
        out.append(s)
    return out


def http_get(host: str, port: int, path: str = "/metrics", timeout: float = 10.0) -> bytes:
    """One HTTP/1.0 GET; the whole response (status line, headers, body)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def flood(work: Callable[[], None], threads: int, seconds: float) -> int:
    """Runs ``work`` in a loop on ``threads`` threads for ``seconds``; returns
    how many times it ran (errors count as runs: a flood does not care)."""
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            try:
                work()
            except Exception:  # noqa: BLE001 - refused, reset, timed out: go on
                time.sleep(0.001)
            counts[i] += 1

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return sum(counts)


def hold_connections(host: str, port: int, n: int, seconds: float,
                     reopen_every_s: float = 0.05) -> dict[str, int]:
    """Holds ``n`` HTTP/2 connections to ``host:port`` for ``seconds`` (the
    handshake done, SETTINGS and pings answered, no calls), reopening any the
    server closes (a connection cap, an idle timeout's GOAWAY): what one
    local user can do to take every connection a server allows.

    Returns:
        ``opened`` (connections made) and ``closed`` (ones the server closed).
    """
    stop = time.monotonic() + seconds
    held: list[RawH2 | None] = [None] * n
    opened = closed = 0
    while time.monotonic() < stop:
        for i, conn in enumerate(held):
            if conn is not None and not conn.closed.is_set() and conn.goaway is None:
                continue
            if conn is not None:
                conn.close()
                closed += 1
            try:
                held[i] = RawH2(host, port, window=None, connect_timeout=1.0)
                opened += 1
            except OSError:
                held[i] = None
        time.sleep(reopen_every_s)
    for conn in held:
        if conn is not None:
            conn.close()
    return {"opened": opened, "closed": closed}
