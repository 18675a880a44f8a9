"""What any client can make one of our gRPC servers hold or do, and the
token bucket that bounds the calls reaching Python (issue 14).

The same limits serve in the program and in the serve="process" helper
(which passes a higher call rate: the program pays one mirror refresh per
interval there, whatever the helper answers). Every grpc channel argument
here is one grpcio 1.85's core honours (checked against its strings:
``grpc.http2.max_concurrent_streams`` and
``grpc.http2.min_recv_ping_interval_without_data_ms`` are not).

Example:
    >>> pacer = CallPacer(rate=1000.0, burst=2)
    >>> pacer.admit(), pacer.admit()
    (True, True)
"""

from __future__ import annotations

import threading
import time

MAX_SEND_BYTES = 64 * 1024 * 1024
MAX_RECEIVE_BYTES = 64 * 1024

# What any client can make the server hold or do (issue 14). Connections
# beyond the cap are closed as soon as they are accepted; ones that never
# finish the HTTP/2 handshake (a bare TCP connect, a preface alone) go after
# HANDSHAKE_TIMEOUT_MS, ones without calls after IDLE_CONNECTION_MS.
MAX_CONNECTIONS = 64
# HTTP/2 streams per connection, unary calls included. grpc clients in one
# process share a connection per target, and a stream just finished still
# counts on the server for a moment: a limit as low as the clients' own
# concurrency (8 pollers) refuses some of their calls (REFUSED_STREAM).
MAX_STREAMS_PER_CONNECTION = 32
HANDSHAKE_TIMEOUT_MS = 5_000
IDLE_CONNECTION_MS = 30_000
MAX_CONNECTION_AGE_MS = 3_600_000  # then GOAWAY; calls get this long to finish:
CONNECTION_AGE_GRACE_MS = 60_000
KEEPALIVE_MS = 60_000  # the server pings its peers: dead ones go within 70 s
KEEPALIVE_TIMEOUT_MS = 10_000
# Our clients ping every 10 s on open calls (tpu_info.net.client): pings more
# often than this earn strikes, and MAX_PING_STRIKES of them a GOAWAY.
MIN_PING_INTERVAL_MS = 5_000
MAX_PING_STRIKES = 2
MAX_METADATA_BYTES = 8 * 1024
# An answer grpc has not delivered this long after the handler produced it
# (the peer does not read: a zero flow-control window) is cancelled, which
# frees its buffers, its worker thread and its stream slot.
STALL_S = 10.0
EVICT_STALLED_S = 1.0  # a new stream may take the slot of one stalled this long
EVICT_WAIT_S = 3.0  # ... and waits this long for one to have stalled that long
# Calls that reach Python (snapshots, stream answers, ListMetrics, libtpu's
# calls) share one token bucket: excess calls wait in line (asleep, without
# the GIL) and ones that would wait longer than MAX_PACE_S are refused, so
# no client can make the program build more than this many answers a second.
CALLS_PER_S = 200.0
CALL_BURST = 40
MAX_PACE_S = 1.0


def server_options() -> list[tuple[str, int]]:
    """grpc channel arguments every server of ours gets (all honoured by grpcio 1.85's core)."""
    return [
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        # Without this two processes could share 8431 on Linux.
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", CONNECTION_AGE_GRACE_MS),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ]


class CallPacer:
    """A token bucket shared by every call that reaches Python.

    :meth:`admit` reserves a token, sleeps until it is due (``time.sleep``
    drops the GIL) and returns True, or returns False at once when it would
    be due later than ``max_wait_s``. Reservations are served in arrival
    order, so a flooding client waits in the same line as everyone else.
    """

    def __init__(self, rate: float = CALLS_PER_S, burst: int = CALL_BURST,
                 max_wait_s: float = MAX_PACE_S) -> None:
        self.rate = rate
        self._burst = float(burst)
        self._max_wait = max_wait_s
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self.refused = 0

    def admit(self, max_wait_s: float | None = None) -> bool:
        limit = self._max_wait if max_wait_s is None else max_wait_s
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            wait = (1.0 - self._tokens) / self.rate if self._tokens < 1.0 else 0.0
            if wait > limit:
                self.refused += 1
                return False
            self._tokens -= 1.0
        if wait > 0:
            time.sleep(wait)
        return True
