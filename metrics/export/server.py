"""The gRPC server inside the hooked program: ``tpu_info.v1.Monitor`` and
libtpu's ``RuntimeMetricService`` on one port.

The server owns a small bounded thread pool; every snapshot is built on one
of its threads when a request arrives, by the injected ``snapshot_fn`` (this
module never reaches for global metrics state). Streams are capped below the
pool size so one-shot calls always find a free worker. Messages are bounded
both ways. ``Capture`` runs the injected ``capture_fn`` (see
:data:`metrics.export.captures.CaptureFn`) with the
:class:`~metrics.export.owner.Caller` (token and peer), which decides who
may capture; without one it answers UNIMPLEMENTED. A capture holds a
worker of its own (the pool has one more thread when ``capture_fn`` is
given), so a concurrent capture is refused at once rather than queued.

No client can make the server hold or do unbounded work (issue 14; figures
in ``bench/attack.py``): connections, streams per connection, handshake,
idle time and age are capped by grpc's channel arguments
(:func:`server_options`), pings beyond the policy earn a GOAWAY, every call
that reaches Python passes one token bucket (:class:`CallPacer`), requests
share one snapshot build per :data:`ANSWER_TTL_S` whatever their
``events_since``, and an answer its peer does not read is cancelled (after
:data:`STALL_S`, or at once when a new stream needs the slot).

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> server = Server(lambda since: Snapshot(taken_at_unix=0.0), port=0)
    >>> port = server.start()
    >>> server.stop(grace=0)
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc

from metrics.export import binding
from metrics.export.binding import BindError
from metrics.export.captures import CaptureFn, SnapshotFn, status_name
from metrics.export.libtpu_service import RuntimeMetricServicer, snapshot_or_abort
from metrics.export.limits import (
    CALL_BURST,
    CALLS_PER_S,
    EVICT_STALLED_S,
    EVICT_WAIT_S,
    STALL_S,
    CallPacer,
    server_options,
)
from metrics.export.owner import caller_of
from tpu_info.contract import catalog as names
from tpu_info.contract.model import Event, MetricInfo, Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc
from tpu_info.wire import codec as wire
from tpu_info.wire import delta, encoder
from tpu_info.wire.fillers import capture_reply

log = logging.getLogger("metrics.export")

MAX_CAPTURE_MS = 300_000


DEFAULT_WORKERS = 40  # threads start on demand; each open stream holds one
RESERVED_WORKERS = 4  # never taken by streams: one-shot calls always find one
ANSWER_TTL_S = 0.05   # requests this close together share one snapshot build
LIST_METRICS_TTL_S = 1.0  # ListMetrics answers are this old at most
MIN_INTERVAL_MS = 50
DEFAULT_INTERVAL_MS = 1000


def _seq(e: Event) -> int:
    return e.seq

@dataclasses.dataclass
class _Build:
    """One snapshot build, shared by every request until it expires."""

    expires: float
    since: int
    snap: Snapshot
    generation: int  # of its parts, for cursors (tpu_info.wire.delta)
    answers: dict[tuple[int, int, tuple[str, ...], int], tuple[bytes, int]] = dataclasses.field(
        default_factory=dict)


def catalog_infos() -> list[MetricInfo]:
    """Every name in :data:`tpu_info.contract.catalog.CATALOG` as a :class:`MetricInfo`."""
    return [MetricInfo(name, kind, unit, help)
            for name, (kind, unit, help) in sorted(names.CATALOG.items())]


class MonitorServicer(pb_grpc.MonitorServicer):
    """``tpu_info.v1.Monitor``: snapshots on request, streams, metric names."""

    def __init__(self, snapshot_fn: SnapshotFn, max_streams: int,
                 metric_infos: Iterable[MetricInfo] | None = None,
                 capture_fn: CaptureFn | None = None,
                 pacer: CallPacer | None = None) -> None:
        self._snapshot_fn = snapshot_fn
        self._capture_fn = capture_fn
        self._capture_stops: set[threading.Event] = set()
        self._infos = list(metric_infos) if metric_infos is not None else catalog_infos()
        self._streams = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._cache = encoder.PartCache()
        self._generations = delta.Generations()
        self._build: _Build | None = None
        self._build_lock = threading.Lock()
        self._listed: tuple[float, bytes] | None = None
        self.pacer = pacer or CallPacer()
        # Answers handed to grpc and not yet delivered: id -> (since when,
        # the call, whether a stream). Entries leave when the call ends.
        self._undelivered: dict[int, tuple[float, grpc.ServicerContext, bool]] = {}
        self._ids = iter(range(1, 2**62))
        self._next_sweep = 0.0
        self.stopping = threading.Event()

    def _pace(self, context: grpc.ServicerContext) -> None:
        if not self.pacer.admit():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"more than {self.pacer.rate:g} calls a second; try again later")

    def shared_snapshot(self, events_since: int) -> _Build:
        """The current shared build, built anew (with ``events_since``) when
        it expired or holds no events that far back. Whatever ``events_since``
        each request carries, a flood costs the program at most a few builds
        per :data:`ANSWER_TTL_S` (each one reaching further back than the last).

        Raises:
            Exception: whatever ``snapshot_fn`` raises.
        """
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + 1.0
            self._cancel_stalled(now, STALL_S, streams_only=False)
        with self._build_lock:  # one build at a time; the others share it
            built = self._build
            if built is None or built.expires <= now or events_since < built.since:
                snap = self._snapshot_fn(events_since)
                built = self._build = _Build(time.monotonic() + ANSWER_TTL_S,
                                             events_since, snap, self._generations.add(snap))
            return built

    def paced_snapshot(self, events_since: int) -> Snapshot:
        """The shared snapshot for callers without a context (libtpu's service).

        Raises:
            RuntimeError: the call rate is over :data:`CALLS_PER_S` (refused).
        """
        if not self.pacer.admit():
            raise RuntimeError(f"more than {self.pacer.rate:g} calls a second; try again later")
        return self.shared_snapshot(events_since).snap

    def _answer(self, events_since: int, max_events: int, context: grpc.ServicerContext,
                cursor: tuple[str, int] | None = None) -> tuple[bytes, int, int]:
        """The serialized snapshot, its last_seq and generation, cut for this
        request from the shared build: the events after ``events_since``,
        and with a ``cursor`` (instance, generation) none of the parts
        unchanged since (:mod:`tpu_info.wire.delta`; another instance's
        cursor gets every part and every event)."""
        if cursor is not None and cursor[0] and cursor[0] != self._generations.instance:
            events_since = 0  # a restarted server: the reader's numbers are another's
        built = snapshot_or_abort(self.shared_snapshot, events_since, context)
        snap = built.snap
        shared = None
        if cursor is not None:
            with self._build_lock:
                shared = self._generations.compare(*cursor, snap)
        key = (min(events_since, snap.last_seq), max_events,
               shared.unchanged if shared else (),
               cursor[1] if cursor is not None and shared and shared.kept else 0)
        with self._build_lock:
            hit = built.answers.get(key)
        if hit is not None:
            return (*hit, built.generation)
        events = snap.events
        if events_since > built.since:
            events = events[bisect.bisect_right(events, events_since, key=_seq):]
        if max_events and len(events) > max_events:
            events = events[-max_events:]
        snap, stamp = self._generations.answer(snap, built.generation, shared, events=events)
        with self._build_lock:  # the encoder's part cache is not thread-safe
            answer = encoder.snapshot_to_bytes(snap, self._cache, stamp), snap.last_seq
            if len(built.answers) < 64:
                built.answers[key] = answer
        return (*answer, built.generation)

    def _evict_for_new_stream(self) -> bool:
        """Every stream slot is taken: the stream whose peer has not read its
        answer for longest gives way, if that is :data:`EVICT_STALLED_S` or
        more (waiting up to :data:`EVICT_WAIT_S` for one to qualify). True
        when this caller then holds a slot."""
        deadline = time.monotonic() + EVICT_WAIT_S
        while time.monotonic() < deadline:
            if self._cancel_stalled(time.monotonic(), EVICT_STALLED_S, streams_only=True,
                                    first_only=True):
                # Its slot comes back when grpc has ended the cancelled call.
                if self._streams.acquire(timeout=2.0):
                    return True
            elif self._streams.acquire(timeout=0.1):
                return True
        return False

    def _handed_over(self, context: grpc.ServicerContext, stream: bool) -> int:
        """Notes an answer given to grpc; :meth:`_delivered` (or the call's
        end) forgets it."""
        token = next(self._ids)
        self._undelivered[token] = (time.monotonic(), context, stream)
        if not stream and not context.add_callback(lambda: self._delivered(token)):
            self._delivered(token)  # the call has already ended
        return token

    def _delivered(self, token: int) -> None:
        self._undelivered.pop(token, None)

    def _cancel_stalled(self, now: float, older_than_s: float, streams_only: bool,
                        first_only: bool = False) -> int:
        """Cancels calls whose answer has waited ``older_than_s`` for its peer
        to read it (oldest first); returns how many."""
        stalled = sorted((since, token, context) for token, (since, context, stream)
                         in list(self._undelivered.items())
                         if now - since >= older_than_s and (stream or not streams_only))
        for _, token, context in stalled[:1] if first_only else stalled:
            self._undelivered.pop(token, None)
            context.cancel()
        return min(len(stalled), 1) if first_only else len(stalled)

    def GetSnapshot(self, request: pb.SnapshotRequest,
                    context: grpc.ServicerContext) -> bytes:
        self._pace(context)
        cursor = ((request.cursor.instance, request.cursor.generation)
                  if request.HasField("cursor") else None)
        data = self._answer(request.events_since, request.max_events, context, cursor)[0]
        self._handed_over(context, stream=False)
        return data

    def StreamSnapshots(self, request: pb.StreamRequest,
                        context: grpc.ServicerContext) -> Iterator[bytes]:
        if not self._streams.acquire(blocking=False) and not self._evict_for_new_stream():
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
        # With a cursor, each snapshot leaves out what the previous one sent.
        cursor = ((request.cursor.instance, request.cursor.generation)
                  if request.HasField("cursor") else None)
        token = 0
        try:
            while context.is_active() and not self.stopping.is_set():
                self.pacer.admit(max_wait_s=float("inf"))  # waits its turn, never refused
                data, since, generation = self._answer(since, request.max_events, context,
                                                       cursor)
                if cursor is not None:
                    cursor = (self._generations.instance, generation)
                token = self._handed_over(context, stream=True)
                yield data
                self._delivered(token)
                if wake.wait(interval_s) or self.stopping.is_set():
                    break
        finally:
            self._delivered(token)
            release()

    def ListMetrics(self, request: pb.ListMetricsRequest,
                    context: grpc.ServicerContext) -> bytes:
        self._pace(context)
        listed = self._listed
        if listed is not None and listed[0] > time.monotonic():
            return listed[1]
        infos = {i.name: i for i in self._infos}
        snap = snapshot_or_abort(self.shared_snapshot, 2**62, context).snap
        for c in snap.counters:
            infos.setdefault(c.name, MetricInfo(c.name, "counter", c.unit, c.help))
        for d in snap.distributions:
            infos.setdefault(d.name, MetricInfo(d.name, "distribution", d.unit, d.help))
        data = wire.metric_infos_to_proto(infos[n] for n in sorted(infos)).SerializeToString()
        self._listed = (time.monotonic() + LIST_METRICS_TTL_S, data)
        return data

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
            failure = (grpc.StatusCode[status_name(e)], str(e) or type(e).__name__)
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
        port: port to bind; 0 picks a free one; None: no TCP at all, the
            local socket alone (``local_socket`` is then required).
        workers: size of the thread pool.
        max_streams: concurrent ``StreamSnapshots`` calls (default:
            ``workers`` less :data:`RESERVED_WORKERS`, so one-shot calls
            always find a worker).
        metric_infos: names ``ListMetrics`` lists (default: the catalog).
        host_name: ``GetTpuRuntimeStatus``'s host name (default: this host).
        capture_fn: runs ``Capture`` calls (default: none, UNIMPLEMENTED).
        calls_per_s: calls a second that reach Python (see :class:`CallPacer`).
        local_socket: a Unix socket path to listen on too, for the program's
            own user (:func:`metrics.export.binding.add_local_socket`).

    Every server gets :func:`server_options`: at most
    :data:`MAX_CONNECTIONS` connections of :data:`MAX_STREAMS_PER_CONNECTION`
    streams each, handshakes within :data:`HANDSHAKE_TIMEOUT_MS`, idle
    connections closed, ping floods answered with GOAWAY.
    """

    def __init__(
        self,
        snapshot_fn: SnapshotFn,
        *,
        address: str = "127.0.0.1",
        port: int | None = 0,
        workers: int = DEFAULT_WORKERS,
        max_streams: int | None = None,
        metric_infos: Iterable[MetricInfo] | None = None,
        host_name: str | None = None,
        capture_fn: CaptureFn | None = None,
        calls_per_s: float = CALLS_PER_S,
        local_socket: str | None = None,
    ) -> None:
        self.address = address
        self._local_path = local_socket or ""
        self.local_socket = ""  # the socket's path once bound
        self.requested_port = port
        self.port = 0
        streams = (max_streams if max_streams is not None
                   else max(1, workers - min(RESERVED_WORKERS, workers - 1)))
        pacer = CallPacer(calls_per_s, max(CALL_BURST, int(calls_per_s / 5)))
        self._monitor = MonitorServicer(snapshot_fn, streams, metric_infos, capture_fn, pacer)
        if capture_fn is not None:
            workers += 1  # the one capture allowed at a time holds a worker of its own
        self._pool = futures.ThreadPoolExecutor(max_workers=workers,
                                                thread_name_prefix="tpu-info-grpc")
        self._server = grpc.server(
            self._pool,
            options=server_options(),
            maximum_concurrent_rpcs=4 * workers,
        )
        self._server.add_generic_rpc_handlers((_monitor_handlers(self._monitor),))
        lpb_grpc.add_RuntimeMetricServiceServicer_to_server(
            RuntimeMetricServicer(self._monitor.paced_snapshot, host_name), self._server)
        self._started = False
        self._stopped = False
        self._bound = False

    def bind(self) -> int:
        """Binds the port on every address of ``address`` (see
        :func:`metrics.export.binding.addresses`) and the local socket,
        without serving yet, and returns the port (0: the socket alone).

        Raises:
            BindError: an address or the port is taken or invalid; or, with
                no TCP (``port=None``), the local socket cannot be had.
        """
        self._bound = True
        if self.requested_port is None:  # the local socket alone: grpc never sees TCP
            if not (self._local_path and binding.add_local_socket(self._server,
                                                                  self._local_path)):
                raise BindError("no TCP here, and no local socket"
                                + (f" at {self._local_path}" if self._local_path else ""))
            self.local_socket = self._local_path
            return 0
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
        if self._local_path and binding.add_local_socket(self._server, self._local_path):
            self.local_socket = self._local_path  # its own connection cap: see binding
        return port

    def start(self) -> int:
        """Binds (if not yet bound) and starts serving; returns the port."""
        if not self._bound:
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

    def halt(self) -> None:
        """Stops at once for an ending program: calls in flight are
        cancelled (streams and captures end), nothing is waited for. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._monitor.stop_captures()
        if self._started:
            self._server.stop(None)  # cancels every call; its event is not waited on
        self._pool.shutdown(wait=False, cancel_futures=True)
