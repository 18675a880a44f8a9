"""libtpu's runtime metric service: metric names and reading replies into records.

libtpu (on TPU VMs) and the tpu-info hook both serve
``tpu.monitoring.runtime.RuntimeMetricService``. This module holds the metric
names and turns its replies into :mod:`tpu_info.contract.model` records: per-device
HBM and duty cycle into :class:`~tpu_info.contract.model.DeviceRecord`, latency
distributions (exponential buckets, microseconds) into
:class:`~tpu_info.contract.model.DistributionReading` in nanoseconds, with percentiles
interpolated inside buckets. Pure functions; the RPCs are in
:mod:`tpu_info.net.client`. As in :mod:`tpu_info.wire.codec`, strings are cleaned,
counts bounded, and a number that is not finite (or a reading that overflows)
is kept out with its reason, appended to ``notes`` when one is given.

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

from tpu_info.contract.catalog import (
    EXECUTE_TIME,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
)
from tpu_info.contract.errors import WireError
from tpu_info.contract.model import (
    PERCENTILES,
    BucketCounts,
    DeviceRecord,
    DistributionReading,
    MemoryReading,
    Unit,
)
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.wire.codec import MAX_BUCKETS, MAX_DEVICES, MAX_DISTRIBUTIONS, text

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
    HOST_TO_DEVICE: TRANSFER_TO_DEVICE_TIME,
    DEVICE_TO_HOST: TRANSFER_FROM_DEVICE_TIME,
    HLO_EXEC_TIMING: EXECUTE_TIME,
}

DEVICE_ID_KEY = "device-id"
BUFFER_SIZE_KEY = "buffer-size"
DEVICE_ORDINAL_KEY = "device_ordinal"


Notes = list[tuple[str, str]]


def _per_device(resp: lpb.MetricResponse, kind: str) -> dict[int, lpb.Metric]:
    out: dict[int, lpb.Metric] = {}
    name = text(resp.metric.name)
    if len(resp.metric.metrics) > MAX_DEVICES:
        raise WireError(f"{name}: {len(resp.metric.metrics):,} devices, more than the "
                        f"{MAX_DEVICES:,} a host has")
    for m in resp.metric.metrics:
        if m.attribute.value.WhichOneof("attr") != "int_attr":
            raise WireError(f"{name}: a metric has no integer device id")
        if m.WhichOneof("measure") != "gauge" or m.gauge.WhichOneof("value") != kind:
            raise WireError(f"{name}: expected gauge.{kind} values")
        out[m.attribute.value.int_attr] = m
    return out


def _bytes(m: lpb.Metric | None, what: str, dev: int, notes: Notes) -> tuple[int | None, str]:
    if m is None:
        return None, "libtpu did not report it"
    if m.gauge.as_int < 0:
        why = f"libtpu sent a negative {what} ({m.gauge.as_int})"
        notes.append((f"device {dev} {what}", why))
        return None, why
    return m.gauge.as_int, ""


def devices_from_responses(
    usage: lpb.MetricResponse,
    total: lpb.MetricResponse,
    duty_cycle: lpb.MetricResponse | None,
    notes: Notes | None = None,
) -> tuple[DeviceRecord, ...]:
    """Per-device records from the HBM usage, HBM total and duty-cycle replies.

    Raises:
        WireError: a metric lacks the device id or has the wrong value type.
    """
    notes = notes if notes is not None else []
    used = _per_device(usage, "as_int")
    limit = _per_device(total, "as_int")
    busy = _per_device(duty_cycle, "as_double") if duty_cycle is not None else {}
    out = []
    for dev in sorted(set(used) | set(limit)):
        used_bytes, used_why = _bytes(used.get(dev), "HBM usage", dev, notes)
        limit_bytes, limit_why = _bytes(limit.get(dev), "HBM total", dev, notes)
        b = busy.get(dev)
        percent = b.gauge.as_double if b is not None else None
        busy_why = "" if b is not None else "libtpu did not report a duty cycle"
        if percent is not None and not math.isfinite(percent):
            busy_why = f"libtpu sent a duty cycle of {percent!r}, not a finite number"
            notes.append((f"device {dev} busy_percent", busy_why))
            percent = None
        out.append(DeviceRecord(
            id=dev,
            kind="TPU",
            platform="tpu",
            memory=MemoryReading(
                used_bytes=used_bytes,
                limit_bytes=limit_bytes,
                source="libtpu",
                reason=used_why or limit_why,
            ),
            busy_percent=percent,
            busy_reason=busy_why,
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


def reading_from_distribution(name: str, d: lpb.Distribution,
                              notes: Notes | None = None) -> DistributionReading | None:
    """A reading (in nanoseconds) of a libtpu latency distribution in
    microseconds; None (with the reason in ``notes``) when its numbers are
    not finite or overflow.

    Raises:
        WireError: the distribution has no exponential buckets or bad values.
    """
    if len(d.bucket_counts) > MAX_BUCKETS:
        raise WireError(f"{name}: {len(d.bucket_counts):,} buckets, more than the "
                        f"{MAX_BUCKETS:,} a real server sends")
    numbers = (d.mean, d.min, d.max, d.bucket_options.exponential_buckets.scale,
               d.bucket_options.exponential_buckets.growth_factor)
    if not all(map(math.isfinite, numbers)):
        if notes is not None:
            notes.append((f"distribution {name}", "libtpu sent numbers that are not finite "
                          f"(mean, min, max, scale, growth: {numbers!r}); left out"))
        return None
    try:
        reading = _reading(name, d)
    except (OverflowError, ZeroDivisionError):
        reading = None
    if reading is not None and not all(map(math.isfinite, (
            reading.total, *(v for _, v in reading.percentiles)))):
        reading = None
    if reading is None and notes is not None:
        notes.append((f"distribution {name}", "its values overflow a double; left out"))
    return reading


def _reading(name: str, d: lpb.Distribution) -> DistributionReading:
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
    for a in m.attribute.value.kvlist_attr.attributes[:16]:
        kind = a.value.WhichOneof("attr")
        if kind in ("string_attr", "int_attr", "double_attr", "bool_attr"):
            parts.append(f"{text(a.key)}={text(str(getattr(a.value, kind)))}")
    return ",".join(parts)


def readings_from_response(resp: lpb.MetricResponse,
                           notes: Notes | None = None) -> tuple[DistributionReading, ...]:
    """One reading per attribute set of a latency metric.

    Named after :data:`LATENCY_NAMES` (else the libtpu name); when the metric
    has more than one attribute set, each reading's name carries its labels,
    as in ``ExecuteTime{device_ordinal=0}``. At most
    :data:`~tpu_info.wire.codec.MAX_DISTRIBUTIONS` of them.
    """
    base = LATENCY_NAMES.get(resp.metric.name) or text(resp.metric.name)
    metrics = [m for m in resp.metric.metrics[:MAX_DISTRIBUTIONS + 1]
               if m.WhichOneof("measure") == "distribution"]
    if len(metrics) > MAX_DISTRIBUTIONS:
        if notes is not None:
            notes.append((base, f"libtpu sent more than {MAX_DISTRIBUTIONS:,} attribute sets; "
                          f"the first {MAX_DISTRIBUTIONS:,} are kept"))
        metrics = metrics[:MAX_DISTRIBUTIONS]
    out = []
    for m in metrics:
        name = base if len(metrics) == 1 else text(f"{base}{{{_label(m)}}}")
        reading = reading_from_distribution(name, m.distribution, notes)
        if reading is not None:
            out.append(reading)
    return tuple(out)
