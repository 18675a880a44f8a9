"""Model records -> ``tpu_info.v1`` messages: the plain codec's server side.

:func:`snapshot_to_proto` builds the message of a
:class:`~tpu_info.contract.model.Snapshot` field by field; the ``fill_*`` functions
are the one place each message's fields are written from a record, shared
by :mod:`tpu_info.wire.encoder` (the fast path, which writes some fields itself
and leaves the rest to these) and re-exported by :mod:`tpu_info.wire.codec`.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> snapshot_to_proto(Snapshot(taken_at_unix=1.0)).protocol_version
    1
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from tpu_info.contract.buckets import SortedCounts
from tpu_info.contract.captures import RemoteCapture
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import (
    BucketCounts,
    DeviceRecord,
    DistributionReading,
    Event,
    GraphRecord,
    MetricInfo,
    Samples,
    Snapshot,
    Unit,
)
from tpu_info.contract.series import RunSeries
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.sites import fill_diagnosis

# Major version is the package (tpu_info.v1); this is the minor revision.
PROTOCOL_VERSION = 1

UNIT_TO_PB: dict[Unit, Any] = {
    Unit.TIME_NS: pb.UNIT_NS, Unit.BYTES: pb.UNIT_BYTES, Unit.NUMBER: pb.UNIT_NUMBER}


def fill_buckets(msg: pb.Buckets, b: BucketCounts, keys: bool = True) -> None:
    """Writes ``b`` into ``msg`` (without the key lists when ``keys`` is false:
    the fast encoder writes those itself)."""
    # Keys need not be sorted on the wire; a mapping's keys() and values()
    # iterate in the same order, and skipping the sort halves the cost.
    msg.gamma = b.gamma
    for counts, keys_field, counts_field in ((b.positive, msg.positive_keys, msg.positive_counts),
                                             (b.negative, msg.negative_keys, msg.negative_counts)):
        if isinstance(counts, SortedCounts):  # the hook's own readings: lists already
            if keys:
                keys_field.extend(counts.key_list)
            counts_field.extend(counts.count_list)
        elif counts:
            if keys:
                keys_field.extend(counts.keys())
            counts_field.extend(counts.values())
    msg.zero = b.zero


def fill_distribution(m: pb.Distribution, d: DistributionReading,
                       buckets: bool = True) -> None:
    """Writes ``d`` into ``m`` (without its buckets when ``buckets`` is false)."""
    m.name = d.name
    m.unit = UNIT_TO_PB[d.unit]
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
        fill_buckets(m.buckets, d.buckets)
    if d.help:
        m.help = d.help
    if d.series is not None:
        fill_series(m.series, d.series)


def fill_series(m: pb.RunSeries, r: RunSeries) -> None:
    """Writes a whole-run series into ``m`` (its arrays straight in, from C)."""
    m.width = r.width
    m.first_unix.extend(r.first_unix)
    m.last_unix.extend(r.last_unix)
    m.counts.extend(r.counts)
    m.totals.extend(r.totals)
    m.mins.extend(r.mins)
    m.maxs.extend(r.maxs)


def fill_graph(m: pb.Graph, g: GraphRecord) -> None:
    """Writes ``g`` into ``m``: its counts and its history."""
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
    if g.device_seconds is not None:
        m.device_seconds = g.device_seconds
    m.device_samples = g.device_samples
    m.loop_line = g.loop_line
    m.loop_ops = g.loop_ops
    m.const_bytes = g.const_bytes
    fill_history(m, g)


def fill_history(m: pb.Graph, g: GraphRecord) -> None:
    """Writes ``g``'s signatures and recompile causes into ``m``."""
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
        if c.via:
            cm.via = c.via
        if c.kind != CauseKind.UNKNOWN:
            cm.kind = c.kind
        if c.dim is not None:
            cm.dim = c.dim
        if c.name:
            cm.name = c.name
        if c.guard:
            cm.guard = c.guard
        if c.sync is not None:
            cm.sync = c.sync
        if c.syncs_after is not None:
            cm.syncs_after = c.syncs_after
        if c.seconds is not None:
            cm.seconds = c.seconds


def fill_device(m: pb.Device, d: DeviceRecord) -> None:
    """Writes ``d`` (its memory included) into ``m``."""
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
    m.busy_source = d.busy_source


def fill_event(m: pb.Event, e: Event) -> None:
    """Writes ``e`` into ``m``."""
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
    if e.via:
        m.via = e.via


class Stamp(NamedTuple):
    """What an answer is, for a reader's next cursor (:mod:`tpu_info.wire.delta`):
    the server's instance, the generation of its parts, and the parts it
    leaves out (the reader's copy being current). Not in the model: it
    belongs to one answer, not to the program."""

    instance: str = ""
    generation: int = 0
    unchanged: tuple[str, ...] = ()
    # Parts sent record by record: (part, every record's key in order, the
    # positions of the records sent); the positions stay on the server.
    kept: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = ()

    def sent(self, part: str, records: tuple[Any, ...]) -> Any:
        """The records of ``part`` this answer carries."""
        if part in self.unchanged:
            return ()
        for name, _, positions in self.kept:
            if name == part:
                return [records[i] for i in positions]
        return records


def fill_head(s: Snapshot, stamp: Stamp | None = None) -> pb.Snapshot:
    """The message of ``s`` without its distributions, graphs and events."""
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
        pm.waiting = p.waiting
        if p.process_index is not None:
            pm.process_index = p.process_index
        if p.process_count is not None:
            pm.process_count = p.process_count
        pm.process_index_source = p.process_index_source
    for dev in s.devices:
        fill_device(msg.devices.add(), dev)
    for c in s.counters:
        msg.counters.add(name=c.name, value=c.value, unit=UNIT_TO_PB[c.unit], help=c.help)
    fill_diagnosis(msg, s)
    if stamp is not None:
        msg.instance, msg.generation = stamp.instance, stamp.generation
        msg.unchanged.extend(stamp.unchanged)
        for part, keys, _ in stamp.kept:
            msg.kept.add(part=part, keys=keys)
    return msg


def snapshot_to_proto(s: Snapshot, stamp: Stamp | None = None) -> pb.Snapshot:
    """The ``tpu_info.v1.Snapshot`` message of a snapshot (and the answer's stamp)."""
    msg = fill_head(s, stamp)
    for e in s.events:
        fill_event(msg.events.add(), e)
    for d in stamp.sent("distributions", s.distributions) if stamp else s.distributions:
        fill_distribution(msg.distributions.add(), d)
    for g in stamp.sent("graphs", s.graphs) if stamp else s.graphs:
        fill_graph(msg.graphs.add(), g)
    return msg


def metric_infos_to_proto(infos: Iterable[MetricInfo]) -> pb.ListMetricsReply:
    """The ``ListMetrics`` reply for ``infos``."""
    reply = pb.ListMetricsReply(protocol_version=PROTOCOL_VERSION)
    for i in infos:
        reply.metrics.add(name=i.name, kind=i.kind, unit=UNIT_TO_PB[i.unit], help=i.help)
    return reply


def capture_reply(out: RemoteCapture) -> pb.CaptureReply:
    """The ``Capture`` reply carrying what a capture function returned."""
    return pb.CaptureReply(
        trace=out.trace, format=out.format, protocol_version=PROTOCOL_VERSION,
        files=[pb.CaptureFile(name=f.name, size_bytes=f.size_bytes, data=f.data or b"",
                              server_path=f.server_path) for f in out.files],
        truncated=out.truncated, notes=list(out.notes), event_count=out.event_count)
