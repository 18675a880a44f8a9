"""Pure conversion between :mod:`tpu_info.contract.model` records and ``tpu_info.v1``.

The server turns a :class:`~tpu_info.contract.model.Snapshot` into a protobuf message
(:func:`snapshot_to_proto`; :mod:`tpu_info.wire.encoder` writes the same bytes
faster, reusing what did not change); the client turns the message back into records
(:func:`snapshot_from_proto`). Data from the wire is validated: anything a
record cannot honestly hold (an unknown unit, arrays of unequal length, a
negative count, a version this client does not speak) raises
:class:`~tpu_info.contract.errors.WireError` or
:class:`~tpu_info.contract.errors.ProtocolMismatch`, never an ``assert``; counts are
bounded before decoding, every string is cleaned of control characters, and
a number that is not finite is kept out with its reason
(:attr:`~tpu_info.contract.model.Snapshot.left_out`).

Example:
    >>> from tpu_info.contract.model import Snapshot, CounterReading
    >>> s = Snapshot(taken_at_unix=1.0, counters=(CounterReading("MarkStep", 3),))
    >>> snapshot_from_proto(snapshot_to_proto(s)).counter("MarkStep")
    3
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tpu_info.contract.buckets import SortedCounts
from tpu_info.contract.cause_kinds import kind_of
from tpu_info.contract.errors import ProtocolMismatch, WireError
from tpu_info.contract.model import (
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
from tpu_info.wire.decoding import MAX_NOTES, MAX_UNIX_TIME, Decoding, text  # noqa: F401 - re-exported
from tpu_info.wire.fillers import (  # noqa: F401 - the server side, re-exported
    PROTOCOL_VERSION,
    UNIT_TO_PB,
    metric_infos_to_proto,
    snapshot_to_proto,
)
from tpu_info.wire.run_series import MAX_SERIES, read_series  # noqa: F401 - re-exported
from tpu_info.wire.sites import read_diagnosis

T = TypeVar("T")

_UNIT_FROM_PB: dict[int, Unit] = {v: k for k, v in UNIT_TO_PB.items()}

# proto -> model (client side) ------------------------------------------------
#
# A reply is a stranger's data. Counts are bounded before anything is decoded
# (what a real hook stays under, docs/threat-model.md, "Bounds"; beyond them a reply is cut),
# every string is cleaned (tpu_info.contract.safe.clean), and a number that is not
# finite is kept out: an optional one becomes None, a required one 0, a
# distribution whose total is not finite is left out; each time with the
# reason in Snapshot.left_out. Structural nonsense raises WireError.

MAX_GRAPHS = 2_000  # the hook's graph ledger
MAX_EVENTS = 25_000  # the hook's two rings of 10,000, and one unfolded batch of 4,096
MAX_DISTRIBUTIONS = 4_096
MAX_COUNTERS = 4_096
MAX_DEVICES = 1_024
MAX_CAUSES = 32  # per graph, the hook's bound
MAX_SIGNATURES = 8  # per graph, the hook's bound
MAX_STRINGS = 4_096  # argv entries, or arguments of one signature
MAX_VERSIONS = 256
MAX_PERCENTILES = 64
MAX_RECENT = 1_024  # the hook keeps 64
MAX_BUCKETS = 20_000  # per sign; the hook's dense span is 16,384
MAX_METRICS = 4_096  # ListMetrics entries
_CHECK_EVERY = 64  # records decoded between two looks at the deadline


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


def _nonneg(value: int, where: str) -> int:
    if value < 0:
        raise WireError(f"{where}: negative value {value}")
    return value


def _pairs(a: Sequence[float], b: Sequence[float], where: str,
           dec: Decoding) -> tuple[tuple[float, float], ...]:
    if len(a) != len(b):
        raise WireError(f"{where}: {len(a)} keys but {len(b)} values")
    pairs = tuple(zip(dec.bounded(a, MAX_PERCENTILES, where),
                      dec.bounded(b, MAX_PERCENTILES, where), strict=True))
    good = tuple((p, v) for p, v in pairs if math.isfinite(p) and math.isfinite(v))
    if len(good) != len(pairs):
        dec.left_out(where, f"{len(pairs) - len(good)} not finite; shown as N/A")
    return good


def _samples(times: Sequence[float], values: Sequence[float], where: str,
             dec: Decoding) -> Samples:
    if len(times) != len(values):
        raise WireError(f"{where}: {len(times)} times but {len(values)} values")
    times = dec.bounded(times, MAX_RECENT, where, newest=True)
    values = dec.bounded(values, MAX_RECENT, where, newest=True)
    s = Samples(times[:], values[:])  # one copy each out of the message, in C
    if all(map(math.isfinite, s.times)) and all(map(math.isfinite, s.values)):
        return s
    keep = [i for i, (t, v) in enumerate(zip(s.times, s.values, strict=True))
            if math.isfinite(t) and math.isfinite(v)]
    dec.left_out(where, f"{len(s.times) - len(keep)} not finite; left out")
    return Samples([s.times[i] for i in keep], [s.values[i] for i in keep])


def _int_map(keys: Sequence[int], counts: Sequence[int], where: str,
             descending: bool = False) -> Mapping[int, int]:
    """Bucket counts by key. Keys in value order (as the hook sends them:
    ascending, or descending for negative buckets) come back as two lists,
    without a dict; any other order as a dict."""
    if len(keys) > MAX_BUCKETS:
        raise WireError(f"{where}: {len(keys):,} buckets, more than the {MAX_BUCKETS:,} "
                        "a real program sends")
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


def _distribution(m: pb.Distribution, dec: Decoding) -> DistributionReading | None:
    name = text(m.name)
    where = f"distribution {name}"
    unit = _unit(m.unit, where)
    if not math.isfinite(m.total):
        dec.left_out(where, f"its total is not a finite number ({m.total!r}); left out")
        return None
    lo, hi = dec.opt(m, "min", where), dec.opt(m, "max", where)
    if lo is not None and hi is not None and lo > hi:
        raise WireError(f"{where}: min {lo} > max {hi}")
    buckets = _buckets(m.buckets, where) if m.HasField("buckets") else None
    if buckets is not None:
        in_buckets = sum(buckets.positive.values()) + sum(buckets.negative.values()) + buckets.zero
        if in_buckets != m.count:
            raise WireError(f"{where}: buckets hold {in_buckets} samples, count says {m.count}")
    return DistributionReading(
        name=name,
        unit=unit,
        count=m.count,
        total=m.total,
        min=lo,
        max=hi,
        rate_per_second=dec.opt(m, "rate_per_second", where),
        value_rate_per_second=dec.opt(m, "value_rate_per_second", where),
        percentiles=_pairs(m.percentile_percents, m.percentile_values,
                           f"{where} percentiles", dec),
        recent=_samples(m.recent_times_unix, m.recent_values, f"{where} recent samples", dec),
        buckets=buckets,
        help=text(m.help),
        series=(read_series(m.series, m.count, f"{where} series", dec)
                if m.HasField("series") else None),
    )


def _cause(c: pb.RecompileCause, where: str, dec: Decoding) -> RecompileCause:
    return RecompileCause(
        time_unix=dec.when(c.time_unix, where, "cause time"),
        description=text(c.description),
        location=text(c.location) if c.HasField("location") else None,
        argument=text(c.argument) if c.HasField("argument") else None,
        before=text(c.before) if c.HasField("before") else None,
        after=text(c.after) if c.HasField("after") else None,
        via=text(c.via),
        kind=kind_of(text(c.kind)),
        dim=c.dim if c.HasField("dim") else None,
        name=text(c.name),
        guard=text(c.guard),
        sync=c.sync if c.HasField("sync") else None,
        syncs_after=c.syncs_after if c.HasField("syncs_after") else None,
        seconds=dec.opt(c, "seconds", where),
    )


def _graph(m: pb.Graph, dec: Decoding) -> GraphRecord:
    hash_ = text(m.hash)
    if not hash_:
        raise WireError(f"graph {text(m.name)!r} has an empty hash")
    where = f"graph {hash_[:12]}"
    return GraphRecord(
        hash=hash_,
        name=text(m.name),
        engine=text(m.engine),
        first_seen_unix=dec.when(m.first_seen_unix, where, "first_seen_unix"),
        last_seen_unix=dec.when(m.last_seen_unix, where, "last_seen_unix"),
        compiles=m.compiles,
        compile_seconds_total=dec.num0(m.compile_seconds_total, where, "compile_seconds_total"),
        compile_seconds_last=dec.num0(m.compile_seconds_last, where, "compile_seconds_last"),
        cache_hits=m.cache_hits,
        executions=m.executions if m.HasField("executions") else None,
        device_seconds=(max(0.0, dec.num0(m.device_seconds, where, "device_seconds"))
                        if m.HasField("device_seconds") else None),
        device_samples=m.device_samples,
        loop_line=text(m.loop_line), loop_ops=m.loop_ops, const_bytes=m.const_bytes,
        signature=dec.strings(m.signature, MAX_STRINGS, where, "signature"),
        signatures=tuple(dec.strings(s.args, MAX_STRINGS, where, "signatures")
                         for s in dec.bounded(m.signatures, MAX_SIGNATURES, where,
                                              "signatures", newest=True))
        if m.signatures else (),
        causes=() if not m.causes else tuple(
            _cause(c, where, dec)
            for c in dec.bounded(m.causes, MAX_CAUSES, where, "causes", newest=True)),
    )


def _device(m: pb.Device, dec: Decoding) -> DeviceRecord:
    where = f"device {m.id}"
    mm = m.memory

    def opt_bytes(field: str) -> int | None:
        return _nonneg(getattr(mm, field), f"{where} {field}") if mm.HasField(field) else None

    busy = dec.opt(m, "busy_percent", where)
    return DeviceRecord(
        id=m.id,
        kind=text(m.kind),
        platform=text(m.platform),
        memory=MemoryReading(
            used_bytes=opt_bytes("used_bytes"),
            peak_bytes=opt_bytes("peak_bytes"),
            limit_bytes=opt_bytes("limit_bytes"),
            source=text(mm.source) or "none",
            reason=text(mm.reason),
        ),
        busy_percent=busy,
        busy_reason=(f"the target sent {m.busy_percent!r}, not a finite number"
                     if busy is None and m.HasField("busy_percent") else text(m.busy_reason)),
        # Views label only "libtpu" as the chip's duty cycle: any other is an estimate.
        busy_source=text(m.busy_source),
    )


def _event(m: pb.Event, dec: Decoding) -> Event:
    seq = m.seq
    if seq < 1:
        raise WireError("event with sequence number 0")
    t = m.time_unix
    value = m.value if m.HasField("value") else None
    if not 0.0 <= t <= MAX_UNIX_TIME:  # events are many: their place is named when needed
        t = dec.when(t, f"event {seq}", "time")
    if value is not None and not math.isfinite(value):
        value = dec.num(value, f"event {seq}", "value")
    return Event(
        seq=seq,
        time_unix=t,
        kind=text(m.kind),
        name=text(m.name),
        graph_hash=text(m.graph_hash),
        detail=text(m.detail),
        location=text(m.location) if m.HasField("location") else None,
        value=value,
        via=text(m.via),
    )


class DecodeCache:
    """Records decoded from one source's previous snapshot, by the bytes each
    came from. A source's next snapshot repeats most graphs, distributions
    and events byte for byte; a part whose bytes were decoded (and validated)
    before is taken as it is, with the reasons for anything its decode kept
    out: the same bytes are the same message, so the same record.
    Re-serializing a part and looking it up costs a tenth of decoding it
    (1,000 graphs: 0.7 vs 13 ms). Holds the latest snapshot's parts only;
    safe to share between threads (a race only costs hits).
    """

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, dict[bytes, Any]] = {}

    def records(self, section: str, messages: Iterable[Any],
                decode: Callable[[Any, Decoding], T | None], dec: Decoding,
                fresh: dict[str, dict[bytes, Any]]) -> tuple[T, ...]:
        """``decode`` of each message, or the record its bytes gave before
        (None: kept out); what this snapshot holds goes into ``fresh[section]``."""
        old = self._kept.get(section, {})
        new: dict[bytes, Any] = {}
        out = []
        for i, m in enumerate(messages):
            key = m.SerializeToString()
            hit = old.get(key) or new.get(key)
            if hit is None:
                mark = len(dec.notes)
                hit = (decode(m, dec), tuple(dec.notes[mark:]))
                if not i % _CHECK_EVERY:
                    dec.check()
            elif hit[1]:
                dec.notes.extend(hit[1])
            new[key] = hit
            if hit[0] is not None:
                out.append(hit[0])
        fresh[section] = new
        return tuple(out)

    def keep(self, fresh: dict[str, dict[bytes, Any]], unchanged: Sequence[str] = ()) -> None:
        """Makes a whole, valid snapshot's parts the ones kept; a section it
        left out as unchanged (a cursor's answer) keeps its last parts."""
        for section in unchanged:
            if section in self._kept:
                fresh[section] = self._kept[section]
        self._kept = fresh


def _records(section: str, messages: Sequence[Any], decode: Callable[[Any, Decoding], T | None],
             cache: DecodeCache | None, dec: Decoding, fresh: dict[str, dict[bytes, Any]],
             bound: int, newest: bool = False) -> tuple[T, ...]:
    messages = dec.bounded(messages, bound, section, newest=newest)
    if cache is not None:
        return cache.records(section, messages, decode, dec, fresh)
    out = []
    for i, m in enumerate(messages):
        record = decode(m, dec)
        if record is not None:
            out.append(record)
        if not i % _CHECK_EVERY:
            dec.check()
    return tuple(out)


def _process(p: pb.Process, dec: Decoding) -> ProcessRecord:
    versions = dec.bounded(list(itertools.islice(p.versions.items(), MAX_VERSIONS + 1)),
                           MAX_VERSIONS, "process versions")
    return ProcessRecord(
        pid=p.pid,
        name=text(p.name),
        argv=dec.strings(p.argv, MAX_STRINGS, "process", "argv"),
        host=text(p.host),
        user=text(p.user),
        engine=text(p.engine),
        versions={text(k): text(v) for k, v in versions},
        start_time_unix=dec.when(p.start_time_unix, "process", "start_time_unix"),
        waiting=text(p.waiting),
        process_index=_rank(p, "process_index", dec),
        process_count=_rank(p, "process_count", dec),
        process_index_source=text(p.process_index_source),
    )


MAX_PROCESSES = 1 << 24  # ranks of a job: far above any pod


def _rank(p: pb.Process, field: str, dec: Decoding) -> int | None:
    """A rank or a process count, None when unset or out of range."""
    if not p.HasField(field):
        return None
    value = getattr(p, field)
    if 0 <= value < MAX_PROCESSES + (field == "process_count"):
        return value
    dec.left_out(f"process {field}", f"out of range ({value}); shown as N/A")
    return None


def snapshot_from_proto(m: pb.Snapshot, cache: DecodeCache | None = None, *,
                        deadline: float | None = None,
                        seconds: float | None = None) -> Snapshot:
    """The :class:`Snapshot` a ``tpu_info.v1.Snapshot`` message describes.

    With ``cache`` (one per source), parts that arrived before unchanged are
    not decoded again. Values kept out (not finite, beyond a count bound) are
    listed in :attr:`Snapshot.left_out` with the reason.

    Args:
        m: the message.
        cache: the source's decode cache, if any.
        deadline: ``time.monotonic()`` by which decoding must end.
        seconds: the whole allowance, for the error message.

    Raises:
        ProtocolMismatch: the message carries no (or an unreadable) version.
        WireError: the contents are invalid (the message says what and where).
        TimedOut: decoding did not end by ``deadline``.
    """
    check_version(m.protocol_version)
    dec = Decoding(deadline, seconds)
    dec.check()
    if not 0.0 <= m.taken_at_unix <= MAX_UNIX_TIME:
        raise WireError(f"taken_at_unix is not a time ({m.taken_at_unix!r})")
    process = _process(m.process, dec) if m.HasField("process") else None
    counters = tuple(
        CounterReading(
            name=(name := text(c.name)),
            value=_nonneg(c.value, f"counter {name!r}"),
            unit=_unit(c.unit, f"counter {name!r}"),
            help=text(c.help),
        )
        for c in dec.bounded(m.counters, MAX_COUNTERS, "counters")
    )
    devices = tuple(_device(d, dec) for d in dec.bounded(m.devices, MAX_DEVICES, "devices"))
    fresh: dict[str, dict[bytes, Any]] = {}
    events = _records("events", m.events, _event, cache, dec, fresh, MAX_EVENTS, newest=True)
    if any(a.seq >= b.seq for a, b in zip(events, events[1:], strict=False)):
        raise WireError("events are not in increasing sequence order")
    if events and events[-1].seq > m.last_seq:
        raise WireError(f"event {events[-1].seq} is newer than last_seq {m.last_seq}")
    distributions = _records("distributions", m.distributions, _distribution, cache, dec, fresh,
                             MAX_DISTRIBUTIONS)
    graphs = _records("graphs", m.graphs, _graph, cache, dec, fresh, MAX_GRAPHS)
    uptime = dec.num0(m.uptime_seconds, "uptime_seconds")
    sites, steps, blind_spots = read_diagnosis(m, dec)
    dec.check()
    snapshot = Snapshot(
        taken_at_unix=m.taken_at_unix,
        process=process,
        devices=devices,
        counters=counters,
        distributions=distributions,
        graphs=graphs,
        events=events,
        last_seq=m.last_seq,
        uptime_seconds=uptime,
        sites=sites,
        steps=steps,
        blind_spots=blind_spots,
        left_out=dec.summary(),
    )
    if cache is not None:
        cache.keep(fresh, m.unchanged[:16] if m.unchanged else ())
    return snapshot


def metric_infos_from_proto(reply: pb.ListMetricsReply) -> list[MetricInfo]:
    """The names a ``ListMetrics`` reply lists (the first :data:`MAX_METRICS`).

    Raises:
        ProtocolMismatch, WireError: as for :func:`snapshot_from_proto`.
    """
    check_version(reply.protocol_version)
    out = []
    for i in reply.metrics[:MAX_METRICS]:
        name = text(i.name)
        if i.kind not in ("counter", "distribution"):
            raise WireError(f"metric {name!r}: unknown kind {text(i.kind)!r}")
        out.append(MetricInfo(name, i.kind, _unit(i.unit, f"metric {name!r}"), text(i.help)))
    return out
