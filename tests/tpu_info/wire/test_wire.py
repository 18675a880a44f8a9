"""model <-> tpu_info.v1 conversion: lossless both ways, invalid data rejected."""

from __future__ import annotations

import pytest

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
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.contract.series import RunSeries
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import encoder
from tpu_info.wire import fillers as wire_encode

FULL = Snapshot(
    taken_at_unix=1_700_000_000.25,
    process=ProcessRecord(pid=42, name="train.py", argv=("train.py", "--x"), host="h",
                          user="u", engine="jax", versions={"jax": "0.10.2"},
                          start_time_unix=1_699_999_000.0, process_index=3, process_count=8,
                          process_index_source="jax"),
    devices=(
        DeviceRecord(0, "TPU v5e", "tpu", MemoryReading(1, 2, 3, "memory_stats"), 55.5),
        DeviceRecord(1, "cpu", "cpu", MemoryReading(None, source="none", reason="no stats"),
                     None, "not measured"),
    ),
    counters=(CounterReading("MarkStep", 7, Unit.NUMBER, "steps"),),
    distributions=(
        DistributionReading(
            "CompileTime", Unit.TIME_NS, 6, 6e6, -1e6, 3e6, 0.5, 3e6,
            percentiles=((50.0, 2e6), (99.0, 3e6)), recent=((1.0, 1e6), (2.0, 2e6)),
            buckets=BucketCounts(1.01, {1389: 1, 1430: 2}, {5: 1}, 2), help="compile",
            series=RunSeries(4, [1.0, 1.5], [1.4, 2.0], [4, 2], [4e6, 2e6], [-1e6, 1e6],
                             [3e6, 1e6])),
        DistributionReading("Empty", Unit.BYTES, 0, 0.0, None, None),
    ),
    graphs=(GraphRecord(
        hash="ab" * 32, name="jit(f)", engine="jax", first_seen_unix=1.0, last_seen_unix=2.0,
        compiles=2, compile_seconds_total=0.5, compile_seconds_last=0.2, cache_hits=1,
        executions=None, signature=("x: f32[2]",), signatures=(("x: f32[1]",), ("x: f32[2]",)),
        causes=(RecompileCause(1.5, "x changed", "a.py:3", "x", "f32[1]", "f32[2]"),
                RecompileCause(1.0, "first call")), loop_line="/w/a.py:66", loop_ops=400,
    ),),
    events=(Event(4, 1.0, "compile", "jit(f)", "ab", "d", "a.py:3", 0.5),
            Event(5, 2.0, "step")),
    last_seq=5,
    uptime_seconds=1000.25,
    sites=(SiteReading("sync", "/w/train.py:88", 120, 480, 0.002, "train", "float()", 3.0),
           SiteReading("implicit_to_device", "/w/train.py:80", 60, 1 << 20, 0.01)),
    steps=StepsReading(60, "inferred", "jit(step): most time", 12.5),
    blind_spots=("np.asarray(x) on CPU",),
)


def test_full_round_trip_is_lossless() -> None:
    msg = wire.snapshot_to_proto(FULL)
    again = pb.Snapshot.FromString(msg.SerializeToString())
    assert wire.snapshot_from_proto(again) == FULL


def test_rank_travels_and_a_wild_one_is_kept_out() -> None:
    msg = wire.snapshot_to_proto(FULL)
    unset = pb.Snapshot.FromString(msg.SerializeToString())
    unset.process.ClearField("process_index")
    assert wire.snapshot_from_proto(unset).process.process_index is None
    msg.process.process_index = -1
    snap = wire.snapshot_from_proto(msg)
    assert snap.process.process_index is None and snap.process.process_count == 8
    assert any("process_index" in where for where, _ in snap.left_out)


def test_recent_samples_read_like_a_tuple_of_pairs() -> None:
    pairs = ((1.0, 10.0), (2.0, 20.0), (3.0, 30.0))
    s = Samples.of(pairs)
    assert s == pairs and pairs == s and s == Samples(*zip(*pairs, strict=True))
    assert s != pairs[:2] and s != "abc" and hash(s) == hash(pairs)
    assert s[1] == (2.0, 20.0) and s[-1] == (3.0, 30.0) and s[1:] == pairs[1:]
    assert list(s) == list(pairs) and len(s) == 3 and not Samples()
    with pytest.raises(ValueError):
        Samples([1.0], [])
    decoded = wire.snapshot_from_proto(_msg()).distributions[0].recent
    assert type(decoded) is Samples and decoded == FULL.distributions[0].recent


def test_metric_infos_round_trip() -> None:
    infos = [MetricInfo("A", "counter", Unit.NUMBER, "a"), MetricInfo("B", "distribution",
                                                                     Unit.TIME_NS)]
    assert wire.metric_infos_from_proto(wire.metric_infos_to_proto(infos)) == infos


def _msg() -> pb.Snapshot:
    return wire.snapshot_to_proto(FULL)


@pytest.mark.parametrize("break_it, error", [
    (lambda m: m.ClearField("protocol_version"), ProtocolMismatch),
    (lambda m: setattr(m.counters[0], "unit", 99), WireError),
    (lambda m: setattr(m.counters[0], "value", -1), WireError),
    (lambda m: m.distributions[0].percentile_values.append(1.0), WireError),
    (lambda m: m.distributions[0].recent_values.append(1.0), WireError),
    (lambda m: m.distributions[0].series.maxs.append(1.0), WireError),
    (lambda m: m.distributions[0].buckets.positive_keys.append(9), WireError),
    (lambda m: setattr(m.distributions[0].buckets, "gamma", 1.0), WireError),
    (lambda m: setattr(m.distributions[0], "count", 99), WireError),
    (lambda m: setattr(m.distributions[0], "min", 1e9), WireError),
    (lambda m: setattr(m.devices[0].memory, "used_bytes", -5), WireError),
    (lambda m: setattr(m.events[0], "seq", 9), WireError),
    (lambda m: setattr(m, "last_seq", 1), WireError),
    (lambda m: setattr(m.graphs[0], "hash", ""), WireError),
])
def test_invalid_data_is_a_typed_error(break_it, error) -> None:
    m = _msg()
    break_it(m)
    with pytest.raises(error):
        wire.snapshot_from_proto(m)


def test_unknown_kind_in_list_metrics() -> None:
    reply = wire.metric_infos_to_proto([MetricInfo("A", "counter", Unit.NUMBER)])
    reply.metrics[0].kind = "histogram"
    with pytest.raises(WireError):
        wire.metric_infos_from_proto(reply)


def test_part_cache_encodes_what_the_proto_would_as_the_program_runs():
    # The server joins cached encodings of unchanged parts; after every kind
    # of change the bytes must decode to the same message as a fresh encoding.
    import random

    from metrics.recording.recorder import Recorder
    from metrics.recording.snapshot import build

    rng = random.Random(11)
    rec = Recorder()
    cache = encoder.PartCache()
    for rnd in range(12):
        for i in rng.sample(range(30), 6):
            rec.registry.distribution(f"D{i}", Unit.TIME_NS).observe(rng.lognormvariate(10, 2))
            rec.registry.distribution(f"N{i}").observe(-rng.random() if i % 2 else 0.0)
        for i in rng.sample(range(40), 5):
            rec.ledger.compiled(f"{i:064x}", f"jit(f{i})", "jax", seconds=rng.random(),
                                signature=(f"x: f32[{rnd}]",))
            rec.ledger.executed(f"{i:064x}", f"jit(f{i})", "jax")
        for _ in range(rng.choice([0, 3])):
            rec.events.emit("step", value=float(rnd))
        s = build(rec, (), events_since=rng.choice([0, rec.events.last_seq - 2]))
        got = pb.Snapshot.FromString(encoder.snapshot_to_bytes(s, cache))
        assert got == wire.snapshot_to_proto(s)
        assert wire.snapshot_from_proto(got) == wire.snapshot_from_proto(wire.snapshot_to_proto(s))


def test_events_written_directly_parse_like_filled_messages():
    import random

    rng = random.Random(2)
    kinds = ["step", "transfer_to_device", "compile", ""]
    events = [Event(rng.choice([1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**63]),
                    rng.choice([0.0, 1.7e9, -3.5]), rng.choice(kinds),
                    value=rng.choice([None, 0.0, -1.0, 4096.0])) for _ in range(300)]
    events.append(Event(3, 1.0, "recompile", "jit(f)", "ab12", "x changed", "t.py:3", 0.5))
    for e in events:
        filled = pb.Event()
        wire_encode.fill_event(filled, e)
        assert pb.Event.FromString(encoder._encode_event(e)) == filled, e


def test_graphs_written_from_cached_history_parse_like_filled_messages():
    import random

    rng = random.Random(4)
    causes = (RecompileCause(1.0, "x changed", "t.py:3", "x", "f32[2]", "f32[3]"),
              RecompileCause(2.0, "first compile"))
    for i in range(200):
        g = GraphRecord(
            hash=f"{i % 7:064x}", name=rng.choice(["jit(f)", "", "fwd"]), engine="jax",
            first_seen_unix=rng.choice([0.0, 1.7e9]), last_seen_unix=rng.choice([0.0, 1.7e9 + i]),
            compiles=rng.choice([0, 1, 300]), compile_seconds_total=rng.choice([0.0, 1.5]),
            compile_seconds_last=rng.choice([0.0, 0.25]), cache_hits=rng.choice([0, 2**40]),
            executions=rng.choice([None, 0, 7, 2**63 - 1]),
            signature=rng.choice([(), ("x: f32[2]",)]),
            signatures=rng.choice([(), (("x: f32[2]",), ("x: f32[3]", "y: i32[]"))]),
            causes=rng.choice([(), causes]))
        filled = pb.Graph()
        wire_encode.fill_graph(filled, g)
        assert pb.Graph.FromString(encoder._encode_graph(g)) == filled, g


def test_bucket_keys_in_value_order_decode_without_a_dict():
    from tpu_info.contract.buckets import SortedCounts

    def decoded(pos_keys: list[int], neg_keys: list[int]) -> BucketCounts:
        m = pb.Buckets(gamma=1.01, positive_keys=pos_keys, positive_counts=[1] * len(pos_keys),
                       negative_keys=neg_keys, negative_counts=[2] * len(neg_keys))
        return wire._buckets(m, "test")

    b = decoded([1, 5, 9], [7, 3])  # as the hook sends them
    assert isinstance(b.positive, SortedCounts) and isinstance(b.negative, SortedCounts)
    assert b.positive == {1: 1, 5: 1, 9: 1} and b.negative == {7: 2, 3: 2}
    other = decoded([9, 1, 5], [3, 7])  # another order: a dict, the same counts
    assert type(other.positive) is dict and other.positive == b.positive
    assert other.negative == b.negative
    with pytest.raises(WireError, match="appears twice"):
        decoded([1, 1, 2], [])
    with pytest.raises(WireError, match="appears twice"):
        decoded([], [4, 4])


def test_encoder_keeps_key_fields_on_the_hooks_lists_only():
    """The hook's key lists carry their encoding (it lives and dies with the
    list); decoded lists, new with every snapshot the helper re-encodes 10
    times a second, are encoded anew and keep nothing (keeping them by
    identity once grew the helper by 8 MB)."""
    from metrics.recording.registry import Distribution

    d = Distribution("x")
    for v in (1.0, 10.0, 100.0):
        d.observe(v)
    reading = d.reading(0.0)
    keys = reading.buckets.positive.key_list
    data = encoder._encode_distribution(reading)
    assert keys.encoded[1] and encoder._encode_distribution(reading) == data
    for _ in range(3):
        decoded = wire._distribution(pb.Distribution.FromString(data), wire.Decoding())
        assert type(decoded.buckets.positive.key_list) is list  # nothing can stick to it
        again = encoder._encode_distribution(decoded)
        assert pb.Distribution.FromString(again) == pb.Distribution.FromString(data)


def test_decode_cache_reuses_unchanged_parts_and_decodes_the_same() -> None:
    """A source's next snapshot decoded with the cache equals a plain decode;
    parts whose bytes did not change are the very records decoded before
    (so the helper's encoder reuses their bytes too), changed ones are new."""
    import random
    import time

    from metrics.recording.recorder import Recorder
    from metrics.recording.snapshot import build

    rng = random.Random(2)
    rec = Recorder()
    dists = [rec.registry.distribution(f"D{i}", Unit.TIME_NS) for i in range(5)]
    for i in range(20):
        rec.ledger.compiled(f"{i:064x}", f"jit(f{i})", "jax", seconds=0.1,
                            signature=("x: f32[8]",),
                            cause=RecompileCause(time.time(), "x changed", f"t.py:{i}"))
    cache = wire.DecodeCache()
    previous = None
    for _ in range(5):
        observed = rng.sample(dists, 2)
        for d in observed:
            d.observe(rng.lognormvariate(10, 1))
        changed = {f"{i:064x}" for i in rng.sample(range(20), 3)}
        for h in changed:
            rec.ledger.executed(h, "jit(f)", "jax")
        rec.events.emit("step", value=1.0)
        msg = pb.Snapshot.FromString(encoder.snapshot_to_bytes(build(rec, (), 0)))
        got = wire.snapshot_from_proto(msg, cache)
        assert got == wire.snapshot_from_proto(msg)
        if previous is not None:
            before = {g.hash: g for g in previous.graphs}
            for g in got.graphs:
                assert (g is before[g.hash]) == (g.hash not in changed), g.hash
            kept = {d.name: d for d in previous.distributions}
            moved = {d.name for d in observed}
            for d in got.distributions:
                if d.name in kept:
                    assert (d is kept[d.name]) == (d.name not in moved), d.name
            assert got.events[0] is previous.events[0]
        previous = got


def test_decode_cache_keeps_nothing_from_an_invalid_snapshot() -> None:
    cache = wire.DecodeCache()
    good = _msg()
    first = wire.snapshot_from_proto(good, cache)
    bad = _msg()
    bad.events[0].seq = 9  # after the next event: out of order
    with pytest.raises(WireError):
        wire.snapshot_from_proto(bad, cache)
    again = wire.snapshot_from_proto(good, cache)
    assert again == FULL and again.graphs[0] is first.graphs[0]


def test_diagnosis_sections_travel_by_both_encoders_and_are_validated() -> None:
    """Sites, steps and blind spots ride in the snapshot's head: the fast
    encoder writes them as the proto does, and bad numbers are kept out."""
    assert wire.snapshot_from_proto(pb.Snapshot.FromString(
        encoder.snapshot_to_bytes(FULL, encoder.PartCache()))) == FULL
    msg = wire.snapshot_to_proto(FULL)
    msg.sites[0].seconds = float("nan")
    msg.steps.seconds_total = float("inf")
    msg.sites[1].detail = "x\x1b[2Jy"
    got = wire.snapshot_from_proto(msg)
    assert got.sites[0].seconds == 0.0 and got.steps.seconds_total is None
    assert "\x1b" not in got.sites[1].detail
    assert {w for w, _ in got.left_out} >= {"site '/w/train.py:88' seconds", "steps seconds_total"}
    plain = wire.snapshot_from_proto(wire.snapshot_to_proto(Snapshot(taken_at_unix=1.0)))
    assert plain.steps is None and plain.sites == () and plain.blind_spots == ()


def test_a_snapshot_without_a_whole_run_series_reads_as_before() -> None:
    """An older hook's answer (or saved run) has no series: None, and the
    rest of the distribution as it was."""
    m = _msg()
    m.distributions[0].ClearField("series")
    d = wire.snapshot_from_proto(m).distributions[0]
    assert d.series is None and d.count == 6 and len(d.recent) == 2


@pytest.mark.parametrize("spoil, why", [
    (lambda r: r.maxs.__setitem__(0, float("nan")), "not a finite number"),
    (lambda r: r.counts.__setitem__(0, 5), "do not add up"),  # more than its width
    (lambda r: r.counts.__setitem__(1, 4), "do not add up"),  # 8 samples of a count of 6
    (lambda r: r.mins.__setitem__(1, 9e9), "min is above its max"),
    (lambda r: setattr(r, "width", 0), "bucket width 0"),
    (lambda r: [r.counts.append(1) or r.first_unix.append(2.0) or r.last_unix.append(2.0)
                or r.totals.append(1.0) or r.mins.append(1.0) or r.maxs.append(1.0)
                for _ in range(wire.MAX_SERIES)], "more than the 1,024"),
])
def test_a_series_that_does_not_add_up_is_left_out_with_its_reason(spoil, why) -> None:
    m = _msg()
    spoil(m.distributions[0].series)
    s = wire.snapshot_from_proto(m)
    assert s.distributions[0].series is None and s.distributions[0].count == 6
    assert any(w == "distribution CompileTime series" and why in r for w, r in s.left_out), \
        s.left_out
