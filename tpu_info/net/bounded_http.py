"""A small HTTP/1 server whose cost to its process is bounded whatever clients do.

It serves the hook's Prometheus endpoint (``metrics.export.prometheus``,
inside the user's program) and ``tpu-info exporter``'s (one per host): both
import it from here, so ``tpu_info`` never imports ``metrics``.

Prometheus' ``/metrics`` used to be served by prometheus_client's
``start_http_server``, a ``ThreadingHTTPServer``: one thread per connection,
no timeouts, so 1,100 connections that never finish their headers made
1,038 threads and then killed the program. This one is a single thread
around a selector:

- at most :data:`MAX_CONNECTIONS` open connections; when full, a new one
  takes the place of the oldest that has not finished its request yet (a
  slowloris cannot keep a real scrape out), and when every one is a finished
  request waiting its turn, new ones wait in the kernel's backlog;
- a request (line and headers, at most :data:`MAX_REQUEST_BYTES`) must arrive
  within :data:`REQUEST_TIMEOUT_S` and the answer be taken within
  :data:`SEND_TIMEOUT_S`, else the connection is closed;
- at most :data:`REQUESTS_PER_S` answers a second (a token bucket): the rest
  wait, costing nothing but their socket;
- bodies come from ``body_fn(accept_header)``, which the caller caches.

With ``tls`` (an :class:`ssl.SSLContext`, from :mod:`tpu_info.net.webconfig`)
each connection's handshake is done without blocking under the same request
deadline, and a client that does not speak TLS is closed unanswered; with
``authorize`` every request needs an ``Authorization`` header it accepts, else
401 with ``WWW-Authenticate: Basic``, or 429 with ``Retry-After`` when the
authorizer did not check it (that client's budget of checks is spent).
``landing`` is the HTML page served at ``/`` (:func:`landing_page`); any other
path gets ``body_fn``'s exposition.
Every answer closes its connection (``Connection: close``).

Example:
    >>> server = BoundedHttpServer(lambda accept, encoding: (b"ok\\n", "text/plain", ""),
    ...                            "127.0.0.1", 0)
    >>> server.start()
    >>> server.stop()
"""

from __future__ import annotations

import collections
import html
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("tpu_info.net.bounded_http")

MAX_CONNECTIONS = 32
MAX_REQUEST_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 10.0
REQUESTS_PER_S = 20.0
REQUEST_BURST = 10
BACKLOG = 64

BodyFn = Callable[[str, str], tuple[bytes, str, str]]
"""``body_fn(accept, accept_encoding) -> (body, content_type, content_encoding)``."""
_WANT = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TlsWrapper(Protocol):
    """What ``tls`` must do: an :class:`ssl.SSLContext`, or
    :class:`tpu_info.net.webconfig.LiveWebConfig` (the context of the day)."""

    def wrap_socket(self, sock: socket.socket, server_side: bool = ...,
                    do_handshake_on_connect: bool = ...) -> ssl.SSLSocket: ...


class AuthVerdict(Protocol):
    """What ``authorize`` answers (:class:`tpu_info.net.basic_auth.Verdict`)."""

    @property
    def status(self) -> int: ...  # 200, 401 or 429

    @property
    def retry_after_s(self) -> int: ...


Authorizer = Callable[[str, str], AuthVerdict]
"""``authorize(authorization_header, peer_address) -> verdict``."""


class _Conn:
    __slots__ = ("sock", "deadline", "buf", "out", "ready", "opened", "handshaking", "peer")

    def __init__(self, sock: socket.socket, now: float, peer: str = "") -> None:
        self.sock = sock
        self.peer = peer
        self.opened = now
        self.deadline = now + REQUEST_TIMEOUT_S
        self.buf = b""
        self.out = b""
        self.ready = False  # the whole request has arrived; waiting to be answered
        self.handshaking = isinstance(sock, ssl.SSLSocket)


def _header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


def _response(status: str, body: bytes = b"", content_type: str = "text/plain",
              encoding: str = "", head_only: bool = False, extra: str = "") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    if encoding:
        lines.append(f"Content-Encoding: {encoding}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)


def landing_page(title: str, lines: tuple[str, ...] = ()) -> bytes:
    """node_exporter's kind of page for ``/``: the tool, tpu-info's version,
    ``lines`` and a link to ``metrics`` (relative: it works behind a path
    prefix too)."""
    from tpu_info import __version__ as version

    t = html.escape(title)
    extra = "".join(f"<p>{html.escape(line)}</p>\n" for line in lines)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>"
            f"</head>\n<body><h1>{t}</h1>\n<p>Version {html.escape(version)}</p>\n{extra}"
            f"<p><a href=\"metrics\">Metrics</a></p>\n</body></html>\n").encode()


class BoundedHttpServer:
    """Serves ``body_fn``'s answer to GET on one daemon thread (see the module docstring).

    Args:
        tls: serve HTTPS with this context (None: plain HTTP).
        authorize: ``authorize(authorization_header, peer) -> verdict``
            (:data:`Authorizer`), None: no auth.
        landing: the page served at ``/`` (None: the exposition there too).

    Raises:
        OSError: from the constructor, when the address cannot be bound.
    """

    def __init__(self, body_fn: BodyFn, address: str, port: int,
                 requests_per_s: float = REQUESTS_PER_S,
                 thread_name: str = "tpu-info-prometheus", *,
                 tls: TlsWrapper | None = None,
                 authorize: Authorizer | None = None,
                 landing: bytes | None = None) -> None:
        self._body_fn = body_fn
        self._tls = tls
        self._authorize = authorize
        self._landing = landing
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM)[0]
        self._listener = socket.socket(family, kind, proto)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(BACKLOG)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._rate = requests_per_s
        self._tokens = float(REQUEST_BURST)
        self._last = time.monotonic()
        self._conns: dict[int, _Conn] = {}
        self._waiting: collections.deque[_Conn] = collections.deque()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._accepting = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self.answered = 0
        self.dropped = 0  # connections closed unanswered (timeouts, evictions, bad requests)

    def start(self) -> None:
        self._listen(True)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stops serving, closes every socket (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self._close_all()

    @property
    def connections(self) -> int:
        return len(self._conns)

    # The loop -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step()
        except Exception as e:  # noqa: BLE001 - never take the program down with us
            log.warning("tpu-info: the Prometheus endpoint stopped: %r", e)
        finally:
            self._close_all()

    def _step(self) -> None:
        now = time.monotonic()
        self._answer_waiting(now)
        timeout = min([c.deadline for c in self._conns.values()] + [now + 1.0]) - now
        if self._waiting:
            timeout = min(timeout, (1.0 - self._tokens) / self._rate)
        self._listen(len(self._conns) < MAX_CONNECTIONS
                     or any(not c.ready for c in self._conns.values()))
        for key, mask in self._sel.select(max(0.0, timeout)):
            if key.data == "accept":
                self._accept(time.monotonic())
            elif key.data == "wake":
                return
            else:
                conn = key.data
                if mask & selectors.EVENT_READ:
                    self._read(conn)
                if mask & selectors.EVENT_WRITE and conn.sock.fileno() in self._conns:
                    self._write(conn)
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._close(conn, answered=False)

    def _listen(self, accepting: bool) -> None:
        """Accepts new connections, or leaves them in the kernel's backlog
        (every slot holds a whole request waiting for its answer)."""
        if accepting == self._accepting:
            return
        self._accepting = accepting
        if accepting:
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        else:
            self._sel.unregister(self._listener)

    def _accept(self, now: float) -> None:
        for _ in range(MAX_CONNECTIONS):
            if len(self._conns) >= MAX_CONNECTIONS:
                unfinished = [c for c in self._conns.values() if not c.ready]
                if not unfinished:
                    return  # the rest wait in the backlog
                self._close(min(unfinished, key=lambda c: c.opened), answered=False)
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: try again on the next round
                log.debug("tpu-info: Prometheus accept failed: %r", e)
                return
            sock.setblocking(False)
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True,
                                                 do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = _Conn(sock, now, str(addr[0]) if isinstance(addr, tuple) and addr else "")
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _handshake(self, conn: _Conn) -> bool:
        """One step of a TLS handshake; True once it is done."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return False
        except (OSError, ValueError):  # plain HTTP, a bad or missing client cert, a reset
            self._close(conn, answered=False)
            return False
        conn.handshaking = False
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        return True

    def _read(self, conn: _Conn) -> None:
        if conn.handshaking and not self._handshake(conn):
            return
        try:
            chunk = conn.sock.recv(MAX_REQUEST_BYTES)
            while isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending() \
                    and len(chunk) <= MAX_REQUEST_BYTES:
                chunk += conn.sock.recv(MAX_REQUEST_BYTES)  # the rest of a TLS record
        except _WANT:
            return
        except OSError:
            chunk = b""
        if not chunk or conn.ready:
            if not chunk:
                self._close(conn, answered=False)
            return  # bytes after a whole request (pipelining) are ignored
        conn.buf += chunk
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buf) > MAX_REQUEST_BYTES:
                self._reply_now(conn, _response("431 Request Header Fields Too Large"))
            return
        conn.buf = conn.buf[:end]
        conn.ready = True
        self._sel.unregister(conn.sock)  # nothing more to read; its turn comes
        self._waiting.append(conn)

    def _answer_waiting(self, now: float) -> None:
        self._tokens = min(float(REQUEST_BURST), self._tokens + (now - self._last) * self._rate)
        self._last = now
        while self._waiting and self._tokens >= 1.0:
            conn = self._waiting.popleft()
            if conn.sock.fileno() not in self._conns:
                continue  # closed while waiting
            self._tokens -= 1.0
            self._reply_now(conn, self._respond(conn.buf, conn.peer))

    def _respond(self, head: bytes, peer: str = "") -> bytes:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _response("400 Bad Request")
        method, path = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed")
        if self._authorize is not None:
            verdict = self._authorize(_header(head, b"authorization"), peer)
            if verdict.status == 429:
                return _response("429 Too Many Requests", b"Too many password checks from "
                                 b"this client: try again later\n", head_only=method == b"HEAD",
                                 extra=f"Retry-After: {max(1, int(verdict.retry_after_s))}")
            if verdict.status != 200:
                return _response("401 Unauthorized", b"Unauthorized\n",
                                 head_only=method == b"HEAD",
                                 extra='WWW-Authenticate: Basic realm="tpu-info"')
        route = path.split(b"?", 1)[0]
        if route == b"/favicon.ico":
            return _response("200 OK", head_only=method == b"HEAD")
        if route == b"/" and self._landing is not None:
            return _response("200 OK", self._landing, "text/html; charset=utf-8",
                             head_only=method == b"HEAD")
        try:
            body, ctype, encoding = self._body_fn(_header(head, b"accept"),
                                                  _header(head, b"accept-encoding"))
        except Exception as e:  # noqa: BLE001 - a failing body is a 500, not a dead endpoint
            log.warning("tpu-info: Prometheus exposition failed: %r", e)
            return _response("500 Internal Server Error")
        return _response("200 OK", body, ctype, encoding, head_only=method == b"HEAD")

    def _reply_now(self, conn: _Conn, data: bytes) -> None:
        conn.out = data
        conn.ready = True
        conn.deadline = time.monotonic() + SEND_TIMEOUT_S
        try:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        except KeyError:
            self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        if conn.handshaking:
            if self._handshake(conn):
                self._read(conn)  # the request may be in with the handshake's last bytes
            return
        try:
            sent = conn.sock.send(conn.out)
        except _WANT:
            return
        except OSError:
            self._close(conn, answered=False)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn, answered=True)

    def _close(self, conn: _Conn, answered: bool) -> None:
        fd = conn.sock.fileno()
        if self._conns.pop(fd, None) is None:
            return
        if answered:
            self.answered += 1
        else:
            self.dropped += 1
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def close_in_fork_child(self) -> None:
        """In a fork child: closes its copies of every socket and of the
        selector, touching nothing the parent's serving thread uses (the
        child has no such thread; the parent's sockets stay open)."""
        self._stopping = True
        for s in (self._listener, self._wake_r, self._wake_w,
                  *(c.sock for c in self._conns.values())):
            try:
                s.close()
            except OSError:
                pass
        self._conns.clear()
        try:
            self._sel.close()
        except (OSError, ValueError):
            pass

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn, answered=False)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self._sel.close()
