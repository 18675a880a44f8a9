"""The rest of libtpu's service that Google's ``--metric`` names read.

:mod:`tpu_info.wire.libtpu` reads what every look needs (HBM, duty cycle, the
transfer and execution latencies). Google's ``tpu-info --metric`` also asks
libtpu for per-device gauges (HBM bandwidth utilization, TensorCore idle
time, HLO queue size), the multi-slice ``megascale.*`` distributions, and
``GetTpuRuntimeStatus`` (each core's state, its sequencers, its queued
programs). This module turns those replies into frozen records: pure
functions, strings cleaned, counts bounded, numbers that are not finite left
out. The RPCs are made by :mod:`tpu_info.commands.libtpu_reads`.

Example:
    >>> from tpu_info.proto import tpu_metric_service_pb2 as lpb
    >>> resp = lpb.MetricResponse()
    >>> m = resp.metric.metrics.add()
    >>> m.attribute.value.int_attr = 0
    >>> m.gauge.as_double = 12.5
    >>> gauges_from_response(resp)
    (DeviceGauge(device=0, value=12.5),)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_info.contract.errors import WireError
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.proto import tpu_telemetry_pb2 as tpb
from tpu_info.wire.codec import MAX_BUCKETS, MAX_DEVICES, MAX_DISTRIBUTIONS, text
from tpu_info.wire.libtpu import DEVICE_ORDINAL_KEY, exponential_percentile

MAX_CORES = 1_024  # cores of one host: a few per chip
MAX_PER_CORE = 64  # sequencers or queued programs shown per core


@dataclass(frozen=True, slots=True)
class DeviceGauge:
    """One device's value of a libtpu gauge (percent, seconds or a count)."""

    device: int
    value: float


@dataclass(frozen=True, slots=True)
class Latency:
    """One attribute set of a libtpu distribution (``buffer-size=1MB+``), in
    the metric's own unit (microseconds, or Mbps for a delivery rate), with
    percentiles interpolated inside its exponential buckets as Google's
    client does. ``percentiles`` is empty when it holds no samples."""

    labels: str
    count: int
    percentiles: tuple[tuple[float, float], ...] = ()

    def percentile(self, p: float) -> float | None:
        return next((v for q, v in self.percentiles if q == p), None)


@dataclass(frozen=True, slots=True)
class Sequencer:
    """One sequencer of a core, as ``GetTpuRuntimeStatus`` reports it."""

    kind: str
    index: int
    pc: int
    tracemark: int
    program_id: int
    run_id: int
    hlo_location: str = ""
    hlo_detail: str = ""


@dataclass(frozen=True, slots=True)
class QueuedProgram:
    """A program waiting on a core."""

    run_id: int
    launch_id: int
    fingerprint: str  # hex


@dataclass(frozen=True, slots=True)
class CoreState:
    """One TPU core's state: its type, debugger, error and what runs on it."""

    global_core_id: int
    chip_id: int
    core_type: str
    xdb_server: bool
    error: str
    sequencers: tuple[Sequencer, ...] = ()
    queued: tuple[QueuedProgram, ...] = ()


def _device_of(m: lpb.Metric) -> int | None:
    """The device a metric is about: ``int_attr`` (HBM and TensorCore gauges)
    or a ``device_ordinal`` entry of its kvlist (HLO gauges), int or digits."""
    value = m.attribute.value
    if value.WhichOneof("attr") == "int_attr":
        return value.int_attr
    for a in value.kvlist_attr.attributes[:16]:
        if a.key != DEVICE_ORDINAL_KEY:
            continue
        kind = a.value.WhichOneof("attr")
        if kind == "int_attr":
            return a.value.int_attr
        if kind == "string_attr" and a.value.string_attr.isdigit():
            return int(a.value.string_attr[:9])
    return None


def gauges_from_response(resp: lpb.MetricResponse) -> tuple[DeviceGauge, ...]:
    """Per-device values of a gauge metric, sorted by device; metrics without a
    device or a finite number are left out.

    Raises:
        WireError: more devices than a host has.
    """
    if len(resp.metric.metrics) > MAX_DEVICES:
        raise WireError(f"{text(resp.metric.name)}: {len(resp.metric.metrics):,} devices, "
                        f"more than the {MAX_DEVICES:,} a host has")
    out: dict[int, float] = {}
    for m in resp.metric.metrics:
        dev = _device_of(m)
        if dev is None or m.WhichOneof("measure") != "gauge":
            continue
        kind = m.gauge.WhichOneof("value")
        if kind not in ("as_double", "as_int"):
            continue
        value = float(getattr(m.gauge, kind))
        if math.isfinite(value):
            out[dev] = value
    return tuple(DeviceGauge(d, v) for d, v in sorted(out.items()))


def _labels(m: lpb.Metric) -> str:
    parts = []
    for a in m.attribute.value.kvlist_attr.attributes[:16]:
        kind = a.value.WhichOneof("attr")
        if kind in ("string_attr", "int_attr", "double_attr", "bool_attr"):
            parts.append(f"{text(a.key)}={text(str(getattr(a.value, kind)))}")
    return ",".join(parts) or "all"


def latencies_from_response(resp: lpb.MetricResponse,
                            percents: Sequence[float]) -> tuple[Latency, ...]:
    """Each attribute set of a distribution metric with its ``percents``;
    sets whose buckets are not exponential, or whose numbers are not finite or
    disagree with their count, are left out (at most
    :data:`~tpu_info.wire.codec.MAX_DISTRIBUTIONS`)."""
    out = []
    for m in resp.metric.metrics[:MAX_DISTRIBUTIONS]:
        if m.WhichOneof("measure") != "distribution":
            continue
        d = m.distribution
        counts = list(d.bucket_counts[:MAX_BUCKETS + 1])
        exp = d.bucket_options.exponential_buckets
        if (len(counts) > MAX_BUCKETS or d.count < 0 or any(n < 0 for n in counts)
                or sum(counts) != d.count):
            continue
        if d.count == 0:
            out.append(Latency(_labels(m), 0))
            continue
        if (d.bucket_options.WhichOneof("options") != "exponential_buckets"
                or not (math.isfinite(exp.scale) and math.isfinite(exp.growth_factor))
                or not (exp.scale > 0 and exp.growth_factor > 1)):
            continue
        try:
            pct = tuple((p, exponential_percentile(counts, exp.scale, exp.growth_factor, p))
                        for p in percents)
        except OverflowError:
            continue
        if all(math.isfinite(v) for _, v in pct):
            out.append(Latency(_labels(m), d.count, pct))
    return tuple(out)


def _enum(enum: object, number: int) -> str:
    try:
        return str(enum.Name(number))  # type: ignore[attr-defined]
    except ValueError:
        return str(number)


def cores_from_status(resp: lpb.GetTpuRuntimeStatusResponse) -> tuple[CoreState, ...]:
    """Each core's state, by global core id (at most :data:`MAX_CORES`)."""
    out = []
    for core_id in sorted(resp.core_states)[:MAX_CORES]:
        s = resp.core_states[core_id]
        seqs = tuple(Sequencer(
            kind=_enum(tpb.TpuSequencerTypeProto, q.sequencer_type), index=q.sequencer_index,
            pc=q.pc, tracemark=q.tracemark, program_id=q.program_id, run_id=q.run_id,
            hlo_location=text(q.hlo_location), hlo_detail=text(q.hlo_detailed_info),
        ) for q in s.sequencer_info[:MAX_PER_CORE])
        queued = tuple(QueuedProgram(p.run_id, p.launch_id, p.program_fingerprint[:64].hex())
                       for p in s.queued_program_info[:MAX_PER_CORE])
        out.append(CoreState(
            global_core_id=core_id, chip_id=s.core_id.chip_id,
            core_type=_enum(tpb.TpuCoreTypeProto, s.core_id.core_on_chip.type),
            xdb_server=s.xdb_server_running, error=text(s.error_message),
            sequencers=seqs, queued=queued,
        ))
    return tuple(out)
