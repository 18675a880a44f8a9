"""The one rule for reuse (tpu_info.contract.reuse), tested once for every producer:
a record that did not change is the same object, a changed one is new."""

from __future__ import annotations

import gc

import pytest

from metrics.recording.dense import DenseCounts
from metrics.recording.events import EventLog
from metrics.recording.graphs import GraphLedger
from metrics.recording.recorder import Recorder
from metrics.recording.registry import Counter, Distribution, Registry
from metrics.recording.snapshot import build
from tpu_info.contract import reuse
from tpu_info.contract.model import RecompileCause, Unit
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import encoder


def test_kept_hands_out_the_same_object_while_the_version_stays() -> None:
    kept: reuse.Kept[list[int]] = reuse.Kept()
    assert kept.at(0) is None and kept.peek() is None
    a = kept.get(1, lambda: [1])
    assert kept.get(1, lambda: [2]) is a and kept.at(1) is a and kept.at(2) is None
    b = kept.get(2, lambda: [1])
    assert b is not a and b == a and kept.peek() is b
    kept.forget()
    assert kept.get(2, lambda: [3]) == [3]
    assert kept.put(None, [4]) == [4] and kept.at(None) == [4]  # None is a version too


def test_by_identity_holds_what_it_derived_from_and_stays_bounded() -> None:
    memo: reuse.ByIdentity[int] = reuse.ByIdentity(bound=3)
    calls = []

    def derive(obj: object) -> int:
        calls.append(obj)
        return len(calls)

    x, y = ["x"], ["y"]
    assert memo.get((x, y), lambda: derive("x")) == 1
    assert memo.get((x, y), lambda: derive("x")) == 1 and len(calls) == 1
    assert memo.get((y, x), lambda: derive("y")) == 2  # another combination
    # An equal but different object is another object: derived anew.
    assert memo.get((["x"], y), lambda: derive("x")) == 3
    # The memo holds its objects, so a new one can never take a kept one's id.
    ids = {id(x), id(y)}
    x = y = None
    gc.collect()
    held = {id(o) for objects, _ in memo._kept.values() for o in objects}
    assert ids <= held
    for _ in range(5):
        memo.get((object(),), lambda: 0)
    assert len(memo) <= 3


def test_each_derives_only_for_records_that_are_new_objects() -> None:
    a, b, c = ["a"], ["b"], ["c"]
    seen: list[object] = []

    def derive(r: object) -> str:
        seen.append(r)
        return f"enc{r}"

    last = reuse.each((a, b), derive, None)
    assert seen == [a, b]
    seen.clear()
    last = reuse.each((a, ["b"]), derive, last)  # same positions, one new object
    assert len(seen) == 1 and seen[0] is not b and last[1] == ["enc['a']", "enc['b']"]
    seen.clear()
    last = reuse.each((c, a, b), derive, last)  # moved and added: matched by identity
    assert seen == [c, b]  # b left in the previous round: nothing is kept for it


def test_counter_reading() -> None:
    c = Counter("c")
    c.inc()
    r = c.reading()
    assert c.reading() is r
    c.inc(2)
    assert c.reading() is not r and c.reading().value == 3


def test_distribution_reading() -> None:
    d = Distribution("d", Unit.TIME_NS)
    d.observe(1.0)
    r = d.reading(0.0)
    assert d.reading(0.0) is r
    d.observe(2.0)
    r2 = d.reading(0.0)
    assert r2 is not r and r2.count == 2 and d.reading(0.0) is r2
    assert d.reading(5.0) is not r2  # another clock offset: another record
    d.reset()
    assert d.reading(0.0).count == 0


def test_registry_snapshot_parts() -> None:
    reg = Registry()
    reg.counter("a").inc()
    reg.counter("b").inc()
    reg.distribution("x").observe(1.0)
    reg.distribution("y").observe(1.0)
    counters, dists = reg.snapshot()
    reg.counter("b").inc()
    reg.distribution("y").observe(2.0)
    counters2, dists2 = reg.snapshot()
    assert counters2[0] is counters[0] and counters2[1] is not counters[1]
    assert dists2[0] is dists[0] and dists2[1] is not dists[1]
    reg.counter("c").inc()  # a new name: sorted again, the others kept
    assert reg.snapshot()[0][0] is counters[0]


@pytest.mark.parametrize("with_numpy", [False, True])
def test_dense_key_lists(with_numpy: bool) -> None:
    np = pytest.importorskip("numpy") if with_numpy else None
    d = DenseCounts()
    d.add_keys([3, 5])
    keys, _ = d.filled(np)
    d.add_keys([3, 5, 5])  # no bucket filled for the first time
    assert d.filled(np)[0] is keys
    d.add_keys([4])
    assert d.filled(np)[0] is not keys and list(d.filled(np)[0]) == [3, 4, 5]


def test_graph_ledger_records_and_their_history() -> None:
    ledger = GraphLedger()
    cause = RecompileCause(1.0, "first call")
    ledger.compiled("a", "f", "jax", 0.1, ("x",), cause)
    ledger.compiled("b", "g", "jax", 0.1, ("y",), cause)
    snap = ledger.snapshot()
    assert ledger.snapshot() is snap
    ledger.executed("a", "f", "jax")
    snap2 = ledger.snapshot()
    assert snap2 is not snap and snap2[1] is snap[1] and snap2[0] is not snap[0]
    # An execution changes the counts only: the history tuples are the same objects.
    assert snap2[0].signatures is snap[0].signatures and snap2[0].causes is snap[0].causes
    ledger.compiled("a", "f", "jax", 0.1, ("z",), cause)
    snap3 = ledger.snapshot()
    assert snap3[0].signatures is not snap2[0].signatures and snap3[1] is snap[1]
    ledger.clear()
    assert ledger.snapshot() == ()


def test_event_log_answers() -> None:
    log = EventLog(capacity=100)
    log.emit("compile", name="f")
    log.emit("step", value=1.0)
    events, _ = log.since(0)
    assert log.since(0)[0] is events
    log.emit("step", value=2.0)
    again, _ = log.since(0)
    assert again is not events and again[:2] == events and again[0] is events[0]


def test_decoded_parts() -> None:
    rec = Recorder()
    rec.ledger.compiled("a" * 64, "f", "jax", 0.1, ("x",))
    rec.ledger.compiled("b" * 64, "g", "jax", 0.1, ("y",))
    rec.registry.distribution("D").observe(1.0)
    cache = wire.DecodeCache()

    def decoded():
        data = encoder.snapshot_to_bytes(build(rec, (), 0))
        return wire.snapshot_from_proto(pb.Snapshot.FromString(data), cache)

    s1 = decoded()
    rec.ledger.executed("b" * 64, "g", "jax")
    s2 = decoded()
    assert s2.graphs[0] is s1.graphs[0] and s2.graphs[1] is not s1.graphs[1]
    assert s2.distributions[0] is s1.distributions[0]


def test_the_encoder_encodes_only_what_is_a_new_object(monkeypatch) -> None:
    """The consumer side, end to end: a snapshot of a recorder where one
    graph executed re-encodes that graph only."""
    rec = Recorder()
    for i in range(5):
        rec.ledger.compiled(f"{i:064x}", "f", "jax", 0.1, ("x",))
    cache = encoder.PartCache()
    encoder.snapshot_to_bytes(build(rec, (), 0), cache)
    encoded = []
    real = encoder._encode_graph
    monkeypatch.setattr(encoder, "_encode_graph", lambda g: encoded.append(g.hash) or real(g))
    rec.ledger.executed(f"{3:064x}", "f", "jax")
    encoder.snapshot_to_bytes(build(rec, (), 0), cache)
    assert encoded == [f"{3:064x}"]


def test_graph_ledger_snapshot_made_in_part_equals_one_made_whole() -> None:
    """The ledger re-makes only changed entries' records; through compiles,
    hits, executions, evictions and clears it equals a whole rebuild."""
    import random

    rng = random.Random(5)
    ledger = GraphLedger(max_graphs=6)
    for step in range(400):
        h = f"{rng.randrange(10):x}"
        op = rng.random()
        if op < 0.2:
            ledger.compiled(h, "f", "jax", 0.1, (f"x{step % 3}",))
        elif op < 0.3:
            ledger.cache_hit(h, "f", "jax")
        elif op < 0.995:
            ledger.executed(h, "f", "jax")
        else:
            ledger.clear()
        if rng.random() < 0.3:
            got = ledger.snapshot()
            assert got == tuple(e.record() for e in ledger._first_seen.values())
            assert [g.hash for g in got] == list(ledger._first_seen)
