"""Pure conversion between :mod:`tpu_info.model` records and ``tpu_info.v1``.

The server turns a :class:`~tpu_info.model.Snapshot` into a protobuf message
(:func:`snapshot_to_proto`; :mod:`tpu_info.encoder` writes the same bytes
faster, reusing what did not change); the client turns the message back into records
(:func:`snapshot_from_proto`). Data from the wire is validated: anything a
record cannot honestly hold (an unknown unit, arrays of unequal length, a
negative count, a version this client does not speak) raises
:class:`~tpu_info.errors.WireError` or
:class:`~tpu_info.errors.ProtocolMismatch`, never an ``assert``.

Example:
    >>> from tpu_info.model import Snapshot, CounterReading
    >>> s = Snapshot(taken_at_unix=1.0, counters=(CounterReading("MarkStep", 3),))
    >>> snapshot_from_proto(snapshot_to_proto(s)).counter("MarkStep")
    3
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tpu_info.buckets import SortedCounts
from tpu_info.errors import ProtocolMismatch, WireError
from tpu_info.model import (
    BucketCounts,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    Event,
    GraphRecord,
    MemoryReading,
    MetricInfo,
    ProcessRecord,
    RecompileCause,
    Samples,
    Snapshot,
    Unit,
)
from tpu_info.proto import tpu_info_v1_pb2 as pb

T = TypeVar("T")

# Major version is the package (tpu_info.v1); this is the minor revision.
PROTOCOL_VERSION = 1

_UNIT_TO_PB: dict[Unit, Any] = {
    Unit.TIME_NS: pb.UNIT_NS, Unit.BYTES: pb.UNIT_BYTES, Unit.NUMBER: pb.UNIT_NUMBER}
_UNIT_FROM_PB: dict[int, Unit] = {v: k for k, v in _UNIT_TO_PB.items()}


# model -> proto (server side) ------------------------------------------------


def _fill_buckets(msg: pb.Buckets, b: BucketCounts) -> None:
    # Keys need not be sorted on the wire; a mapping's keys() and values()
    # iterate in the same order, and skipping the sort halves the cost.
    msg.gamma = b.gamma
    for counts, keys_field, counts_field in ((b.positive, msg.positive_keys, msg.positive_counts),
                                             (b.negative, msg.negative_keys, msg.negative_counts)):
        if isinstance(counts, SortedCounts):  # the hook's own readings: lists already
            keys_field.extend(counts.key_list)
            counts_field.extend(counts.count_list)
        elif counts:
            keys_field.extend(counts.keys())
            counts_field.extend(counts.values())
    msg.zero = b.zero


def _fill_distribution(m: pb.Distribution, d: DistributionReading,
                       buckets: bool = True) -> None:
    m.name = d.name
    m.unit = _UNIT_TO_PB[d.unit]
    m.count = d.count
    m.total = d.total
    if d.min is not None:
        m.min = d.min
    if d.max is not None:
        m.max = d.max
    if d.rate_per_second is not None:
        m.rate_per_second = d.rate_per_second
    if d.value_rate_per_second is not None:
        m.value_rate_per_second = d.value_rate_per_second
    if d.percentiles:
        percents, values = zip(*d.percentiles, strict=True)
        m.percentile_percents.extend(percents)
        m.percentile_values.extend(values)
    recent = d.recent if type(d.recent) is Samples else Samples.of(d.recent)
    if recent:
        m.recent_times_unix.extend(recent.times)
        m.recent_values.extend(recent.values)
    if buckets and d.buckets is not None:
        _fill_buckets(m.buckets, d.buckets)
    if d.help:
        m.help = d.help


def _fill_graph(m: pb.Graph, g: GraphRecord) -> None:
    m.hash = g.hash
    m.name = g.name
    m.engine = g.engine
    m.first_seen_unix = g.first_seen_unix
    m.last_seen_unix = g.last_seen_unix
    m.compiles = g.compiles
    m.compile_seconds_total = g.compile_seconds_total
    m.compile_seconds_last = g.compile_seconds_last
    m.cache_hits = g.cache_hits
    if g.executions is not None:
        m.executions = g.executions
    _fill_history(m, g)


def _fill_history(m: pb.Graph, g: GraphRecord) -> None:
    m.signature.extend(g.signature)
    for sig in g.signatures:
        m.signatures.add().args.extend(sig)
    for c in g.causes:
        cm = m.causes.add(time_unix=c.time_unix, description=c.description)
        if c.location is not None:
            cm.location = c.location
        if c.argument is not None:
            cm.argument = c.argument
        if c.before is not None:
            cm.before = c.before
        if c.after is not None:
            cm.after = c.after


def _fill_device(m: pb.Device, d: DeviceRecord) -> None:
    m.id = d.id
    m.kind = d.kind
    m.platform = d.platform
    mem = d.memory
    mm = m.memory
    if mem.used_bytes is not None:
        mm.used_bytes = mem.used_bytes
    if mem.peak_bytes is not None:
        mm.peak_bytes = mem.peak_bytes
    if mem.limit_bytes is not None:
        mm.limit_bytes = mem.limit_bytes
    mm.source = mem.source
    mm.reason = mem.reason
    if d.busy_percent is not None:
        m.busy_percent = d.busy_percent
    m.busy_reason = d.busy_reason


def _fill_event(m: pb.Event, e: Event) -> None:
    m.seq = e.seq
    m.time_unix = e.time_unix
    m.kind = e.kind
    m.name = e.name
    m.graph_hash = e.graph_hash
    m.detail = e.detail
    if e.location is not None:
        m.location = e.location
    if e.value is not None:
        m.value = e.value


def _head(s: Snapshot) -> pb.Snapshot:
    """Everything but distributions, graphs and events."""
    msg = pb.Snapshot(
        protocol_version=PROTOCOL_VERSION,
        taken_at_unix=s.taken_at_unix,
        last_seq=s.last_seq,
        uptime_seconds=s.uptime_seconds,
    )
    p = s.process
    if p is not None:
        pm = msg.process
        pm.pid = p.pid
        pm.name = p.name
        pm.argv.extend(p.argv)
        pm.host = p.host
        pm.user = p.user
        pm.engine = p.engine
        pm.versions.update(p.versions)
        pm.start_time_unix = p.start_time_unix
    for dev in s.devices:
        _fill_device(msg.devices.add(), dev)
    for c in s.counters:
        msg.counters.add(name=c.name, value=c.value, unit=_UNIT_TO_PB[c.unit], help=c.help)
    return msg


def snapshot_to_proto(s: Snapshot) -> pb.Snapshot:
    """The ``tpu_info.v1.Snapshot`` message of a snapshot."""
    msg = _head(s)
    for e in s.events:
        _fill_event(msg.events.add(), e)
    for d in s.distributions:
        _fill_distribution(msg.distributions.add(), d)
    for g in s.graphs:
        _fill_graph(msg.graphs.add(), g)
    return msg


def metric_infos_to_proto(infos: Iterable[MetricInfo]) -> pb.ListMetricsReply:
    """The ``ListMetrics`` reply for ``infos``."""
    reply = pb.ListMetricsReply(protocol_version=PROTOCOL_VERSION)
    for i in infos:
        reply.metrics.add(name=i.name, kind=i.kind, unit=_UNIT_TO_PB[i.unit], help=i.help)
    return reply


# proto -> model (client side) ------------------------------------------------


def check_version(version: int) -> None:
    """Raises :class:`ProtocolMismatch` unless ``version`` is one we read.

    Version 0 means the field was never set: the peer speaks some other
    protocol that happens to decode. Newer minor revisions are fine (fields
    are only added within ``tpu_info.v1``).
    """
    if version < 1:
        raise ProtocolMismatch(
            "the reply carries no tpu_info.v1 protocol version (a different service, "
            "or a server older than any released tpu-info)"
        )


def _unit(value: int, where: str) -> Unit:
    try:
        return _UNIT_FROM_PB[value]
    except KeyError:
        raise WireError(f"{where}: unknown unit {value} (client too old?)") from None


def _finite(value: float, where: str) -> float:
    if math.isnan(value):
        raise WireError(f"{where}: NaN")
    return value


def _nonneg(value: int, where: str) -> int:
    if value < 0:
        raise WireError(f"{where}: negative value {value}")
    return value


def _pairs(a: Sequence[float], b: Sequence[float], where: str) -> tuple[tuple[float, float], ...]:
    if len(a) != len(b):
        raise WireError(f"{where}: {len(a)} keys but {len(b)} values")
    return tuple(zip(a, b, strict=False))


def _samples(times: Sequence[float], values: Sequence[float], where: str) -> Samples:
    if len(times) != len(values):
        raise WireError(f"{where}: {len(times)} times but {len(values)} values")
    return Samples(times[:], values[:])  # one copy each out of the message, in C


def _int_map(keys: Sequence[int], counts: Sequence[int], where: str,
             descending: bool = False) -> Mapping[int, int]:
    """Bucket counts by key. Keys in value order (as the hook sends them:
    ascending, or descending for negative buckets) come back as two lists,
    without a dict; any other order as a dict."""
    keys, counts = keys[:], counts[:]  # one copy each out of the message, in C
    if len(keys) != len(counts):
        raise WireError(f"{where}: {len(keys)} keys but {len(counts)} counts")
    if len(set(keys)) != len(keys):
        raise WireError(f"{where}: a bucket key appears twice")
    if keys == sorted(keys, reverse=descending):
        return SortedCounts(keys, counts)
    return dict(zip(keys, counts, strict=True))


def _buckets(m: pb.Buckets, where: str) -> BucketCounts:
    gamma = m.gamma
    if not (gamma > 1.0 and math.isfinite(gamma)):
        raise WireError(f"{where}: bucket width gamma must be finite and > 1, got {gamma}")
    pos = _int_map(m.positive_keys, m.positive_counts, f"{where} positive buckets")
    neg = _int_map(m.negative_keys, m.negative_counts, f"{where} negative buckets",
                   descending=True)
    return BucketCounts(gamma=gamma, positive=pos, negative=neg, zero=m.zero)


def _distribution(m: pb.Distribution) -> DistributionReading:
    where = f"distribution {m.name!r}"
    lo = m.min if m.HasField("min") else None
    hi = m.max if m.HasField("max") else None
    if lo is not None and hi is not None and lo > hi:
        raise WireError(f"{where}: min {lo} > max {hi}")
    buckets = _buckets(m.buckets, where) if m.HasField("buckets") else None
    if buckets is not None:
        in_buckets = sum(buckets.positive.values()) + sum(buckets.negative.values()) + buckets.zero
        if in_buckets != m.count:
            raise WireError(f"{where}: buckets hold {in_buckets} samples, count says {m.count}")
    return DistributionReading(
        name=m.name,
        unit=_unit(m.unit, where),
        count=m.count,
        total=_finite(m.total, where),
        min=lo,
        max=hi,
        rate_per_second=m.rate_per_second if m.HasField("rate_per_second") else None,
        value_rate_per_second=(
            m.value_rate_per_second if m.HasField("value_rate_per_second") else None
        ),
        percentiles=_pairs(m.percentile_percents, m.percentile_values, f"{where} percentiles"),
        recent=_samples(m.recent_times_unix, m.recent_values, f"{where} recent samples"),
        buckets=buckets,
        help=m.help,
    )


def _graph(m: pb.Graph) -> GraphRecord:
    if not m.hash:
        raise WireError(f"graph {m.name!r} has an empty hash")
    return GraphRecord(
        hash=m.hash,
        name=m.name,
        engine=m.engine,
        first_seen_unix=m.first_seen_unix,
        last_seen_unix=m.last_seen_unix,
        compiles=m.compiles,
        compile_seconds_total=m.compile_seconds_total,
        compile_seconds_last=m.compile_seconds_last,
        cache_hits=m.cache_hits,
        executions=m.executions if m.HasField("executions") else None,
        signature=tuple(m.signature),
        signatures=tuple(tuple(s.args) for s in m.signatures) if m.signatures else (),
        causes=() if not m.causes else tuple(
            RecompileCause(
                time_unix=c.time_unix,
                description=c.description,
                location=c.location if c.HasField("location") else None,
                argument=c.argument if c.HasField("argument") else None,
                before=c.before if c.HasField("before") else None,
                after=c.after if c.HasField("after") else None,
            )
            for c in m.causes
        ),
    )


def _device(m: pb.Device) -> DeviceRecord:
    where = f"device {m.id}"
    mm = m.memory

    def opt_bytes(field: str) -> int | None:
        return _nonneg(getattr(mm, field), f"{where} {field}") if mm.HasField(field) else None

    return DeviceRecord(
        id=m.id,
        kind=m.kind,
        platform=m.platform,
        memory=MemoryReading(
            used_bytes=opt_bytes("used_bytes"),
            peak_bytes=opt_bytes("peak_bytes"),
            limit_bytes=opt_bytes("limit_bytes"),
            source=mm.source or "none",
            reason=mm.reason,
        ),
        busy_percent=m.busy_percent if m.HasField("busy_percent") else None,
        busy_reason=m.busy_reason,
    )


def _event(m: pb.Event) -> Event:
    if m.seq < 1:
        raise WireError("event with sequence number 0")
    return Event(
        seq=m.seq,
        time_unix=m.time_unix,
        kind=m.kind,
        name=m.name,
        graph_hash=m.graph_hash,
        detail=m.detail,
        location=m.location if m.HasField("location") else None,
        value=m.value if m.HasField("value") else None,
    )


class DecodeCache:
    """Records decoded from one source's previous snapshot, by the bytes each
    came from. A source's next snapshot repeats most graphs, distributions
    and events byte for byte; a part whose bytes were decoded (and validated)
    before is taken as it is: the same bytes are the same message, so the
    same record. Re-serializing a part and looking it up costs a tenth of
    decoding it (1,000 graphs: 0.7 vs 13 ms). Holds the latest snapshot's
    parts only; safe to share between threads (a race only costs hits).
    """

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, dict[bytes, Any]] = {}

    def records(self, section: str, messages: Iterable[Any], decode: Callable[[Any], T],
                fresh: dict[str, dict[bytes, Any]]) -> tuple[T, ...]:
        """``decode`` of each message, or the record its bytes gave before;
        what this snapshot holds goes into ``fresh[section]``."""
        old = self._kept.get(section, {})
        new: dict[bytes, Any] = {}
        out = []
        for m in messages:
            key = m.SerializeToString()
            record = old.get(key)
            if record is None:
                record = new.get(key)
                if record is None:
                    record = decode(m)
            new[key] = record
            out.append(record)
        fresh[section] = new
        return tuple(out)

    def keep(self, fresh: dict[str, dict[bytes, Any]]) -> None:
        """Makes a whole, valid snapshot's parts the ones kept."""
        self._kept = fresh


def _records(section: str, messages: Iterable[Any], decode: Callable[[Any], T],
             cache: DecodeCache | None, fresh: dict[str, dict[bytes, Any]]) -> tuple[T, ...]:
    if cache is None:
        return tuple(decode(m) for m in messages)
    return cache.records(section, messages, decode, fresh)


def snapshot_from_proto(m: pb.Snapshot, cache: DecodeCache | None = None) -> Snapshot:
    """The :class:`Snapshot` a ``tpu_info.v1.Snapshot`` message describes.

    With ``cache`` (one per source), parts that arrived before unchanged are
    not decoded again.

    Raises:
        ProtocolMismatch: the message carries no (or an unreadable) version.
        WireError: the contents are invalid (the message says what and where).
    """
    check_version(m.protocol_version)
    process = None
    if m.HasField("process"):
        p = m.process
        process = ProcessRecord(
            pid=p.pid,
            name=p.name,
            argv=tuple(p.argv),
            host=p.host,
            user=p.user,
            engine=p.engine,
            versions=dict(p.versions),
            start_time_unix=p.start_time_unix,
        )
    counters = tuple(
        CounterReading(
            name=c.name,
            value=_nonneg(c.value, f"counter {c.name!r}"),
            unit=_unit(c.unit, f"counter {c.name!r}"),
            help=c.help,
        )
        for c in m.counters
    )
    fresh: dict[str, dict[bytes, Any]] = {}
    events = _records("events", m.events, _event, cache, fresh)
    if any(a.seq >= b.seq for a, b in zip(events, events[1:], strict=False)):
        raise WireError("events are not in increasing sequence order")
    if events and events[-1].seq > m.last_seq:
        raise WireError(f"event {events[-1].seq} is newer than last_seq {m.last_seq}")
    snapshot = Snapshot(
        taken_at_unix=m.taken_at_unix,
        process=process,
        devices=tuple(_device(d) for d in m.devices),
        counters=counters,
        distributions=_records("distributions", m.distributions, _distribution, cache, fresh),
        graphs=_records("graphs", m.graphs, _graph, cache, fresh),
        events=events,
        last_seq=m.last_seq,
        uptime_seconds=m.uptime_seconds,
    )
    if cache is not None:
        cache.keep(fresh)
    return snapshot


def metric_infos_from_proto(reply: pb.ListMetricsReply) -> list[MetricInfo]:
    """The names a ``ListMetrics`` reply lists.

    Raises:
        ProtocolMismatch, WireError: as for :func:`snapshot_from_proto`.
    """
    check_version(reply.protocol_version)
    out = []
    for i in reply.metrics:
        if i.kind not in ("counter", "distribution"):
            raise WireError(f"metric {i.name!r}: unknown kind {i.kind!r}")
        out.append(MetricInfo(i.name, i.kind, _unit(i.unit, f"metric {i.name!r}"), i.help))
    return out
