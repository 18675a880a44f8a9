"""The hook's gRPC server: our service and libtpu's, on real loopback servers."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

import grpc
import pytest

from metrics import export
from metrics.export.server import BindError, Server
from tpu_info.contract.errors import NotAMonitor, TpuInfoError
from tpu_info.contract.model import (
    BucketCounts,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    MemoryReading,
    Snapshot,
    Unit,
)
from tpu_info.net.client import Client
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.proto import tpu_info_v1_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc
from tpu_info.wire import libtpu

jax = pytest.importorskip("jax")
jnp = jax.numpy


class Capturing:
    """A snapshot_fn over the real global metrics that keeps what it served."""

    def __init__(self) -> None:
        import metrics

        self._snapshot = metrics.snapshot
        self.served: list[Snapshot] = []
        self.threads: set[str] = set()

    def __call__(self, events_since: int) -> Snapshot:
        self.threads.add(threading.current_thread().name)
        snap = self._snapshot(events_since)
        self.served.append(snap)
        return snap


@pytest.fixture
def workload(fresh_metrics):
    import metrics

    @jax.jit
    def step(x):
        return jnp.tanh(x) * 3

    tracked = metrics.track(step, name="step")
    for n in (4, 4, 8):
        tracked(jnp.ones(n)).block_until_ready()
    for i in range(10):
        jax.device_get(jax.device_put(jnp.arange(100.0 + i)))
    metrics.mark_step()
    metrics.mark_step()
    return fresh_metrics


@pytest.fixture
def served(workload):
    fn = Capturing()
    exporter = export.start(fn, port=0)
    yield exporter, fn
    exporter.stop(grace=0)


def test_snapshot_round_trip_equals_metrics_snapshot(served) -> None:
    exporter, fn = served
    with Client(exporter.address, timeout=10) as c:
        got = c.snapshot()
    assert got == fn.served[-1]
    assert got.counter("MarkStep") == 2
    assert got.distribution("ExecuteTime").count == 3
    assert any(g.name == "jit(step)" or "step" in g.name for g in got.graphs)
    assert len(got.devices) == len(jax.local_devices())
    assert got.events and got.events[-1].seq == got.last_seq
    assert all(name.startswith("tpu-info-grpc") for name in fn.threads)


def test_events_since_and_max_events(served) -> None:
    exporter, fn = served
    with Client(exporter.address, timeout=10) as c:
        full = c.snapshot()
        later = c.snapshot(events_since=full.last_seq - 2)
        newest = c.snapshot(max_events=1)
    assert [e.seq for e in later.events] == [full.last_seq - 1, full.last_seq]
    assert [e.seq for e in newest.events] == [full.last_seq]


def test_list_metrics_uses_catalog(served) -> None:
    exporter, _ = served
    with Client(exporter.address, timeout=10) as c:
        infos = {i.name: i for i in c.list_metrics()}
    assert infos["CompileTime"].unit is Unit.TIME_NS
    assert infos["CompileTime"].kind == "distribution"
    assert infos["MarkStep"].kind == "counter" and infos["MarkStep"].help


def test_capture_is_unimplemented(served) -> None:
    exporter, _ = served
    with grpc.insecure_channel(exporter.address) as ch:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.MonitorStub(ch).Capture(pb.CaptureRequest(duration_ms=10), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_stream_at_interval_carries_new_events(served) -> None:
    import metrics

    exporter, _ = served
    with Client(exporter.address, timeout=10) as c:
        first = c.snapshot()
        stream = c.stream(interval_s=0.1, events_since=first.last_seq)
        times = []
        seen = []
        for i, snap in enumerate(stream):
            times.append(time.monotonic())
            seen.extend(e.seq for e in snap.events)
            metrics.mark_step()
            if i == 4:
                break
        stream.close()
    # Messages can bunch up in the client's buffers, so check the pace over
    # the run rather than each gap.
    assert times[-1] - times[0] >= 4 * 0.09, times
    assert seen == sorted(set(seen)) and len(seen) >= 4  # each step's event, once


def test_stream_interval_floor(served) -> None:
    exporter, _ = served
    with Client(exporter.address, timeout=10) as c:
        t0 = time.monotonic()
        stream = c.stream(interval_s=0.001)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
    assert time.monotonic() - t0 >= 0.14  # three gaps of at least 50 ms


def test_client_leaving_mid_stream_leaves_server_serving(served) -> None:
    exporter, _ = served
    for _ in range(6):  # more streams than workers, one after another
        ch = grpc.insecure_channel(exporter.address)
        call = pb_grpc.MonitorStub(ch).StreamSnapshots(pb.StreamRequest(interval_ms=50))
        next(call)
        ch.close()  # vanish without cancelling politely
    with Client(exporter.address, timeout=5) as c:
        assert c.snapshot().counter("MarkStep") == 2
        stream = c.stream(interval_s=0.05)
        assert next(stream).counter("MarkStep") == 2
        stream.close()


def test_stop_ends_streams_and_is_clean(workload) -> None:
    exporter = export.start(Capturing(), port=0)
    with Client(exporter.address, timeout=5) as c:
        stream = c.stream(interval_s=0.05)
        next(stream)
        t0 = time.monotonic()
        exporter.stop(grace=1.0)
        assert exporter.stopped
        rest = []
        try:
            for snap in stream:  # the server ends the stream (OK or UNAVAILABLE)
                rest.append(snap)
        except TpuInfoError:
            pass
        assert len(rest) <= 2
        assert time.monotonic() - t0 < 3.0
    exporter.stop()  # idempotent
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", exporter.port)) != 0


def test_snapshot_failure_is_internal_not_crash() -> None:
    def broken(_: int) -> Snapshot:
        raise RuntimeError("boom")

    exporter = export.start(broken, port=0)
    try:
        with grpc.insecure_channel(exporter.address) as ch:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.MonitorStub(ch).GetSnapshot(pb.SnapshotRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "boom" in info.value.details()
    finally:
        exporter.stop(grace=0)


# libtpu's service ------------------------------------------------------------

GAMMA = 1.01


def _fixed_snapshot() -> Snapshot:
    buckets = BucketCounts(gamma=GAMMA, positive={1200: 3, 1201: 1, 1300: 2}, zero=1)
    return Snapshot(
        taken_at_unix=1_700_000_000.5,
        devices=(
            DeviceRecord(1, "cpu", "cpu", MemoryReading(100, 100, 1000, "live_arrays")),
            DeviceRecord(0, "cpu", "cpu", MemoryReading(None, None, None, "none", "n/a"),
                         busy_percent=12.5),
        ),
        counters=(CounterReading("MarkStep", 1),),
        distributions=(
            DistributionReading("ExecuteTime", Unit.TIME_NS, 7, 7e5, 0.0, GAMMA**1300,
                                buckets=buckets),
            DistributionReading("TransferToDeviceTime", Unit.TIME_NS, 7, 7e5, 0.0,
                                GAMMA**1300, buckets=buckets),
        ),
    )


@pytest.fixture
def libtpu_server():
    exporter = export.start(lambda since: _fixed_snapshot(), port=0)
    yield exporter
    exporter.stop(grace=0)


def test_libtpu_gauges_with_local_channel_credentials(libtpu_server) -> None:
    ch = grpc.secure_channel(libtpu_server.address, grpc.local_channel_credentials())
    with ch:
        stub = lpb_grpc.RuntimeMetricServiceStub(ch)

        def get(name: str) -> lpb.MetricResponse:
            return stub.GetRuntimeMetric(lpb.MetricRequest(metric_name=name), timeout=5)

        usage, total, duty = get(libtpu.HBM_USAGE), get(libtpu.HBM_TOTAL), get(libtpu.DUTY_CYCLE)
        assert [(m.attribute.key, m.attribute.value.int_attr, m.gauge.as_int)
                for m in usage.metric.metrics] == [("device-id", 0, 0), ("device-id", 1, 100)]
        assert [m.gauge.as_int for m in total.metric.metrics] == [0, 1000]
        assert [m.gauge.as_double for m in duty.metric.metrics] == [12.5, 0.0]
        listed = stub.ListSupportedMetrics(lpb.ListSupportedMetricsRequest(), timeout=5)
        assert libtpu.HBM_USAGE in [m.metric_name for m in listed.supported_metric]
        status = stub.GetTpuRuntimeStatus(lpb.GetTpuRuntimeStatusRequest(), timeout=5)
        assert status.HasField("host_name") and status.host_name == socket.gethostname()
        assert len(status.core_states) == 0
        with pytest.raises(grpc.RpcError) as info:
            get("tpu.runtime.no.such.metric")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no.such.metric" in info.value.details() and libtpu.HBM_USAGE in info.value.details()


def test_libtpu_distribution_buckets_are_lossless(libtpu_server) -> None:
    ch = grpc.secure_channel(libtpu_server.address, grpc.local_channel_credentials())
    with ch:
        stub = lpb_grpc.RuntimeMetricServiceStub(ch)
        h2d = stub.GetRuntimeMetric(lpb.MetricRequest(metric_name=libtpu.HOST_TO_DEVICE),
                                    timeout=5)
        hlo = stub.GetRuntimeMetric(lpb.MetricRequest(metric_name=libtpu.HLO_EXEC_TIMING),
                                    timeout=5)
    (m,) = h2d.metric.metrics
    kv = {a.key: a.value.string_attr for a in m.attribute.value.kvlist_attr.attributes}
    assert kv == {"buffer-size": "all"}
    d = m.distribution
    exp = d.bucket_options.exponential_buckets
    assert exp.growth_factor == GAMMA
    assert exp.scale == pytest.approx(GAMMA**1199 / 1000, rel=1e-12)
    counts = list(d.bucket_counts)
    assert counts[0] == 1 and counts[1] == 3 and counts[2] == 1 and counts[101] == 2
    assert sum(counts) == d.count == 7 and d.mean == pytest.approx(100.0)
    assert [a.value.string_attr for mm in hlo.metric.metrics
            for a in mm.attribute.value.kvlist_attr.attributes] == ["0", "1"]
    # And our client reads the same buckets back.
    with Client(libtpu_server.address, timeout=5) as c:
        snap = c.libtpu()
    assert [(dv.id, dv.memory.used_bytes, dv.memory.limit_bytes, dv.busy_percent)
            for dv in snap.devices] == [(0, 0, 0, 12.5), (1, 100, 1000, 0.0)]
    read = snap.distribution("TransferToDeviceTime")
    assert read is not None and read.count == 7
    assert dict(read.buckets.positive) == {1200: 3, 1201: 1, 1300: 2}
    assert snap.distribution("ExecuteTime{device_ordinal=0}").count == 7


def test_our_client_says_libtpu_only_server_is_not_a_monitor() -> None:
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    from metrics.export.libtpu_service import RuntimeMetricServicer

    lpb_grpc.add_RuntimeMetricServiceServicer_to_server(
        RuntimeMetricServicer(lambda s: _fixed_snapshot()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(f"127.0.0.1:{port}", timeout=5) as c:
            with pytest.raises(NotAMonitor):
                c.snapshot()
            assert len(c.libtpu().devices) == 2
    finally:
        server.stop(0)


def test_cli_and_dashboard_read_a_libtpu_only_server_the_same_way() -> None:
    """One hook-or-libtpu reader (``Client.read``) behind ``tpu-info`` and
    ``--watch``: both call a libtpu-only server libtpu."""
    from tpu_info.commands.gather import gather
    from tui.source import Conn, TargetReader

    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    from metrics.export.libtpu_service import RuntimeMetricServicer

    lpb_grpc.add_RuntimeMetricServiceServicer_to_server(
        RuntimeMetricServicer(lambda s: _fixed_snapshot()), server)
    target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        with Client(target, timeout=5) as c:
            assert [c.read()[0], c.read()[0]] == ["libtpu", "libtpu"]
        g = gather([target], timeout=5, use_discovery=False, probe_libtpu=False,
                   scan_devices=False)
        assert [(v.source, len(v.snapshot.devices)) for v in g.views] == [("libtpu", 2)]
        got, stop = [], threading.Event()

        def sink(update) -> None:
            got.append(update)
            if update.snapshot is not None or len(got) > 5:
                stop.set()

        TargetReader(target, interval_s=0.05, timeout_s=5).run(sink, stop)
        assert [(u.state, u.source) for u in got] == [(Conn.POLLING, "libtpu")]
    finally:
        server.stop(0)


def test_start_says_its_default_worker_count() -> None:
    from metrics.export.server import DEFAULT_WORKERS

    assert f"(default {DEFAULT_WORKERS}," in " ".join(export.start.__doc__.split())


# start(): ports, binding, signals -------------------------------------------

def test_pinned_port_taken_is_bind_error(monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("TPU_INFO_PORT", str(s.getsockname()[1]))
        with pytest.raises(BindError):
            export.start(lambda since: _fixed_snapshot())


def test_default_port_prefers_8431_else_ephemeral(monkeypatch) -> None:
    monkeypatch.delenv("TPU_INFO_PORT", raising=False)
    monkeypatch.delenv("TPU_INFO_BIND", raising=False)
    held = None
    if export._port_free("127.0.0.1", export.LIBTPU_PORT):
        held = socket.socket()
        held.bind(("127.0.0.1", export.LIBTPU_PORT))
        held.listen()
    try:
        ex = export.start(lambda since: _fixed_snapshot())
        try:
            assert ex.port != export.LIBTPU_PORT and ex.address == f"127.0.0.1:{ex.port}"
        finally:
            ex.stop(grace=0)
    finally:
        if held is not None:
            held.close()


def test_env_port_and_bind_warning(monkeypatch, caplog) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TPU_INFO_PORT", str(port))
    monkeypatch.setenv("TPU_INFO_BIND", "0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="metrics.export"):
        ex = export.start(lambda since: _fixed_snapshot())
    try:
        assert ex.port == port
        assert "not loopback" in caplog.text
        with Client(f"127.0.0.1:{port}", timeout=5) as c:
            assert len(c.libtpu().devices) == 2
    finally:
        ex.stop(grace=0)


def test_sigterm_handler_chains_and_restores() -> None:
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
    try:
        ex = export.start(lambda since: _fixed_snapshot(), port=0)
        assert signal.getsignal(signal.SIGTERM) is ex._sigterm_handler
        signal.raise_signal(signal.SIGTERM)
        assert calls == [signal.SIGTERM] and ex.stopped
        assert signal.getsignal(signal.SIGTERM) is not ex._sigterm_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_server_object_reports_bind_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        server = Server(lambda since: _fixed_snapshot(), port=s.getsockname()[1])
        with pytest.raises(BindError):
            server.bind()
        server.stop(grace=0)
