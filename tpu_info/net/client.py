"""gRPC client: one target (tpu-info's own service or libtpu's), or many at once.

A :class:`Client` owns one channel and closes it; every failure is a
:class:`~tpu_info.contract.errors.TpuInfoError` naming the target. A call's timeout
covers decoding its reply too (:func:`tpu_info.wire.codec.snapshot_from_proto`
stops at the deadline), and replies over 32 MiB are refused unread.
:func:`tpu_info.net.fanout.fan_out` asks many targets concurrently within one
deadline, so a slow, dead or flooding target fails on its own and the round
still ends in time.

Example:
    >>> from tpu_info.net.client import Client
    >>> from tpu_info.net.fanout import fan_out
    >>> with Client("localhost:8431", timeout=2.0) as c:   # doctest: +SKIP
    ...     snap = c.snapshot()
    ...     print(snap.counter("UncachedCompile"))
    ...     trace_json = c.capture(5.0)             # a 5 s Chrome trace of that program
    >>> for r in fan_out(["h1:8431", "h2:8431"], timeout=2.0):  # doctest: +SKIP
    ...     print(r.target, r.error or r.value.last_seq)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from tpu_info.contract.captures import CaptureFile, RemoteCapture
from tpu_info.contract.discovery_record import CAPTURE_TOKEN_METADATA
from tpu_info.contract.errors import (
    CaptureBusy,
    CaptureRefused,
    NotAMonitor,
    ProtocolMismatch,
    ReplyTooLarge,
    ServerError,
    TimedOut,
    TpuInfoError,
    Unreachable,
)
from tpu_info.contract.model import DistributionReading, MetricInfo, Snapshot
from tpu_info.contract.safe import clean
from tpu_info.net import discovery, local_socket, probe
from tpu_info.net.targets import is_loopback_host, is_unix, validate_target
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc
from tpu_info.wire import codec as wire
from tpu_info.wire import delta, libtpu

T = TypeVar("T")
M = TypeVar("M")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_KEEPALIVE_S = 10.0
MAX_CAPTURE_S = 300.0
MAX_CAPTURE_FILES = 64  # device files taken from one reply; the hook sends at most 16
CAPTURE_MARGIN_S = 30.0  # beyond the window: building the trace, device profilers
# The largest snapshot a real hook sends: 2,000 graphs, each with its 32 causes
# and 8 signatures (27 MiB with long descriptions and 20-argument signatures),
# and 25,000 events (5 MiB). A 60 MB reply of 650,000 graphs is refused unread.
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def split_target(target: str) -> tuple[str, int]:
    """``("host", port)`` of ``"host:port"`` or ``"[v6]:port"``.

    Raises:
        Unreachable: the target is not ``host:port``.
    """
    try:
        validate_target(target)
    except ValueError as e:
        raise Unreachable(str(e), target=target) from None
    host, _, port = target.strip().rpartition(":")
    return host.strip("[]"), int(port)


def status_details(e: grpc.RpcError) -> str:
    """A failed call's status details, cleaned: a server chooses them."""
    return clean((e.details() if hasattr(e, "details") else "") or "")


def _unavailable(target: str, details: str, timeout: float) -> TpuInfoError:
    """Why a TCP target's connection failed, from one look at it (:mod:`probe`)."""
    try:
        verdict = probe.look(*split_target(target), timeout=timeout)
    except Unreachable:
        verdict = probe.Verdict.NOTHING
    if verdict is probe.Verdict.CLOSED_AT_ONCE:
        return Unreachable("the target refused the connection: it closes new connections at "
                           "once, as a server does when other clients hold all its connections; "
                           f"try again later ({details})", target=target)
    if verdict in (probe.Verdict.SILENT, probe.Verdict.OTHER):
        return NotAMonitor(f"something listens here but does not speak gRPC ({details})",
                           target=target)
    if verdict is probe.Verdict.HTTP2:
        return Unreachable(f"the connection failed, though an HTTP/2 server answers here "
                           f"now ({details})", target=target)
    return Unreachable(f"cannot connect ({details})", target=target)


class Client:
    """A connection to one monitor: a tpu-info hook or libtpu.

    Args:
        target: ``host:port``, or ``unix:PATH`` for a program served on its
            local socket alone (only this user's socket in a private
            directory: :func:`tpu_info.net.local_socket.unix_path`).
        timeout: seconds allowed for each call, decoding its reply included.
        max_message_bytes: largest reply accepted (larger: :class:`ReplyTooLarge`).
        deadline: ``time.monotonic()`` by which every call must have ended,
            however many are made (None: each call has its ``timeout``).

    A loopback target that a discovery record of this user names is dialled
    over the program's local Unix socket when it has one
    (:mod:`tpu_info.net.local_socket`: other users cannot reach it, so they
    cannot lock its owner out); other loopback targets with
    ``grpc.local_channel_credentials()`` (what libtpu expects; the hook
    accepts it too), others in plain text.
    """

    def __init__(self, target: str, timeout: float = DEFAULT_TIMEOUT_S, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 keepalive_s: float = DEFAULT_KEEPALIVE_S,
                 follower: delta.Follower | None = None,
                 deadline: float | None = None) -> None:
        if is_unix(target):  # a program served on its local socket alone
            try:
                host, local = "", f"unix:{local_socket.unix_path(target)}"
            except ValueError as e:
                raise Unreachable(str(e), target=target) from None
        else:
            (host, _), local = split_target(target), ""
        self.target = target
        self.timeout = timeout
        self.deadline = deadline
        self.max_message_bytes = max_message_bytes
        self._started = time.monotonic()
        # Snapshots of one target repeat most parts: those are not decoded
        # again, nor sent again to :meth:`follow` (the last whole snapshot).
        self._follower = follower if follower is not None else delta.Follower()
        self._parts = self._follower.parts
        self._only_libtpu = False  # the server answered that it is not our Monitor
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 1024 * 1024),
            ("grpc.enable_retries", 0),
            ("grpc.enable_http_proxy", 0),
            # HTTP/2 pings on open calls: a peer that stops answering (a
            # stopped or hung process keeps its socket open) ends a stream
            # with UNAVAILABLE instead of leaving it silent forever.
            ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(max(0.5, keepalive_s / 2) * 1000)),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        # target, or unix:<path> (the program's own socket: its user only)
        self.dialled = local or local_socket.dial_address(target)
        self._local = self.dialled.startswith("unix:")
        if self._local:
            self._channel = grpc.insecure_channel(self.dialled, options=options)
        elif is_loopback_host(host):
            self._channel = grpc.secure_channel(target, grpc.local_channel_credentials(),
                                                options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._monitor = pb_grpc.MonitorStub(self._channel)
        self._libtpu = lpb_grpc.RuntimeMetricServiceStub(self._channel)

    # Lifecycle -------------------------------------------------------------

    def renew(self, timeout: float, deadline: float | None,
              follower: delta.Follower | None = None) -> Client:
        """This client (its channel kept open) for another round of calls:
        ``timeout`` and ``deadline`` as at construction, and ``follower``
        when given. Not for a client another thread is using."""
        self.timeout, self.deadline, self._started = timeout, deadline, time.monotonic()
        if follower is not None:
            self._follower, self._parts = follower, follower.parts
        return self

    def close(self) -> None:
        """Closes the channel (idempotent)."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Errors ----------------------------------------------------------------

    def _error(self, e: grpc.RpcError, service: str, started: float) -> TpuInfoError:
        code = e.code() if hasattr(e, "code") else None
        details = status_details(e)
        t = self.target
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return TimedOut(f"no answer within {self._allowed():.3g}s", target=t)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return NotAMonitor(f"a gRPC server answers here, but not {service} ({details})",
                               target=t)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            return ReplyTooLarge(f"the reply is larger than the {self.max_message_bytes / 2**20:g}"
                                 f" MiB this client accepts ({details})", target=t)
        if code == grpc.StatusCode.UNAVAILABLE and self._local:
            if "timed out" in details:  # the socket took it, the program did not answer
                return TimedOut(f"no answer within {self._allowed():.3g}s (over its local "
                                "socket: the program is stopped or too busy to answer)", target=t)
            return Unreachable(f"cannot connect over its local socket ({details})", target=t)
        if code == grpc.StatusCode.UNAVAILABLE:
            left = self.timeout - (time.monotonic() - started)
            return _unavailable(t, details, min(left, 1.0))
        if code == grpc.StatusCode.INTERNAL and ("http" in details.lower()
                                                 or "protocol" in details.lower()):
            return NotAMonitor(f"the peer does not speak gRPC ({details})", target=t)
        name = code.name if code is not None else "UNKNOWN"
        return ServerError(f"{service} answered {name}: {details}", target=t)

    def _allowed(self) -> float:
        """The seconds this client was given: ``timeout``, or less with a deadline."""
        return self.timeout if self.deadline is None else min(
            self.timeout, max(0.0, self.deadline - self._started))

    def _call_deadline(self) -> float:
        """When the call starting now (and the decoding of its reply) must end.

        Raises:
            TimedOut: the client's deadline has already passed.
        """
        now = time.monotonic()
        end = now + self.timeout
        if self.deadline is not None:
            if now >= self.deadline:
                raise TimedOut(f"no time left of {self._allowed():.3g}s", target=self.target)
            end = min(end, self.deadline)
        return end

    def _call(self, rpc: Callable[..., T], request: object, service: str,
              end: float | None = None) -> T:
        started = time.monotonic()
        end = end if end is not None else self._call_deadline()
        try:
            return rpc(request, timeout=max(0.001, end - started))
        except grpc.RpcError as e:
            raise self._error(e, service, started) from e

    # tpu_info.v1.Monitor ---------------------------------------------------

    def snapshot(self, events_since: int = 0, max_events: int = 0) -> Snapshot:
        """The hook's whole snapshot, with the events after ``events_since``.

        Raises:
            TpuInfoError: one of its subclasses, naming this target.
        """
        end = self._call_deadline()
        msg = self._call(self._monitor.GetSnapshot,
                         pb.SnapshotRequest(events_since=events_since, max_events=max_events),
                         "tpu_info.v1.Monitor", end)
        return self._decode(self._snapshot_from_proto, msg, end)

    def follow(self) -> Snapshot:
        """The hook's whole snapshot, asking with this client's cursor (its
        follower's last whole snapshot): the answer carries only the events
        and parts that are new, and is merged into the last one
        (:mod:`tpu_info.wire.delta`). The first answer, and one from a
        restarted server, is a full one.

        Raises:
            TpuInfoError: one of its subclasses, naming this target.
        """
        held = self._follower.held
        end = self._call_deadline()
        msg = self._call(self._monitor.GetSnapshot, _with_cursor(pb.SnapshotRequest(), held),
                         "tpu_info.v1.Monitor", end)
        return self._merge(msg, held, end)

    def _merge(self, msg: pb.Snapshot, held: delta.Held | None, end: float) -> Snapshot:
        answer = self._decode(self._snapshot_from_proto, msg, end)
        return self._decode(self._follower.apply, answer, delta.stamp_of(msg), held)

    def read_latest(self) -> tuple[str, Snapshot]:
        """Like :meth:`read`, with :meth:`follow` for a hook: how fan-out
        rounds, the exporter and the dashboard read a target again and again.

        Raises:
            TpuInfoError: one of its subclasses, naming this target.
        """
        if not self._only_libtpu:
            try:
                return "hook", self.follow()
            except NotAMonitor:
                self._only_libtpu = True
        return "libtpu", self.libtpu()

    def read(self, events_since: int = 0) -> tuple[str, Snapshot]:
        """``("hook", snapshot)``, or ``("libtpu", snapshot)`` from libtpu's
        service when the server speaks only that one (then this client asks
        only libtpu's from then on): how the CLI and the dashboard read a target.

        Raises:
            TpuInfoError: one of its subclasses, naming this target.
        """
        if not self._only_libtpu:
            try:
                return "hook", self.snapshot(events_since)
            except NotAMonitor:
                self._only_libtpu = True
        return "libtpu", self.libtpu()

    def _snapshot_from_proto(self, msg: pb.Snapshot, end: float | None = None) -> Snapshot:
        return wire.snapshot_from_proto(msg, self._parts, deadline=end,
                                        seconds=self._allowed())

    def stream(self, interval_s: float = 1.0, events_since: int = 0,
               duration_s: float | None = None, *, follow: bool = False) -> Iterator[Snapshot]:
        """Snapshots pushed every ``interval_s`` (the server's floor is 50 ms).

        Each snapshot carries the events since the previous one. With
        ``follow``, each is whole although the server sends only what changed
        (as :meth:`follow`: the events after the previous snapshot's, merged
        into it). Ends after ``duration_s`` if given; closing the iterator
        cancels the stream.

        Raises:
            TpuInfoError: while iterating, naming this target.
        """
        held = self._follower.held if follow else None
        request = _with_cursor(pb.StreamRequest(interval_ms=max(1, int(interval_s * 1000)),
                                                events_since=events_since), held)
        if follow:
            request.cursor.SetInParent()  # asks for deltas even without a cursor yet
        started = time.monotonic()
        call = self._monitor.StreamSnapshots(request, timeout=duration_s)
        try:
            for msg in call:
                end = time.monotonic() + self.timeout
                if follow:
                    yield self._merge(msg, held, end)
                    held = self._follower.held
                else:
                    yield self._decode(self._snapshot_from_proto, msg, end)
        except grpc.RpcError as e:
            if (duration_s is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    and time.monotonic() - started >= duration_s * 0.99):
                return
            raise self._error(e, "tpu_info.v1.Monitor", started) from e
        finally:
            call.cancel()

    def list_metrics(self) -> list[MetricInfo]:
        """Names the hook records, with unit, kind and help text."""
        reply = self._call(self._monitor.ListMetrics, pb.ListMetricsRequest(),
                           "tpu_info.v1.Monitor")
        return self._decode(wire.metric_infos_from_proto, reply)

    def capture(self, duration_s: float, *, secret: str | None = None) -> bytes:
        """Records a trace in the hook for ``duration_s`` seconds and returns
        it (Chrome Trace Event JSON, not compressed). Only the program's
        owner may: see :meth:`capture_files` for ``secret``.

        Raises:
            CaptureRefused: not this user's program on this host.
            CaptureBusy: another capture is running in that process.
            TpuInfoError: another of its subclasses, naming this target.
        """
        return self.capture_files(duration_s, secret=secret).trace

    def capture_files(self, duration_s: float, *, device: bool = False,
                      secret: str | None = None) -> RemoteCapture:
        """Like :meth:`capture`, with the device profilers' files when ``device``.

        Args:
            duration_s: seconds to record.
            device: also the device profilers' traces (the program must opt in).
            secret: the program's capture secret (default: from this user's
                discovery record of the process serving this loopback target,
                :func:`tpu_info.net.discovery.secret_for`).

        Raises:
            ValueError: ``duration_s`` is not in (0, 300].
            CaptureRefused: no record of this user names the target (it is
                another user's program, or on another host), or the hook
                refused the secret.
            CaptureBusy: another capture is running in that process.
            ProtocolMismatch: a reply with a file name that is not a plain
                relative path.
            TpuInfoError: another of its subclasses, naming this target.
        """
        if not 0 < duration_s <= MAX_CAPTURE_S:
            raise ValueError(f"duration_s must be in (0, {MAX_CAPTURE_S:g}], got {duration_s!r}")
        if secret is None:
            secret = discovery.secret_for(self.target)
        if secret is None:
            raise CaptureRefused("captures are for the program's owner, and no discovery "
                                 "record of yours names this target: run tpu-info profile as "
                                 "the user who runs the program, on its host",
                                 target=self.target)
        request = pb.CaptureRequest(duration_ms=max(1, round(duration_s * 1000)), device=device)
        metadata = [(CAPTURE_TOKEN_METADATA, secret)] if secret else None
        started = time.monotonic()
        try:
            reply = self._monitor.Capture(request, metadata=metadata,
                                          timeout=duration_s + self.timeout + CAPTURE_MARGIN_S)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = status_details(e)
            if code == grpc.StatusCode.ABORTED:
                raise CaptureBusy(details, target=self.target) from e
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise CaptureRefused(details, target=self.target) from e
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise ServerError(f"this hook does not capture traces ({details}); "
                                  "update tpu-info in that program", target=self.target) from e
            raise self._error(e, "tpu_info.v1.Monitor", started) from e
        self._decode(wire.check_version, reply.protocol_version)
        files = []
        notes = list(reply.notes)
        if len(reply.files) > MAX_CAPTURE_FILES:
            notes.append(f"{len(reply.files) - MAX_CAPTURE_FILES} more device file(s) in the "
                         f"reply were left out (at most {MAX_CAPTURE_FILES})")
        for f in reply.files[:MAX_CAPTURE_FILES]:
            parts = f.name.split("/")
            if not f.name or f.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ProtocolMismatch(f"capture file name {f.name!r} is not a relative path",
                                       target=self.target)
            files.append(CaptureFile(f.name, f.size_bytes,
                                     f.data if not f.server_path else None, f.server_path))
        return RemoteCapture(trace=reply.trace, format=reply.format or "chrome-json",
                             files=tuple(files), notes=tuple(notes),
                             truncated=reply.truncated, event_count=reply.event_count)

    def _decode(self, fn: Callable[..., T], msg: M, *args: object) -> T:
        try:
            return fn(msg, *args)
        except (ProtocolMismatch, TimedOut) as e:
            raise e.with_target(self.target) from e

    # libtpu's RuntimeMetricService -------------------------------------------

    def _libtpu_metric(self, name: str, required: bool) -> lpb.MetricResponse | None:
        started = time.monotonic()
        end = self._call_deadline()
        try:
            return self._libtpu.GetRuntimeMetric(lpb.MetricRequest(metric_name=name),
                                                 timeout=max(0.001, end - started))
        except grpc.RpcError as e:
            if not required and e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error(e, "tpu.monitoring.runtime.RuntimeMetricService", started) from e

    def supported_libtpu_metrics(self) -> list[str]:
        """``ListSupportedMetrics`` of libtpu's service."""
        resp = self._call(self._libtpu.ListSupportedMetrics,
                          lpb.ListSupportedMetricsRequest(),
                          "tpu.monitoring.runtime.RuntimeMetricService")
        return [wire.text(m.metric_name) for m in resp.supported_metric[:wire.MAX_METRICS]]

    def libtpu(self) -> Snapshot:
        """Reads libtpu's service (or a hook's copy of it) into a snapshot:
        devices with HBM used/total and duty cycle, and the latency
        distributions it serves (``TransferToDeviceTime``,
        ``TransferFromDeviceTime``, ``ExecuteTime``; per-device or per-size
        ones carry their labels in the name). No process, graphs or events.

        Raises:
            TpuInfoError: one of its subclasses, naming this target.
        """
        usage = self._libtpu_metric(libtpu.HBM_USAGE, required=True)
        total = self._libtpu_metric(libtpu.HBM_TOTAL, required=True)
        duty = self._libtpu_metric(libtpu.DUTY_CYCLE, required=False)
        dists: list[DistributionReading] = []
        notes: list[tuple[str, str]] = []
        for name in libtpu.LATENCY_NAMES:
            resp = self._libtpu_metric(name, required=False)
            if resp is not None:
                dists.extend(self._decode(libtpu.readings_from_response, resp, notes))
        if usage is None or total is None:  # required=True raises instead; for the type checker
            raise NotAMonitor("no HBM metrics", target=self.target)
        devices = self._decode(libtpu.devices_from_responses, usage, total, duty, notes)
        return Snapshot(taken_at_unix=time.time(), devices=devices, distributions=tuple(dists),
                        left_out=tuple(dict.fromkeys(notes))[:wire.MAX_NOTES])


R = TypeVar("R", pb.SnapshotRequest, pb.StreamRequest)


def _with_cursor(request: R, held: delta.Held | None) -> R:
    """``request`` asking for what is new since ``held`` (nothing held: all)."""
    if held is not None:
        whole, stamp = held
        request.events_since = whole.last_seq
        request.cursor.instance = stamp.instance
        request.cursor.generation = stamp.generation
    return request
