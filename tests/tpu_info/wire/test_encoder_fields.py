"""The fast encoder and the plain codec agree on every field of every message.

The walk needs no list of fields: it takes them from the generated
descriptors, so a field added to ``tpu_info_v1.proto`` is walked the day it
is added, and the test fails until the model, the plain codec and the fast
path all carry it (docs/layout.md, "Changing it": a snapshot field end to end).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from tpu_info.contract.model import Event
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import encoder

ROOT = Path(__file__).resolve().parents[3]
# Fields the model does not hold by design: the server writes its own version.
NOT_IN_THE_MODEL = {"tpu_info.v1.Snapshot.protocol_version",
                    # One answer's stamp for cursors (tpu_info.wire.delta), not the program's.
                    "tpu_info.v1.Snapshot.instance", "tpu_info.v1.Snapshot.generation",
                    "tpu_info.v1.Snapshot.unchanged", "tpu_info.v1.Snapshot.kept",
                    "tpu_info.v1.Kept.part", "tpu_info.v1.Kept.keys"}


def _base() -> pb.Snapshot:
    """A valid snapshot with one of every message, every field left unset
    that the walk may set (so setting it is a change)."""
    m = pb.Snapshot(protocol_version=1, taken_at_unix=1_700_000_000.0, last_seq=10)
    m.process.pid = 1
    d = m.devices.add(id=1)
    d.memory.source = "none"
    m.counters.add(name="c", value=1, unit=pb.UNIT_NUMBER)
    dist = m.distributions.add(name="d", unit=pb.UNIT_NS, count=10, total=3.0)
    dist.buckets.gamma = 1.01
    dist.buckets.zero = 8
    dist.buckets.positive_keys.append(3)
    dist.buckets.positive_counts.append(1)
    dist.buckets.negative_keys.append(2)
    dist.buckets.negative_counts.append(1)
    dist.percentile_percents.append(50.0)
    dist.percentile_values.append(1.0)
    dist.recent_times_unix.append(1.0)
    dist.recent_values.append(1.0)
    series = dist.series  # one bucket of a whole-run series (room for the walk's 7 samples)
    series.width = 8
    for name in ("first_unix", "last_unix", "totals", "mins", "maxs"):
        getattr(series, name).append(1.0)
    series.counts.append(1)
    g = m.graphs.add(hash="ab" * 32)
    g.signatures.add().args.append("x: f32[1]")
    g.causes.add(time_unix=1.0, description="first call")
    m.events.add(seq=1, time_unix=1.0, kind="step")
    m.sites.add(kind="sync", location="t.py:1", count=1)
    m.steps.count = 1
    m.kept.add()  # a cursor's answer (not in the model)
    return m


def _walk(msg: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, descriptor) of every field of ``msg`` and of the messages in it."""
    for fd in msg.DESCRIPTOR.fields:
        yield path + (fd.name,), fd
        if fd.type == FD.TYPE_MESSAGE and not fd.message_type.GetOptions().map_entry:
            child = getattr(msg, fd.name)
            yield from _walk(child[0] if fd.is_repeated else child, path + (fd.name,))


def _at(msg: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        msg = getattr(msg, name)
        if hasattr(msg, "add"):  # a repeated message: its first element
            msg = msg[0]
    return msg


def _value(fd: Any) -> Any:
    """A valid value unlike the base's (and unlike every default)."""
    if fd.type == FD.TYPE_ENUM:
        return pb.UNIT_BYTES
    if fd.type == FD.TYPE_STRING:
        return f"s-{fd.name}"
    if fd.type == FD.TYPE_BOOL:
        return True
    if fd.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return 3.25
    return 7


def _set(m: pb.Snapshot, path: tuple[str, ...], fd: Any) -> Any:
    """Sets the field at ``path`` in ``m``, keeping the snapshot valid;
    returns the value the field must carry through a round trip."""
    owner = _at(m, path[:-1])
    name = path[-1]
    if fd.type == FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
        getattr(owner, name)["k"] = "v"
        return {"k": "v"}
    if fd.type == FD.TYPE_MESSAGE:
        # Already present in the base: the walk sets its fields one by one.
        # Here a second element (or the present one) travels unchanged.
        return None
    value = _value(fd)
    if fd.is_repeated:
        field = getattr(owner, name)
        del field[:]
        field.append(value)
        value = [value]
    else:
        setattr(owner, name, value)
    dist = m.distributions[0]
    b = dist.buckets
    if path[:2] == ("distributions", "series"):
        # A valid series: each max at least its min, each last time at least its first.
        sr = dist.series
        sr.maxs[0] = max(sr.maxs[0], sr.mins[0])
        sr.last_unix[0] = max(sr.last_unix[0], sr.first_unix[0])
    if path[:2] == ("distributions", "buckets") or path == ("distributions", "count"):
        # The count must be what the buckets hold: whichever moved, the other follows.
        held = sum(b.positive_counts) + sum(b.negative_counts)
        if path == ("distributions", "count"):
            b.zero = dist.count - held
        else:
            dist.count = held + b.zero
    return value


FIELDS = [(p, fd) for p, fd in _walk(_base())]


def test_the_walk_reaches_every_message_of_the_snapshot() -> None:
    messages = {fd.containing_type.full_name for _, fd in FIELDS}
    assert {m.full_name for m in (pb.Snapshot.DESCRIPTOR, pb.Event.DESCRIPTOR,
                                  pb.Graph.DESCRIPTOR, pb.RecompileCause.DESCRIPTOR,
                                  pb.Signature.DESCRIPTOR, pb.Distribution.DESCRIPTOR,
                                  pb.Buckets.DESCRIPTOR, pb.Process.DESCRIPTOR,
                                  pb.Device.DESCRIPTOR, pb.Memory.DESCRIPTOR,
                                  pb.Counter.DESCRIPTOR, pb.Site.DESCRIPTOR,
                                  pb.Steps.DESCRIPTOR)} <= messages
    assert len(FIELDS) > 90


@pytest.mark.parametrize("path,fd", FIELDS, ids=[".".join(p) for p, _ in FIELDS])
def test_fast_path_and_plain_codec_agree_on_every_field(path: tuple[str, ...], fd: Any) -> None:
    """Each field set alone: the model holds it, the plain codec and the fast
    path (fresh, and with a part cache warmed on the base) write it alike."""
    m = _base()
    cache = encoder.PartCache()
    warm = _base()
    del warm.events[:]  # a sequence number names one event for good: none is reused here
    encoder.snapshot_to_bytes(wire.snapshot_from_proto(warm), cache)
    want = _set(m, path, fd)
    s = wire.snapshot_from_proto(m)
    plain = wire.snapshot_to_proto(s)
    for label, fast in (("fresh", encoder.snapshot_to_bytes(s, encoder.PartCache())),
                        ("cached", encoder.snapshot_to_bytes(s, cache)),
                        ("cached again", encoder.snapshot_to_bytes(s, cache))):
        got = pb.Snapshot.FromString(fast)
        assert got == plain, f"{'.'.join(path)} ({label}): fast {got} != plain {plain}"
    if want is None or fd.full_name in NOT_IN_THE_MODEL:
        return
    carried = getattr(_at(plain, path[:-1]), path[-1])
    carried = dict(carried) if isinstance(want, dict) else list(carried) if isinstance(
        want, list) else carried
    assert carried == want, f"{'.'.join(path)} is lost on the way model -> wire"


def test_every_plan_names_every_field_of_its_message() -> None:
    """A field the fast path neither writes nor leaves to the plain codec is
    one it would drop: each plan must name all of its message's fields."""
    planned = {p.message.DESCRIPTOR.full_name for p in encoder.PLANS}
    assert planned == {"tpu_info.v1.Snapshot", "tpu_info.v1.Event", "tpu_info.v1.Graph",
                       "tpu_info.v1.Distribution", "tpu_info.v1.Buckets"}
    for plan in encoder.PLANS:
        fields = set(plan.message.DESCRIPTOR.fields_by_name)
        assert set(plan.direct) | set(plan.filled) == fields, (
            f"{plan.message.DESCRIPTOR.full_name}: the fast path does not carry "
            f"{sorted(plan.missing)}; name it in encoder.py's plan")
        assert not set(plan.direct) & set(plan.filled)
        for name in plan.direct:  # tags as the descriptor says
            fd = plan.message.DESCRIPTOR.fields_by_name[name]
            assert plan.tags[name][0] >> 3 == fd.number or fd.number > 15


def test_a_field_the_plan_does_not_name_goes_through_the_plain_codec(monkeypatch) -> None:
    """What a field added to Event would meet before its plan names it: the
    plan is incomplete, and events are then written whole by the plain codec,
    so the new field is not dropped."""
    short = encoder.FastFields(pb.Event, direct=("seq", "time_unix", "kind"),
                               filled=("name", "graph_hash", "detail", "location"))
    assert not short.complete and "value" in short.missing
    monkeypatch.setattr(encoder, "EVENT", short)
    e = Event(3, 1.0, "step", value=2.5)
    assert pb.Event.FromString(encoder._encode_event(e)).value == 2.5
    with pytest.raises(ValueError, match="no field"):
        encoder.FastFields(pb.Event, direct=("seq", "renamed"), filled=())


def test_the_fast_path_uses_no_private_name_of_the_codec_and_no_literal_tag() -> None:
    src = (ROOT / "tpu_info" / "wire" / "encoder.py").read_text()
    assert not re.search(r"from tpu_info\.wire\w* import .*\b_\w+", src)
    assert not re.search(r"\bwire\w*\._[a-z]", src)
    assert not re.search(r'b"\\x[0-9a-f]{2}"', src), "a literal field tag"
