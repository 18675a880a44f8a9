"""libtpu's runtime metric service: metric names and reading replies into records.

libtpu (on TPU VMs) and the tpu-info hook both serve
``tpu.monitoring.runtime.RuntimeMetricService``. This module holds the metric
names and turns its replies into :mod:`tpu_info.model` records: per-device
HBM and duty cycle into :class:`~tpu_info.model.DeviceRecord`, latency
distributions (exponential buckets, microseconds) into
:class:`~tpu_info.model.DistributionReading` in nanoseconds, with percentiles
interpolated inside buckets. Pure functions; the RPCs are in
:mod:`tpu_info.client`.

Example:
    >>> from tpu_info.proto import tpu_metric_service_pb2 as lpb
    >>> d = lpb.Distribution(count=2, mean=3.0, min=2.0, max=4.0)
    >>> d.bucket_options.exponential_buckets.scale = 1.0
    >>> d.bucket_options.exponential_buckets.growth_factor = 2.0
    >>> d.bucket_counts.extend([0, 0, 1, 1])   # [2, 4) and [4, 8) microseconds
    >>> reading_from_distribution("ExecuteTime", d).count
    2
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tpu_info.errors import WireError
from tpu_info.model import (
    PERCENTILES,
    BucketCounts,
    DeviceRecord,
    DistributionReading,
    MemoryReading,
    Unit,
)
from tpu_info.proto import tpu_metric_service_pb2 as lpb

HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HOST_TO_DEVICE = (
    "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution"
)
DEVICE_TO_HOST = (
    "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution"
)
HLO_EXEC_TIMING = "hlo.execution.timing.distribution.microseconds"

# libtpu latency metric -> the torch_xla-style name the model uses.
LATENCY_NAMES: dict[str, str] = {
    HOST_TO_DEVICE: "TransferToDeviceTime",
    DEVICE_TO_HOST: "TransferFromDeviceTime",
    HLO_EXEC_TIMING: "ExecuteTime",
}

DEVICE_ID_KEY = "device-id"
BUFFER_SIZE_KEY = "buffer-size"
DEVICE_ORDINAL_KEY = "device_ordinal"


def _per_device(resp: lpb.MetricResponse, kind: str) -> dict[int, lpb.Metric]:
    out: dict[int, lpb.Metric] = {}
    for m in resp.metric.metrics:
        if m.attribute.value.WhichOneof("attr") != "int_attr":
            raise WireError(f"{resp.metric.name}: a metric has no integer device id")
        if m.WhichOneof("measure") != "gauge" or m.gauge.WhichOneof("value") != kind:
            raise WireError(f"{resp.metric.name}: expected gauge.{kind} values")
        out[m.attribute.value.int_attr] = m
    return out


def devices_from_responses(
    usage: lpb.MetricResponse,
    total: lpb.MetricResponse,
    duty_cycle: lpb.MetricResponse | None,
) -> tuple[DeviceRecord, ...]:
    """Per-device records from the HBM usage, HBM total and duty-cycle replies.

    Raises:
        WireError: a metric lacks the device id or has the wrong value type.
    """
    used = _per_device(usage, "as_int")
    limit = _per_device(total, "as_int")
    busy = _per_device(duty_cycle, "as_double") if duty_cycle is not None else {}
    out = []
    for dev in sorted(set(used) | set(limit)):
        u = used.get(dev)
        t = limit.get(dev)
        b = busy.get(dev)
        out.append(DeviceRecord(
            id=dev,
            kind="TPU",
            platform="tpu",
            memory=MemoryReading(
                used_bytes=u.gauge.as_int if u is not None else None,
                limit_bytes=t.gauge.as_int if t is not None else None,
                source="libtpu",
                reason="" if u is not None and t is not None else "libtpu did not report it",
            ),
            busy_percent=b.gauge.as_double if b is not None else None,
            busy_reason="" if b is not None else "libtpu did not report a duty cycle",
        ))
    return tuple(out)


def exponential_percentile(
    counts: Sequence[int], scale: float, growth: float, percent: float,
) -> float:
    """The value at ``percent`` of exponential-bucket ``counts``.

    Bucket 0 is the underflow bucket (read as 0); bucket ``i >= 1`` spans
    ``[scale * growth**(i-1), scale * growth**i)`` and the value is
    interpolated linearly inside it by rank.
    """
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = percent / 100.0 * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == 0:
                return 0.0
            lo = scale * growth ** (i - 1)
            return lo + (rank - seen) / n * (lo * growth - lo)
        seen += n
    last = max(i for i, n in enumerate(counts) if n)
    return scale * growth**last if last else 0.0


def _as_log_buckets(counts: Sequence[int], scale_ns: float, growth: float) -> BucketCounts | None:
    """The model's buckets when the grid is ``growth**k`` (it is for tpu-info
    servers, which convert their own buckets); None for any other grid."""
    k0 = math.log(scale_ns) / math.log(growth) + 1.0
    key0 = round(k0)
    if abs(k0 - key0) > 1e-6:
        return None
    positive = {key0 + i - 1: n for i, n in enumerate(counts) if i >= 1 and n}
    return BucketCounts(gamma=growth, positive=positive, zero=counts[0] if counts else 0)


def reading_from_distribution(name: str, d: lpb.Distribution) -> DistributionReading:
    """A reading (in nanoseconds) of a libtpu latency distribution in microseconds.

    Raises:
        WireError: the distribution has no exponential buckets or bad values.
    """
    counts = list(d.bucket_counts)
    if d.count < 0 or any(n < 0 for n in counts):
        raise WireError(f"{name}: negative counts")
    if d.count == 0:
        return DistributionReading(name=name, unit=Unit.TIME_NS, count=0, total=0.0,
                                   min=None, max=None)
    if d.bucket_options.WhichOneof("options") != "exponential_buckets":
        raise WireError(f"{name}: only exponential buckets are understood")
    exp = d.bucket_options.exponential_buckets
    if not (exp.growth_factor > 1.0 and exp.scale > 0.0):
        raise WireError(f"{name}: bad exponential buckets (scale {exp.scale}, "
                        f"growth {exp.growth_factor})")
    if sum(counts) != d.count:
        raise WireError(f"{name}: buckets hold {sum(counts)} samples, count says {d.count}")
    lo_ns, hi_ns = d.min * 1e3, d.max * 1e3
    pct = []
    for p in PERCENTILES:
        v = exponential_percentile(counts, exp.scale, exp.growth_factor, p) * 1e3
        pct.append((p, min(max(v, lo_ns), hi_ns)))
    return DistributionReading(
        name=name,
        unit=Unit.TIME_NS,
        count=d.count,
        total=d.mean * d.count * 1e3,
        min=lo_ns,
        max=hi_ns,
        percentiles=tuple(pct),
        buckets=_as_log_buckets(counts, exp.scale * 1e3, exp.growth_factor),
    )


def _label(m: lpb.Metric) -> str:
    parts = []
    for a in m.attribute.value.kvlist_attr.attributes:
        kind = a.value.WhichOneof("attr")
        if kind in ("string_attr", "int_attr", "double_attr", "bool_attr"):
            parts.append(f"{a.key}={getattr(a.value, kind)}")
    return ",".join(parts)


def readings_from_response(resp: lpb.MetricResponse) -> tuple[DistributionReading, ...]:
    """One reading per attribute set of a latency metric.

    Named after :data:`LATENCY_NAMES` (else the libtpu name); when the metric
    has more than one attribute set, each reading's name carries its labels,
    as in ``ExecuteTime{device_ordinal=0}``.
    """
    base = LATENCY_NAMES.get(resp.metric.name, resp.metric.name)
    metrics = [m for m in resp.metric.metrics if m.WhichOneof("measure") == "distribution"]
    out = []
    for m in metrics:
        name = base if len(metrics) == 1 else f"{base}{{{_label(m)}}}"
        out.append(reading_from_distribution(name, m.distribution))
    return tuple(out)
