"""The gRPC server inside the hooked program: ``tpu_info.v1.Monitor`` and
libtpu's ``RuntimeMetricService`` on one port.

The server owns a small bounded thread pool; every snapshot is built on one
of its threads when a request arrives, by the injected ``snapshot_fn`` (this
module never reaches for global metrics state). Streams are capped below the
pool size so one-shot calls always find a free worker. Messages are bounded
both ways. ``Capture`` runs the injected ``capture_fn`` (see
:data:`CaptureFn`) with the :class:`~metrics.export.owner.Caller` (token and
peer), which decides who may capture; without one it answers
UNIMPLEMENTED. A capture holds a worker of its own (the pool has one more
thread when ``capture_fn`` is given), so a concurrent capture is refused at
once rather than queued.

Example:
    >>> from tpu_info.model import Snapshot
    >>> server = Server(lambda since: Snapshot(taken_at_unix=0.0), port=0)
    >>> port = server.start()
    >>> server.stop(grace=0)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any, Protocol

import grpc

from metrics import names
from metrics.export import binding
from metrics.export.libtpu_service import RuntimeMetricServicer, snapshot_or_abort
from metrics.export.owner import Caller, caller_of
from tpu_info import encoder, wire
from tpu_info.model import MetricInfo, Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc

log = logging.getLogger("metrics.export")

SnapshotFn = Callable[[int], Snapshot]

MAX_CAPTURE_MS = 300_000


class CaptureFileLike(Protocol):
    name: str
    size_bytes: int
    data: bytes | None
    server_path: str


class CaptureLike(Protocol):
    """What a capture function returns (``profiler.remote.RemoteCapture``)."""

    trace: bytes
    format: str
    files: Sequence[CaptureFileLike]
    notes: Sequence[str]
    truncated: bool
    event_count: int


# capture_fn(duration_s, device, stop, caller) checks the caller (who, from
# where: metrics.export.owner), then records until the duration ends or
# ``stop`` is set (the client went away, the server stops). Errors it raises
# answer with the status named by their ``grpc_status`` attribute
# (PERMISSION_DENIED for a caller who is not the owner, ABORTED for a capture
# already running), INVALID_ARGUMENT for a ValueError, else INTERNAL.
CaptureFn = Callable[[float, bool, threading.Event, Caller], CaptureLike]

DEFAULT_WORKERS = 40  # threads start on demand; each open stream holds one
RESERVED_WORKERS = 4  # never taken by streams: one-shot calls always find one
ANSWER_TTL_S = 0.05   # identical requests this close together share one answer
MIN_INTERVAL_MS = 50
DEFAULT_INTERVAL_MS = 1000
MAX_SEND_BYTES = 64 * 1024 * 1024
MAX_RECEIVE_BYTES = 64 * 1024


class BindError(OSError):
    """The server could not bind the requested address and port."""


def catalog_infos() -> list[MetricInfo]:
    """Every name in :data:`metrics.names.CATALOG` as a :class:`MetricInfo`."""
    return [MetricInfo(name, kind, unit, help)
            for name, (kind, unit, help) in sorted(names.CATALOG.items())]


class MonitorServicer(pb_grpc.MonitorServicer):
    """``tpu_info.v1.Monitor``: snapshots on request, streams, metric names."""

    def __init__(self, snapshot_fn: SnapshotFn, max_streams: int,
                 metric_infos: Iterable[MetricInfo] | None = None,
                 capture_fn: CaptureFn | None = None) -> None:
        self._snapshot_fn = snapshot_fn
        self._capture_fn = capture_fn
        self._capture_stops: set[threading.Event] = set()
        self._infos = list(metric_infos) if metric_infos is not None else catalog_infos()
        self._streams = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._cache = encoder.PartCache()
        self._answers: dict[tuple[int, int], tuple[float, bytes, int]] = {}
        self._answers_lock = threading.Lock()
        self.stopping = threading.Event()

    def _answer(self, events_since: int, max_events: int,
                context: grpc.ServicerContext) -> tuple[bytes, int]:
        """The serialized snapshot and its last_seq, shared by identical
        requests within :data:`ANSWER_TTL_S`: many watchers and pollers cost
        the program one snapshot per interval, not one per request."""
        key = (events_since, max_events)
        now = time.monotonic()
        hit = self._answers.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        snap = snapshot_or_abort(self._snapshot_fn, events_since, context)
        if max_events and len(snap.events) > max_events:
            snap = dataclasses.replace(snap, events=snap.events[-max_events:])
        data = encoder.snapshot_to_bytes(snap, self._cache)
        with self._answers_lock:
            # Expired answers go at once: each stream asks with its own
            # events_since, and answers carry up to a thousand events, so
            # keeping them until a size limit held megabytes for nothing.
            if len(self._answers) > 8:
                self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            self._answers[key] = (now + ANSWER_TTL_S, data, snap.last_seq)
        return data, snap.last_seq

    def GetSnapshot(self, request: pb.SnapshotRequest,
                    context: grpc.ServicerContext) -> bytes:
        return self._answer(request.events_since, request.max_events, context)[0]

    def StreamSnapshots(self, request: pb.StreamRequest,
                        context: grpc.ServicerContext) -> Iterator[bytes]:
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"at most {self._max_streams} streams at once; try again later "
                          "or poll GetSnapshot")
        released = threading.Lock()

        def release() -> None:
            if released.acquire(blocking=False):
                self._streams.release()

        wake = threading.Event()
        context.add_callback(wake.set)   # the client went away or the RPC ended
        context.add_callback(release)
        interval_ms = request.interval_ms or DEFAULT_INTERVAL_MS
        interval_s = max(interval_ms, MIN_INTERVAL_MS) / 1000.0
        since = request.events_since
        try:
            while context.is_active() and not self.stopping.is_set():
                data, since = self._answer(since, request.max_events, context)
                yield data
                if wake.wait(interval_s) or self.stopping.is_set():
                    break
        finally:
            release()

    def ListMetrics(self, request: pb.ListMetricsRequest,
                    context: grpc.ServicerContext) -> pb.ListMetricsReply:
        infos = {i.name: i for i in self._infos}
        snap = snapshot_or_abort(self._snapshot_fn, 2**62, context)
        for c in snap.counters:
            infos.setdefault(c.name, MetricInfo(c.name, "counter", c.unit, c.help))
        for d in snap.distributions:
            infos.setdefault(d.name, MetricInfo(d.name, "distribution", d.unit, d.help))
        return wire.metric_infos_to_proto(infos[n] for n in sorted(infos))

    def Capture(self, request: pb.CaptureRequest,
                context: grpc.ServicerContext) -> pb.CaptureReply:
        if self._capture_fn is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          "trace capture is not available in this tpu-info hook")
        if not 0 < request.duration_ms <= MAX_CAPTURE_MS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"duration_ms must be 1..{MAX_CAPTURE_MS} (5 minutes), "
                          f"got {request.duration_ms}")
        stop = threading.Event()
        context.add_callback(stop.set)  # the client went away or the RPC ended
        self._capture_stops.add(stop)
        if self.stopping.is_set():
            stop.set()
        failure: tuple[grpc.StatusCode, str] | None = None
        try:
            out = self._capture_fn(request.duration_ms / 1000.0, request.device, stop,
                                   caller_of(context))
        except Exception as e:  # noqa: BLE001 - becomes the RPC's status
            failure = (capture_status(e), str(e) or type(e).__name__)
        finally:
            self._capture_stops.discard(stop)
        if failure is not None:
            context.abort(*failure)
        return capture_reply(out)

    def stop_captures(self) -> None:
        """Ends running captures early (they still answer with what they have)."""
        self.stopping.set()
        for stop in list(self._capture_stops):
            stop.set()


def capture_reply(out: CaptureLike) -> pb.CaptureReply:
    """The ``Capture`` reply carrying what a capture function returned."""
    return pb.CaptureReply(
        trace=out.trace, format=out.format, protocol_version=wire.PROTOCOL_VERSION,
        files=[pb.CaptureFile(name=f.name, size_bytes=f.size_bytes, data=f.data or b"",
                              server_path=f.server_path) for f in out.files],
        truncated=out.truncated, notes=list(out.notes), event_count=out.event_count)


def capture_status(error: Exception) -> grpc.StatusCode:
    """The status a capture function's exception answers with."""
    named = getattr(error, "grpc_status", None)
    if isinstance(named, str) and named in grpc.StatusCode.__members__:
        return grpc.StatusCode[named]
    if isinstance(error, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    log.warning("tpu-info: trace capture failed: %r", error)
    return grpc.StatusCode.INTERNAL


def _serialize(reply: bytes | Any) -> bytes:
    """Replies may be pre-serialized (shared answers) or messages."""
    return reply if isinstance(reply, bytes) else reply.SerializeToString()


def _monitor_handlers(servicer: MonitorServicer) -> grpc.GenericRpcHandler:
    """``tpu_info.v1.Monitor``'s handlers, like the generated
    ``add_MonitorServicer_to_server`` but letting replies be bytes."""
    unary, stream = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    return grpc.method_handlers_generic_handler("tpu_info.v1.Monitor", {
        "GetSnapshot": unary(servicer.GetSnapshot, pb.SnapshotRequest.FromString, _serialize),
        "StreamSnapshots": stream(servicer.StreamSnapshots, pb.StreamRequest.FromString,
                                  _serialize),
        "ListMetrics": unary(servicer.ListMetrics, pb.ListMetricsRequest.FromString,
                             _serialize),
        "Capture": unary(servicer.Capture, pb.CaptureRequest.FromString, _serialize),
    })


def _host_port(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{port}"


class Server:
    """Both services on one port, served by a bounded pool of threads.

    Args:
        snapshot_fn: ``snapshot_fn(events_since) -> Snapshot``, called on a
            server thread for each request.
        address: where to listen (default loopback): an address or a
            comma-separated list; ``0.0.0.0`` is every IPv4 address.
        port: port to bind; 0 picks a free one.
        workers: size of the thread pool.
        max_streams: concurrent ``StreamSnapshots`` calls (default:
            ``workers`` less :data:`RESERVED_WORKERS`, so one-shot calls
            always find a worker).
        metric_infos: names ``ListMetrics`` lists (default: the catalog).
        host_name: ``GetTpuRuntimeStatus``'s host name (default: this host).
        capture_fn: runs ``Capture`` calls (default: none, UNIMPLEMENTED).
    """

    def __init__(
        self,
        snapshot_fn: SnapshotFn,
        *,
        address: str = "127.0.0.1",
        port: int = 0,
        workers: int = DEFAULT_WORKERS,
        max_streams: int | None = None,
        metric_infos: Iterable[MetricInfo] | None = None,
        host_name: str | None = None,
        capture_fn: CaptureFn | None = None,
    ) -> None:
        self.address = address
        self.requested_port = port
        self.port = 0
        streams = (max_streams if max_streams is not None
                   else max(1, workers - min(RESERVED_WORKERS, workers - 1)))
        self._monitor = MonitorServicer(snapshot_fn, streams, metric_infos, capture_fn)
        if capture_fn is not None:
            workers += 1  # the one capture allowed at a time holds a worker of its own
        self._pool = futures.ThreadPoolExecutor(max_workers=workers,
                                                thread_name_prefix="tpu-info-grpc")
        self._server = grpc.server(
            self._pool,
            options=[
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                # Without this two processes could share 8431 on Linux.
                ("grpc.so_reuseport", 0),
                # Accept the clients' keepalive pings (they detect a hung
                # peer) instead of answering frequent pings with GOAWAY.
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
                ("grpc.http2.max_ping_strikes", 0),
            ],
            maximum_concurrent_rpcs=4 * workers,
        )
        self._server.add_generic_rpc_handlers((_monitor_handlers(self._monitor),))
        lpb_grpc.add_RuntimeMetricServiceServicer_to_server(
            RuntimeMetricServicer(snapshot_fn, host_name), self._server)
        self._started = False
        self._stopped = False

    def bind(self) -> int:
        """Binds the port on every address of ``address`` (see
        :func:`metrics.export.binding.addresses`), without serving yet, and
        returns it.

        Raises:
            BindError: an address or the port is taken or invalid.
        """
        port = self.requested_port
        for address in binding.addresses(self.address):
            where = _host_port(address, port)
            try:
                bound = self._server.add_insecure_port(where)
            except RuntimeError as e:
                raise BindError(f"cannot bind {where}: {e}") from e
            if bound == 0:
                raise BindError(f"cannot bind {where}")
            port = bound  # every further address on the same port
        self.port = port
        return port

    def start(self) -> int:
        """Binds (if not yet bound) and starts serving; returns the port."""
        if not self.port:
            self.bind()
        self._server.start()
        self._started = True
        return self.port

    def stop(self, grace: float | None = 1.0) -> None:
        """Ends streams, stops accepting calls, waits up to ``grace`` seconds
        for calls in flight, then shuts the pool down. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._monitor.stop_captures()
        if self._started:
            self._server.stop(grace).wait(timeout=(grace or 0) + 5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
