"""The server's encoder: ``tpu_info.v1.Snapshot`` bytes written straight
from a :class:`~tpu_info.contract.model.Snapshot`, reusing the encodings of parts that
did not change since the previous snapshot (:class:`PartCache`).

Everything here produces bytes that parse to exactly the message
:func:`tpu_info.wire.fillers.snapshot_to_proto` builds (tests compare them,
field by field); fields may come in another order, which protobuf parsers
accept.

How the fast path stays the plain codec's twin: each message it writes has
a :class:`FastFields` plan naming the fields it writes itself (``direct``:
their tags and value encodings come from the generated descriptor, at
import) and the fields it leaves to the plain codec's fillers
(``filled``: :mod:`tpu_info.wire.fillers`). A field in neither, one added
to the ``.proto`` since, makes the plan incomplete: that message then goes
through the plain codec whole (slower, nothing dropped), and
``tests/tpu_info/wire/test_encoder_fields.py`` fails until the plan names it.

Reuse follows :mod:`tpu_info.contract.reuse`: a record that did not change is the
same object, so encodings are kept by the identity of what they encode.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> cache = PartCache()
    >>> data = snapshot_to_bytes(Snapshot(taken_at_unix=1.0), cache)
    >>> pb.Snapshot.FromString(data).taken_at_unix
    1.0
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor as FD

from tpu_info.contract import reuse
from tpu_info.contract.buckets import SortedCounts, StableKeys
from tpu_info.contract.model import DistributionReading, Event, GraphRecord, Snapshot
from tpu_info.contract.safe import os_text
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import fillers as wire_encode

_DOUBLE = struct.Struct("<d")


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _signed(n: int) -> bytes:
    return _varint(n & 0xFFFF_FFFF_FFFF_FFFF)  # a negative one: two's complement, 10 bytes


def _string(v: str) -> bytes:
    raw = v.encode()
    return _varint(len(raw)) + raw


# Value encodings of the scalar types the fast path writes itself.
_PUT: dict[int, Callable[[Any], bytes]] = {
    FD.TYPE_DOUBLE: _DOUBLE.pack, FD.TYPE_UINT64: _varint, FD.TYPE_UINT32: _varint,
    FD.TYPE_INT64: _signed, FD.TYPE_INT32: _signed, FD.TYPE_ENUM: _signed,
    FD.TYPE_BOOL: _varint, FD.TYPE_STRING: _string,
}
_LENGTH_DELIMITED = frozenset({FD.TYPE_STRING, FD.TYPE_BYTES, FD.TYPE_MESSAGE})
_FIXED64 = frozenset({FD.TYPE_DOUBLE, FD.TYPE_FIXED64, FD.TYPE_SFIXED64})
_FIXED32 = frozenset({FD.TYPE_FLOAT, FD.TYPE_FIXED32, FD.TYPE_SFIXED32})


def field_tag(fd: Any) -> bytes:
    """A field's key on the wire (number and wire type), from its descriptor."""
    if fd.type in _LENGTH_DELIMITED or fd.is_repeated and fd.is_packed:
        wire_type = 2
    elif fd.type in _FIXED64:
        wire_type = 1
    elif fd.type in _FIXED32:
        wire_type = 5
    else:
        wire_type = 0
    return _varint(fd.number << 3 | wire_type)


class FastFields:
    """How the fast path writes one message (see the module docstring).

    Args:
        message: the generated message class.
        direct: fields the fast path writes itself.
        filled: fields it leaves to the plain codec's filler.

    Raises:
        ValueError: a named field is not in the message (renamed or gone).
    """

    def __init__(self, message: Any, direct: tuple[str, ...], filled: tuple[str, ...]) -> None:
        fields = message.DESCRIPTOR.fields_by_name
        unknown = (set(direct) | set(filled)) - set(fields)
        if unknown:
            raise ValueError(f"{message.DESCRIPTOR.full_name} has no field {sorted(unknown)}")
        self.message = message
        self.direct = direct
        self.filled = filled
        self.missing = frozenset(fields) - set(direct) - set(filled)
        self.complete = not self.missing  # else: the plain codec writes it whole
        self.tags = {name: field_tag(fields[name]) for name in direct}
        # The filled fields of a record, and their values when none is set
        # (None where the field has presence, the proto default otherwise).
        self.filled_values: Callable[[Any], tuple[Any, ...]] = (
            operator.attrgetter(*filled) if len(filled) > 1
            else (lambda r: (getattr(r, filled[0]),)) if filled else (lambda r: ()))
        self.filled_unset = tuple(
            None if fields[n].has_presence else () if fields[n].is_repeated
            else fields[n].default_value for n in filled)

    def put(self, name: str) -> Callable[[Any], bytes]:
        """The value encoding of direct scalar field ``name``, by its type."""
        fd = self.message.DESCRIPTOR.fields_by_name[name]
        if fd.is_repeated or fd.type not in _PUT:
            raise ValueError(f"{fd.full_name}: not a scalar the fast path writes")
        return _PUT[fd.type]


SNAPSHOT = FastFields(pb.Snapshot, direct=("distributions", "graphs", "events"), filled=(
    "protocol_version", "taken_at_unix", "process", "devices", "counters", "last_seq",
    "uptime_seconds", "sites", "steps", "blind_spots", "instance", "generation", "unchanged",
    "kept"))
EVENT = FastFields(pb.Event, direct=("seq", "time_unix", "kind", "value"),
                   filled=("name", "graph_hash", "detail", "location", "via"))
GRAPH = FastFields(pb.Graph, direct=(
    "last_seen_unix", "compiles", "compile_seconds_total", "compile_seconds_last",
    "cache_hits", "executions", "device_seconds", "device_samples"), filled=(
    "hash", "name", "engine", "first_seen_unix", "signature", "signatures", "causes",
    "loop_line", "loop_ops", "const_bytes"))
DISTRIBUTION = FastFields(pb.Distribution, direct=("buckets",), filled=(
    "name", "unit", "count", "total", "min", "max", "rate_per_second",
    "value_rate_per_second", "percentile_percents", "percentile_values",
    "recent_times_unix", "recent_values", "help", "series"))
BUCKETS = FastFields(pb.Buckets, direct=("positive_keys", "negative_keys"),
                     filled=("gamma", "positive_counts", "negative_counts", "zero"))
PLANS = (SNAPSHOT, EVENT, GRAPH, DISTRIBUTION, BUCKETS)  # every message the fast path writes

_DIST_TAG, _GRAPH_TAG, _EVENT_TAG = (SNAPSHOT.tags[n] for n in SNAPSHOT.direct)


# Events ------------------------------------------------------------------

_SEQ, _TIME, _KIND, _VALUE = (EVENT.tags[n] for n in EVENT.direct)
_put_seq, _put_time, _put_value = EVENT.put("seq"), EVENT.put("time_unix"), EVENT.put("value")
_KIND_FIELDS: dict[str, bytes] = {}  # kind -> its encoded field, built once per kind


def _encode_event(e: Event) -> bytes:
    """An ``Event``'s encoding. Steps and transfers (only the direct fields
    set: nearly all events) are written directly, three times faster than
    filling a message; the bytes parse to the same message."""
    if not EVENT.complete or EVENT.filled_values(e) != EVENT.filled_unset:
        m = pb.Event()
        wire_encode.fill_event(m, e)
        return m.SerializeToString()
    kind = _KIND_FIELDS.get(e.kind)
    if kind is None:
        kind = _KIND_FIELDS[e.kind] = _KIND + _string(e.kind) if e.kind else b""
    if e.value is None:
        return b"".join((_SEQ, _put_seq(e.seq), _TIME, _put_time(e.time_unix), kind))
    return b"".join((_SEQ, _put_seq(e.seq), _TIME, _put_time(e.time_unix), kind,
                     _VALUE, _put_value(e.value)))


# Sections (distributions, graphs) ------------------------------------------


EVENT_ENCODINGS_KEPT = 4_096  # events' encodings kept at most (the hook answers 1,000)


class PartCache:
    """Encoded distributions, graphs and events of the previous snapshot.

    The hook reuses the records of unchanged parts (:mod:`tpu_info.contract.reuse`)
    and keeps their order from one snapshot to the next, so encoding costs
    in proportion to what changed: unchanged parts are joined as bytes
    (protobuf's repeated fields are concatenations of their elements'
    encodings). Thread-safe: each call swaps in fresh state.
    """

    def __init__(self) -> None:
        self._sections: dict[bytes, tuple[tuple[object, ...], list[bytes]]] = {}
        self._events: dict[int, bytes] = {}  # by sequence number: events never change
        self._event_block: tuple[tuple[int, int, int], bytes] = ((0, 0, 0), b"")
        self._lock = threading.Lock()

    def encode(self, s: Snapshot, head: pb.Snapshot,
               stamp: wire_encode.Stamp | None = None) -> bytes:
        """``head`` (the snapshot without distributions, graphs and events)
        followed by the encoding of every distribution, graph and event; of
        a cursor's answer (``stamp``), only the records it carries, every
        encoding kept for the next answer."""
        skip = stamp.unchanged if stamp is not None else ()
        picks = {part: positions for part, _, positions in stamp.kept} if stamp else {}
        with self._lock:
            sections, old_events, old_block = self._sections, self._events, self._event_block
        chunks = [head.SerializeToString()]
        events = s.events
        # Sequence numbers are unique and events never change, so the same
        # first, last and count is the same run of events: one cached block.
        block_key = (len(events), events[0].seq, events[-1].seq) if events else (0, 0, 0)
        new_events = old_events
        if old_block[0] == block_key:
            block = old_block
        else:
            # Kept by number, across answers that carry different runs (a
            # cursor's few new events, then a full answer's thousand).
            parts = []
            for e in events:
                data = old_events.get(e.seq)
                if data is None:
                    body = _encode_event(e)
                    data = old_events[e.seq] = _EVENT_TAG + _varint(len(body)) + body
                parts.append(data)
            if len(old_events) > EVENT_ENCODINGS_KEPT:  # the older half goes, now and then
                new_events = dict(itertools.islice(old_events.items(),
                                                   len(old_events) - EVENT_ENCODINGS_KEPT // 2,
                                                   None))
            block = (block_key, b"".join(parts))
        chunks.append(block[1])
        new_sections = {}
        for tag, name, records, build in (
                (_DIST_TAG, "distributions", s.distributions, _encode_distribution),
                (_GRAPH_TAG, "graphs", s.graphs, _encode_graph)):
            if name in skip:
                if tag in sections:
                    new_sections[tag] = sections[tag]
                continue
            section = reuse.each(tuple(records), _framed(tag, build), sections.get(tag))
            new_sections[tag] = section
            picked = picks.get(name)
            chunks.extend(section[1] if picked is None else map(section[1].__getitem__, picked))
        with self._lock:
            self._sections, self._events, self._event_block = new_sections, new_events, block
        return b"".join(chunks)


def _framed(tag: bytes, build: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``build``'s encoding of a record with its field tag and length."""
    def encoded(r: Any) -> bytes:
        body = build(r)
        return tag + _varint(len(body)) + body
    return encoded


# Distributions -----------------------------------------------------------

_BUCKETS_TAG = DISTRIBUTION.tags["buckets"]


def _key_field(keys: Sequence[int], negative: bool) -> bytes:
    """The encoded key field of a bucket key list. The hook's own lists
    (StableKeys, never changed while alive: the reuse rule) carry their
    encoding with them, so most readings encode only their counts and
    nothing outlives the list; other lists (decoded ones) are encoded anew."""
    stable = type(keys) is StableKeys
    if stable:
        kept = getattr(keys, "encoded", None)
        if kept is not None and kept[0] is negative:
            return kept[1]
    m = pb.Buckets()
    (m.negative_keys if negative else m.positive_keys).extend(keys)
    data = m.SerializeToString()
    if stable:
        keys.encoded = (negative, data)  # type: ignore[attr-defined]
    return data


def _encode_distribution(d: DistributionReading) -> bytes:
    m = pb.Distribution()
    b = d.buckets
    if (b is None or not (DISTRIBUTION.complete and BUCKETS.complete)
            or not (isinstance(b.positive, SortedCounts)
                    and isinstance(b.negative, SortedCounts))):
        wire_encode.fill_distribution(m, d)
        return m.SerializeToString()
    # The hook's own reading: the buckets are written as their counts plus
    # the cached key fields (fields may come in any order on the wire).
    wire_encode.fill_distribution(m, d, buckets=False)
    counts = pb.Buckets()
    wire_encode.fill_buckets(counts, b, keys=False)
    body = b"".join((counts.SerializeToString(),
                     _key_field(b.positive.key_list, False) if b.positive else b"",
                     _key_field(b.negative.key_list, True) if b.negative else b""))
    return m.SerializeToString() + _BUCKETS_TAG + _varint(len(body)) + body


# Graphs ------------------------------------------------------------------

# Encoded identity and history of graphs (hash, name, engine, first seen,
# signatures, causes: the filled fields), by the identity of the hook's
# objects, which it keeps until the graph compiles again: an execution
# re-encodes only the counts. Twice the ledger's bound; about 2 MB at most.
_GRAPH_STATIC: reuse.ByIdentity[bytes] = reuse.ByIdentity(bound=4096)
# The counts' tags, in the plan's order (a field added to ``direct`` and not
# written below fails the unpacking here, and the field walk in the tests).
(_LAST_SEEN, _COMPILES, _SECONDS_TOTAL, _SECONDS_LAST, _HITS, _EXECUTIONS, _DEVICE_SECONDS,
 _DEVICE_SAMPLES) = (GRAPH.tags[n] for n in GRAPH.direct)
_put_float, _put_count = GRAPH.put("last_seen_unix"), GRAPH.put("compiles")


def _graph_static(g: GraphRecord) -> bytes:
    m = pb.Graph()
    wire_encode.fill_graph(m, g)
    for name in GRAPH.direct:
        m.ClearField(name)
    return m.SerializeToString()


def _encode_graph(g: GraphRecord) -> bytes:
    if not GRAPH.complete:
        m = pb.Graph()
        wire_encode.fill_graph(m, g)
        return m.SerializeToString()
    parts = [_GRAPH_STATIC.get(GRAPH.filled_values(g), lambda: _graph_static(g))]
    # The counts, written directly; unset ones left out, as protobuf does
    # (written one by one: a loop over the plan costs twice as much).
    if g.last_seen_unix:
        parts += (_LAST_SEEN, _put_float(g.last_seen_unix))
    if g.compiles:
        parts += (_COMPILES, _put_count(g.compiles))
    if g.compile_seconds_total:
        parts += (_SECONDS_TOTAL, _put_float(g.compile_seconds_total))
    if g.compile_seconds_last:
        parts += (_SECONDS_LAST, _put_float(g.compile_seconds_last))
    if g.cache_hits:
        parts += (_HITS, _put_count(g.cache_hits))
    if g.executions is not None:
        parts += (_EXECUTIONS, _put_count(g.executions))
    if g.device_seconds is not None:  # (optional: written when set, even at 0)
        parts += (_DEVICE_SECONDS, _put_float(g.device_seconds))
    if g.device_samples:
        parts += (_DEVICE_SAMPLES, _put_count(g.device_samples))
    return b"".join(parts)


def snapshot_to_bytes(s: Snapshot, cache: PartCache | None = None,
                      stamp: wire_encode.Stamp | None = None) -> bytes:
    """The encoded ``tpu_info.v1.Snapshot`` (what the server sends), with
    the answer's ``stamp`` (:mod:`tpu_info.wire.delta`; the parts it names
    unchanged are left out of ``s`` already).

    With ``cache`` (one per server), unchanged parts are not encoded again.
    """
    try:
        return _encode(s, cache, stamp)
    except UnicodeEncodeError:
        # A string from the OS with bytes that are not UTF-8 (a path's Latin-1
        # byte, as a lone surrogate): protobuf carries only valid text, so the
        # records holding one are made valid (os_text) and encoded again; the
        # others are the same objects, and their encodings are reused.
        return _encode(retexted(s), cache, retexted(stamp))


def _encode(s: Snapshot, cache: PartCache | None, stamp: wire_encode.Stamp | None) -> bytes:
    if cache is None or not SNAPSHOT.complete:
        return wire_encode.snapshot_to_proto(s, stamp).SerializeToString()
    return cache.encode(s, wire_encode.fill_head(s, stamp), stamp)


_T = TypeVar("_T")


def retexted(value: _T) -> _T:
    """``value`` (a record, or tuples, lists and maps of them) with every
    string made valid UTF-8 (:func:`tpu_info.contract.safe.os_text`); what
    holds none to change is returned as it is (the same object)."""
    result: _T = _retexted(value)
    return result


def _retexted(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return os_text(value)
    if isinstance(value, (tuple, list)):
        items = [_retexted(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        if kind is list:
            return items
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    if isinstance(value, dict):
        pairs = [(_retexted(k), _retexted(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
            return value
        return kind(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            if f.init:
                old = getattr(value, f.name)
                new = _retexted(old)
                if new is not old:
                    changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    return value
