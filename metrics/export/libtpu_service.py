"""libtpu's ``RuntimeMetricService``, answered from the hook's snapshots.

So that Google's ``tpu-info`` (and anything else written against libtpu)
reads a hooked program as it reads libtpu on a TPU VM. Served metrics:

* ``tpu.runtime.hbm.memory.usage.bytes`` / ``.total.bytes``: one gauge
  (``as_int``) per device, attribute ``device-id`` (int). Usage is
  :attr:`MemoryReading.used_bytes` and total :attr:`MemoryReading.limit_bytes`
  of each device (on CPU: live array bytes and host RAM); an unknown number
  is sent as 0.
* ``tpu.runtime.tensorcore.dutycycle.percent``: one gauge (``as_double``)
  per device: :attr:`DeviceRecord.busy_percent` as the engine estimates it,
  **0.0 when the engine does not measure it** (the JAX hook does not yet; its
  ``busy_reason`` says so on tpu-info's own service).
* ``megascale.host_to_device_transfer_latencies...`` and
  ``megascale.device_to_host_transfer_latencies...``: the
  ``TransferToDeviceTime`` / ``TransferFromDeviceTime`` distributions in
  microseconds, one metric with the kvlist attribute ``buffer-size = "all"``
  (the hook does not split transfers by size).
* ``hlo.execution.timing.distribution.microseconds``: ``ExecuteTime`` (calls
  of tracked functions) once per device (kvlist ``device_ordinal``): an SPMD
  program runs on every device, so each device sees the same timings.

Distributions carry the hook's own log-spaced buckets losslessly as
exponential buckets: ``growth_factor`` is the buckets' gamma and ``scale`` is
the lower bound of the lowest non-empty bucket, so bucket ``i >= 1`` starts at
``scale * growth_factor**(i-1)``; bucket 0 (underflow) holds zeros and
negative samples. ``sum_of_squared_deviation`` is not tracked and is 0.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> resp = metric_response(libtpu.HBM_USAGE, Snapshot(taken_at_unix=0.0))
    >>> resp.metric.name
    'tpu.runtime.hbm.memory.usage.bytes'
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import grpc

from tpu_info.contract.model import DistributionReading, Snapshot, Unit
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.proto import tpu_metric_service_pb2_grpc as lpb_grpc
from tpu_info.wire import libtpu

# A sequence number past any real one: snapshots for libtpu carry no events.
NO_EVENTS = 2**62

DESCRIPTIONS: dict[str, str] = {
    libtpu.HBM_USAGE: "Device memory in use, bytes (tpu-info hook: the engine's reading).",
    libtpu.HBM_TOTAL: "Device memory limit, bytes (tpu-info hook: the engine's reading).",
    libtpu.DUTY_CYCLE: "Busy percent of each device as the engine estimates it; 0 when "
                       "the engine does not measure it.",
    libtpu.HOST_TO_DEVICE: "Host->device transfer call latency, microseconds.",
    libtpu.DEVICE_TO_HOST: "Device->host transfer call latency, microseconds.",
    libtpu.HLO_EXEC_TIMING: "Wall time of each tracked call, microseconds, per device.",
}
SUPPORTED: tuple[str, ...] = tuple(DESCRIPTIONS)


def _to_libtpu_distribution(d: DistributionReading, out: lpb.Distribution) -> None:
    """Fills ``out`` from ``d`` (microseconds when ``d`` is in nanoseconds)."""
    f = 1e-3 if d.unit is Unit.TIME_NS else 1.0
    out.count = d.count
    if d.count:
        out.mean = d.total / d.count * f
        out.min = (d.min or 0.0) * f
        out.max = (d.max or 0.0) * f
    exp = out.bucket_options.exponential_buckets
    b = d.buckets
    if b is None:
        exp.growth_factor, exp.scale, exp.num_finite_buckets = 2.0, 1.0, 0
        out.bucket_counts.append(d.count)
        return
    underflow = b.zero + sum(b.negative.values())
    exp.growth_factor = b.gamma
    if not b.positive:
        exp.scale, exp.num_finite_buckets = 1.0, 0
        out.bucket_counts.extend([underflow, 0])
        return
    kmin, kmax = min(b.positive), max(b.positive)
    exp.scale = b.gamma ** (kmin - 1) * f
    exp.num_finite_buckets = kmax - kmin + 1
    counts = [0] * (kmax - kmin + 3)  # underflow, finite buckets, overflow
    counts[0] = underflow
    for k, n in b.positive.items():
        counts[k - kmin + 1] = n
    out.bucket_counts.extend(counts)


def _kv(metric: lpb.Metric, key: str, value: str) -> None:
    metric.attribute.value.kvlist_attr.attributes.add(key=key).value.string_attr = value


def metric_response(name: str, snap: Snapshot) -> lpb.MetricResponse | None:
    """The reply to ``GetRuntimeMetric(name)`` from ``snap``; None if not served."""
    if name not in DESCRIPTIONS:
        return None
    resp = lpb.MetricResponse()
    tm = resp.metric
    tm.name = name
    tm.description = DESCRIPTIONS[name]
    start = snap.process.start_time_unix if snap.process is not None else 0.0

    def add() -> lpb.Metric:
        m = tm.metrics.add()
        m.timestamp.FromNanoseconds(int(snap.taken_at_unix * 1e9))
        return m

    if name in (libtpu.HBM_USAGE, libtpu.HBM_TOTAL, libtpu.DUTY_CYCLE):
        for dev in sorted(snap.devices, key=lambda d: d.id):
            m = add()
            m.attribute.key = libtpu.DEVICE_ID_KEY
            m.attribute.value.int_attr = dev.id
            if name == libtpu.HBM_USAGE:
                m.gauge.as_int = dev.memory.used_bytes or 0
            elif name == libtpu.HBM_TOTAL:
                m.gauge.as_int = dev.memory.limit_bytes or 0
            else:
                m.gauge.as_double = dev.busy_percent or 0.0
        return resp

    dist = snap.distribution(libtpu.LATENCY_NAMES[name])
    if dist is None or dist.count == 0:
        return resp
    if name == libtpu.HLO_EXEC_TIMING:
        ordinals = sorted(d.id for d in snap.devices) or [0]
        for ordinal in ordinals:
            m = add()
            m.start_timestamp.FromNanoseconds(int(start * 1e9))
            _kv(m, libtpu.DEVICE_ORDINAL_KEY, str(ordinal))
            _to_libtpu_distribution(dist, m.distribution)
    else:
        m = add()
        m.start_timestamp.FromNanoseconds(int(start * 1e9))
        _kv(m, libtpu.BUFFER_SIZE_KEY, "all")
        _to_libtpu_distribution(dist, m.distribution)
    return resp


def snapshot_or_abort(snapshot_fn: Callable[[int], Snapshot], events_since: int,
                      context: grpc.ServicerContext) -> Snapshot:
    """``snapshot_fn(events_since)``, or the RPC ends with INTERNAL if it raises."""
    try:
        return snapshot_fn(events_since)
    except Exception as e:  # noqa: BLE001 - the RPC boundary: report, never crash the server
        context.abort(grpc.StatusCode.INTERNAL, f"building the snapshot failed: {e!r}")
        raise  # unreachable: abort raises


class RuntimeMetricServicer(lpb_grpc.RuntimeMetricServiceServicer):
    """Answers libtpu's three calls from ``snapshot_fn`` on the server's threads.

    Args:
        snapshot_fn: builds a snapshot; called with :data:`NO_EVENTS`.
        host_name: reported by ``GetTpuRuntimeStatus`` (default: this host).
    """

    def __init__(self, snapshot_fn: Callable[[int], Snapshot],
                 host_name: str | None = None) -> None:
        self._snapshot_fn = snapshot_fn
        self._host_name = host_name if host_name is not None else socket.gethostname()

    def GetRuntimeMetric(self, request: lpb.MetricRequest,
                         context: grpc.ServicerContext) -> lpb.MetricResponse:
        resp = None
        if request.metric_name in DESCRIPTIONS:
            resp = metric_response(request.metric_name,
                                   snapshot_or_abort(self._snapshot_fn, NO_EVENTS, context))
        if resp is None:
            return context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"metric {request.metric_name!r} is not served by this tpu-info hook; "
                f"supported: {', '.join(SUPPORTED)}",
            )
        return resp

    def ListSupportedMetrics(self, request: lpb.ListSupportedMetricsRequest,
                             context: grpc.ServicerContext) -> lpb.ListSupportedMetricsResponse:
        resp = lpb.ListSupportedMetricsResponse()
        for name in SUPPORTED:
            if request.filter in name:
                resp.supported_metric.add(metric_name=name)
        return resp

    def GetTpuRuntimeStatus(self, request: lpb.GetTpuRuntimeStatusRequest,
                            context: grpc.ServicerContext) -> lpb.GetTpuRuntimeStatusResponse:
        # No TPU core states: the hook sees engines, not TPU sequencers.
        return lpb.GetTpuRuntimeStatusResponse(host_name=self._host_name)
