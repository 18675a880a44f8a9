"""Bad targets give typed errors within the timeout; fan-out isolates them."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from metrics import export
from tpu_info.contract.errors import (
    NotAMonitor,
    ProtocolMismatch,
    ReplyTooLarge,
    TimedOut,
    TpuInfoError,
    Unreachable,
)
from tpu_info.contract.model import GraphRecord, Snapshot
from tpu_info.net.client import Client
from tpu_info.net.fanout import fan_out
from tpu_info.proto import tpu_info_v1_pb2 as pb

TIMEOUT = 1.5


def _listener(handler) -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(32)

    def loop() -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return s, s.getsockname()[1]


def _garbage(conn: socket.socket) -> None:
    try:
        conn.sendall(b"\x00\xffnot grpc at all\r\n" * 64)
        time.sleep(0.5)
    finally:
        conn.close()


def _closes_at_once(conn: socket.socket) -> None:
    conn.close()  # what a gRPC server at its connection cap does to a new connection


def _silent(conn: socket.socket) -> None:
    time.sleep(30)
    conn.close()


@pytest.fixture(scope="module")
def bad_targets():
    targets: dict[str, str] = {}
    keep = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        targets["closed"] = f"127.0.0.1:{s.getsockname()[1]}"
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    targets["http"] = f"127.0.0.1:{httpd.server_address[1]}"
    for name, handler in (("garbage", _garbage), ("silent", _silent),
                          ("closes_at_once", _closes_at_once)):
        sock, port = _listener(handler)
        keep.append(sock)
        targets[name] = f"127.0.0.1:{port}"
    other = grpc.server(futures.ThreadPoolExecutor(2))
    other.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}),))
    targets["other_grpc"] = f"127.0.0.1:{other.add_insecure_port('127.0.0.1:0')}"
    other.start()
    # A "monitor" that answers with an unversioned message (an old or foreign server).
    foreign = grpc.server(futures.ThreadPoolExecutor(2))
    foreign.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "tpu_info.v1.Monitor", {"GetSnapshot": grpc.unary_unary_rpc_method_handler(
            lambda r, c: pb.Snapshot(taken_at_unix=1.0).SerializeToString(),
            request_deserializer=None, response_serializer=None)}),))
    targets["unversioned"] = f"127.0.0.1:{foreign.add_insecure_port('127.0.0.1:0')}"
    foreign.start()
    big = Snapshot(taken_at_unix=1.0, graphs=tuple(
        GraphRecord(hash=f"{i:064x}", name="x" * 1000, engine="jax",
                    first_seen_unix=0.0, last_seen_unix=0.0) for i in range(3000)))
    huge = export.start(lambda since: big, port=0)
    targets["oversized"] = huge.address
    yield targets
    huge.stop(grace=0)
    other.stop(0)
    foreign.stop(0)
    httpd.shutdown()
    for s in keep:
        s.close()


EXPECTED = {
    "closed": Unreachable,
    "closes_at_once": Unreachable,
    "http": NotAMonitor,
    "garbage": NotAMonitor,
    "silent": TimedOut,
    "other_grpc": NotAMonitor,
    "unversioned": ProtocolMismatch,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_target_typed_error_within_timeout(bad_targets, name: str) -> None:
    target = bad_targets[name]
    t0 = time.monotonic()
    with Client(target, timeout=TIMEOUT) as c:
        with pytest.raises(EXPECTED[name]) as info:
            c.snapshot()
    assert time.monotonic() - t0 < TIMEOUT + 1.0
    assert info.value.target == target


def test_a_target_closing_every_connection_is_said_to_refuse_not_to_be_foreign(
        bad_targets) -> None:
    with Client(bad_targets["closes_at_once"], timeout=TIMEOUT) as c:
        with pytest.raises(Unreachable, match="refused the connection: it closes new "
                           "connections at once, as a server does when other clients hold "
                           "all its connections") as info:
            c.snapshot()
    assert "does not speak gRPC" not in str(info.value)


def test_oversized_reply(bad_targets) -> None:
    with Client(bad_targets["oversized"], timeout=5, max_message_bytes=1024 * 1024) as c:
        with pytest.raises(ReplyTooLarge) as info:
            c.snapshot()
    assert info.value.target == bad_targets["oversized"]


def test_malformed_address() -> None:
    with pytest.raises(Unreachable):
        Client("no-port-here")


def test_fan_out_slow_target_does_not_stall_the_rest(bad_targets) -> None:
    good = export.start(lambda since: Snapshot(taken_at_unix=2.0, last_seq=0), port=0)
    try:
        targets = [good.address, bad_targets["silent"], bad_targets["closed"],
                   bad_targets["http"], good.address]
        t0 = time.monotonic()
        results = fan_out(targets, timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        good.stop(grace=0)
    assert [r.target for r in results] == targets
    assert results[0].ok and results[0].value.taken_at_unix == 2.0 and results[4].ok
    assert isinstance(results[1].error, TimedOut)
    assert isinstance(results[2].error, Unreachable)
    assert isinstance(results[3].error, NotAMonitor)
    assert all(isinstance(r.error, TpuInfoError) for r in results[1:4])
    assert elapsed < TIMEOUT + 1.0
    assert results[0].seconds < 1.0
