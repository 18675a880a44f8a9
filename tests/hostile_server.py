"""A hostile monitor on loopback: real gRPC, the generated stubs of
``tpu_info.v1.Monitor`` and libtpu's ``RuntimeMetricService``, replies built to
break a client. Shared by the tests and ``bench/hostile_server.py``.

Kinds of reply (``kind``):

- ``escape``: every string field carries terminal escapes (OSC 0 title, OSC 52
  clipboard, CSI 2J, C1 controls, bidi overrides).
- ``nonfinite``: every double is NaN or an infinity (busy %, percentiles,
  recent transfer samples, times, libtpu gauges and distributions).
- ``huge``: ``graphs`` graphs in one reply (650,000: about 60 MB).
- ``abort``: every call fails with a status whose details carry escapes.

``services`` chooses what it speaks: ``monitor`` (tpu-info's own service),
``libtpu`` (only libtpu's, so a client falls back to it), or both.

Run by hand: ``python -m tests.hostile_server huge --graphs 650000`` prints
its ``host:port`` and serves until stdin closes.

Example:
    >>> with HostileServer("escape") as srv:            # doctest: +SKIP
    ...     subprocess.run(["tpu-info", "--no-discovery", "--target", srv.target])
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent import futures

import grpc

from tpu_info.contract.model import (
    BucketCounts,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    Event,
    GraphRecord,
    MemoryReading,
    ProcessRecord,
    RecompileCause,
    Samples,
    Snapshot,
    Unit,
)
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc
from tpu_info.wire import codec as wire
from tpu_info.wire import libtpu

# Each one has taken over a terminal somewhere.
ESCAPES = ("\x1b]0;pwned-title\x07" "\x1b]52;c;cHduZWQ=\x07" "\x1b[2J\x1b[H"
           "\x9b31m\x9d0;c1-title\x9c" "\u202eevil\u202c\u2066x\u2069" "\x07\r\n")
# What must never reach a terminal: ESC, BEL, C1 controls, bidi controls.
FORBIDDEN = frozenset(["\x1b", "\x07"] + [chr(c) for c in range(0x80, 0xA0)]
                      + [chr(c) for c in (0x200E, 0x200F, 0x061C)]
                      + [chr(c) for c in range(0x202A, 0x202F)]
                      + [chr(c) for c in range(0x2066, 0x206A)])
KINDS = ("escape", "nonfinite", "huge", "abort")


def forbidden_in(text: str) -> list[str]:
    """The forbidden characters in ``text`` (empty when it is safe to print)."""
    return sorted({c for c in text if c in FORBIDDEN})


def _s(tag: str) -> str:
    return f"{tag}{ESCAPES}"


def escape_snapshot(now: float) -> Snapshot:
    """A snapshot whose every string field carries :data:`ESCAPES`."""
    cause = RecompileCause(time_unix=now, description=_s("desc"), location=_s("loc.py:1"),
                           argument=_s("arg"), before=_s("f32[1]"), after=_s("f32[2]"))
    dist = DistributionReading(
        name="TransferToDeviceTime", unit=Unit.TIME_NS, count=1, total=10.0, min=10.0,
        max=10.0, percentiles=((50.0, 10.0),), recent=Samples([now], [10.0]), help=_s("help"))
    odd = DistributionReading(name=_s("Metric"), unit=Unit.NUMBER, count=0, total=0.0,
                              min=None, max=None, help=_s("help"))
    return Snapshot(
        taken_at_unix=now, uptime_seconds=5.0, last_seq=2,
        process=ProcessRecord(pid=4242, name=_s("name"), argv=(_s("python"), _s("train.py")),
                              host=_s("host"), user=_s("user"), engine=_s("jax"),
                              versions={_s("jax"): _s("0.10"), "libtpu": _s("1.0")},
                              start_time_unix=now - 5),
        devices=(DeviceRecord(id=0, kind=_s("kind"), platform=_s("cpu"),
                              memory=MemoryReading(None, source=_s("src"), reason=_s("why")),
                              busy_percent=None, busy_reason=_s("busy")),),
        counters=(CounterReading(_s("Counter"), 1, help=_s("help")),
                  CounterReading("UncachedCompile", 3)),
        distributions=(dist, odd),
        graphs=(GraphRecord(hash=_s("a" * 64), name=_s("jit(step)"), engine=_s("jax"),
                            first_seen_unix=now - 4, last_seen_unix=now, compiles=3,
                            compile_seconds_total=9.0, compile_seconds_last=3.0,
                            signature=(_s("sig"),), signatures=((_s("s1"),), (_s("s2"),)),
                            causes=(cause, cause)),),
        events=(Event(seq=1, time_unix=now, kind=_s("recompile"), name=_s("ev"),
                      graph_hash=_s("h"), detail=_s("detail"), location=_s("loc")),
                Event(seq=2, time_unix=now, kind="compile", name="ok", detail=_s("d"))),
    )


def nonfinite_snapshot(now: float) -> Snapshot:
    """A snapshot whose doubles are NaN or infinities wherever one fits."""
    nan, inf = math.nan, math.inf
    bad = Samples([now, nan, inf], [nan, inf, -inf])
    # Totals are finite but for one (a client before issue 14 refused NaN
    # totals only): min, max, rates, percentiles and recent samples are not.
    dists = tuple(DistributionReading(
        name=name, unit=unit, count=3, total=inf if name == "InboundData" else 30.0, min=-inf,
        max=nan, rate_per_second=nan, value_rate_per_second=inf,
        percentiles=((50.0, nan), (90.0, inf), (nan, 1.0)), recent=bad,
        buckets=BucketCounts(gamma=2.0, positive={1: 3}))
        for name, unit in (("TransferToDeviceTime", Unit.TIME_NS), ("OutboundData", Unit.BYTES),
                           ("TransferFromDeviceTime", Unit.TIME_NS),
                           ("InboundData", Unit.BYTES), ("CompileTime", Unit.TIME_NS)))
    return Snapshot(
        taken_at_unix=now, uptime_seconds=inf, last_seq=1,
        process=ProcessRecord(pid=4243, name="nan-server", argv=("python", "nan.py"),
                              host="localhost", engine="jax", start_time_unix=nan),
        devices=tuple(DeviceRecord(id=i, kind="TPU v5e", platform="tpu",
                                   memory=MemoryReading(1 << 30, limit_bytes=16 << 30,
                                                        source="libtpu"),
                                   busy_percent=(nan, inf, -inf)[i]) for i in range(3)),
        counters=(CounterReading("MarkStep", 10),),
        distributions=dists,
        graphs=(GraphRecord(hash="b" * 64, name="jit(nan)", engine="jax",
                            first_seen_unix=nan, last_seen_unix=inf, compiles=2,
                            compile_seconds_total=nan, compile_seconds_last=inf,
                            causes=(RecompileCause(time_unix=nan, description="shape"),)),
                GraphRecord(hash="c" * 64, name="jit(ok)", engine="jax", first_seen_unix=now,
                            last_seen_unix=now, compiles=1, compile_seconds_total=1.0)),
        events=(Event(seq=1, time_unix=nan, kind="step", value=inf),),
    )


def huge_snapshot_bytes(graphs: int, now: float) -> bytes:
    """The serialized reply with ``graphs`` small graphs (92 bytes each:
    650,000 make 60 MB, under the 64 MiB a client took before issue 14).
    Built as bytes (a message is its fields' bytes one after another): one
    second for 650,000 graphs instead of ten."""
    head = pb.Snapshot(protocol_version=wire.PROTOCOL_VERSION, taken_at_unix=now, last_seq=0)
    head.process.pid = 4244
    head.process.name = "huge"
    rest = pb.Graph(name="g", first_seen_unix=now, last_seen_unix=now,
                    compiles=1).SerializeToString()
    size = 2 + 64 + len(rest)
    assert size < 128  # one byte of length
    prefix = bytes([(7 << 3) | 2, size, (1 << 3) | 2, 64])  # field 7 (graphs), field 1 (hash)
    parts = [head.SerializeToString()]
    parts.extend(b"%s%064x%s" % (prefix, i, rest) for i in range(graphs))
    return b"".join(parts)


# libtpu's service -----------------------------------------------------------

def _libtpu_reply(kind: str, name: str) -> lpb.MetricResponse:
    resp = lpb.MetricResponse()
    resp.metric.name = name if kind != "escape" else _s(name)
    resp.metric.description = _s("description")
    for dev in range(2):
        m = resp.metric.metrics.add()
        m.attribute.key = "device-id"
        m.attribute.value.int_attr = dev
        if name in (libtpu.HBM_USAGE, libtpu.HBM_TOTAL):
            m.gauge.as_int = (1 << 30) if name == libtpu.HBM_USAGE else (16 << 30)
        elif name == libtpu.DUTY_CYCLE:
            m.gauge.as_double = (math.nan, math.inf)[dev] if kind == "nonfinite" else 50.0
        else:
            kv = m.attribute.value.kvlist_attr.attributes.add()
            kv.key = _s("device_ordinal") if kind == "escape" else "device_ordinal"
            kv.value.string_attr = _s(str(dev)) if kind == "escape" else str(dev)
            d = m.distribution
            d.count = 2
            d.mean, d.min, d.max = ((math.nan, -math.inf, math.inf) if kind == "nonfinite"
                                    else (3.0, 2.0, 4.0))
            exp = d.bucket_options.exponential_buckets
            exp.scale = 1.0
            exp.growth_factor = math.inf if kind == "nonfinite" and dev else 2.0
            d.bucket_counts.extend([0, 0, 1, 1])
    return resp


class HostileServer:
    """Serves one ``kind`` of hostile reply on ``127.0.0.1`` (a free port).

    Args:
        kind: one of :data:`KINDS`.
        services: ``monitor``, ``libtpu``, or both.
        graphs: graphs in a ``huge`` reply.
        interval_s: seconds between streamed replies.
        delay_s: seconds each libtpu call waits before it answers (each
            within any per-call timeout, together beyond it).
    """

    def __init__(self, kind: str, services: Sequence[str] = ("monitor",), *,
                 graphs: int = 650_000, interval_s: float = 0.5, delay_s: float = 0.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.interval_s = interval_s
        self.delay_s = delay_s
        self.calls = 0
        now = time.time()
        if kind == "huge":
            self._reply = huge_snapshot_bytes(graphs, now)
        elif kind == "escape":
            self._reply = wire.snapshot_to_proto(escape_snapshot(now)).SerializeToString()
        else:
            self._reply = wire.snapshot_to_proto(nonfinite_snapshot(now)).SerializeToString()
        self.reply_bytes = len(self._reply)
        self._server = grpc.server(futures.ThreadPoolExecutor(8), options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 1 << 20)])
        handlers = []  # Monitor as raw bytes: a 60 MB reply is built once, not per call
        if "monitor" in services:
            handlers.append(grpc.method_handlers_generic_handler("tpu_info.v1.Monitor", {
                "GetSnapshot": grpc.unary_unary_rpc_method_handler(self._snapshot),
                "StreamSnapshots": grpc.unary_stream_rpc_method_handler(self._stream),
                "ListMetrics": grpc.unary_unary_rpc_method_handler(
                    self._list_metrics, response_serializer=pb.ListMetricsReply.SerializeToString),
            }))
        self._server.add_generic_rpc_handlers(tuple(handlers))
        if "libtpu" in services:
            lpb_grpc.add_RuntimeMetricServiceServicer_to_server(_Libtpu(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self._server.start()

    # Monitor (raw bytes: a 60 MB reply is built once, not per call) -------

    def _fail(self, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.INTERNAL, _s("server status details"))

    def _snapshot(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if self.kind == "abort":
            self._fail(context)
        return self._reply

    def _stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.calls += 1
        if self.kind == "abort":
            self._fail(context)
        while context.is_active():
            yield self._reply
            time.sleep(self.interval_s)

    def _list_metrics(self, request: bytes, context: grpc.ServicerContext) -> pb.ListMetricsReply:
        if self.kind == "abort":
            self._fail(context)
        reply = pb.ListMetricsReply(protocol_version=wire.PROTOCOL_VERSION)
        reply.metrics.add(name=_s("Metric"), kind="counter", unit=pb.UNIT_NUMBER, help=_s("h"))
        return reply

    # Lifecycle ------------------------------------------------------------------

    def stop(self) -> None:
        self._server.stop(0)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Libtpu(lpb_grpc.RuntimeMetricServiceServicer):
    """libtpu's service (the generated servicer) answering as ``server`` says."""

    def __init__(self, server: HostileServer) -> None:
        self._srv = server

    def GetRuntimeMetric(self, request: lpb.MetricRequest,  # noqa: N802 - the proto's name
                         context: grpc.ServicerContext) -> lpb.MetricResponse:
        self._srv.calls += 1
        time.sleep(self._srv.delay_s)
        if self._srv.kind == "abort":
            self._srv._fail(context)
        return _libtpu_reply(self._srv.kind, request.metric_name)

    def ListSupportedMetrics(self, request: lpb.ListSupportedMetricsRequest,  # noqa: N802
                             context: grpc.ServicerContext) -> lpb.ListSupportedMetricsResponse:
        if self._srv.kind == "abort":
            self._srv._fail(context)
        resp = lpb.ListSupportedMetricsResponse()
        resp.supported_metric.add(metric_name=_s(libtpu.HBM_USAGE))
        return resp


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hostile_server")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--services", default="monitor", help="monitor, libtpu or monitor,libtpu")
    p.add_argument("--graphs", type=int, default=650_000)
    args = p.parse_args(argv)
    with HostileServer(args.kind, args.services.split(","), graphs=args.graphs) as srv:
        print(srv.target, srv.reply_bytes, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
