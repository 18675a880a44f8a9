from __future__ import annotations

from metrics.recording.events import EventLog
from metrics.recording.graphs import GraphLedger
from tpu_info.contract.model import RecompileCause


def test_ledger_counts_and_history():
    t = iter(range(100))
    ledger = GraphLedger(clock=lambda: float(next(t)))
    cause = RecompileCause(0.0, "argument 'x' changed f32[2] -> f32[3]", "a.py:1", "x")
    ledger.compiled("h1", "jit(f)", "jax", 0.5, ("x: f32[2]",))
    ledger.compiled("h1", "jit(f)", "jax", 0.25, ("x: f32[3]",), cause)
    ledger.cache_hit("h1", "jit(f)", "jax")
    ledger.executed("h1", "jit(f)", "jax", 3)
    (g,) = ledger.snapshot()
    assert (g.compiles, g.cache_hits, g.executions) == (2, 1, 3)
    assert g.compile_seconds_total == 0.75 and g.compile_seconds_last == 0.25
    assert g.signature == ("x: f32[3]",)
    assert g.signatures == (("x: f32[2]",), ("x: f32[3]",))
    assert g.causes == (cause,)
    assert g.first_seen_unix == 0.0 and g.last_seen_unix == 3.0


def test_ledger_evicts_least_recently_seen():
    ledger = GraphLedger(max_graphs=3)
    for h in ("a", "b", "c"):
        ledger.compiled(h, h, "jax", 0.1)
    ledger.executed("a", "a", "jax")  # a is now the most recent
    ledger.compiled("d", "d", "jax", 0.1)
    # b (seen least recently) went; snapshots list graphs in the order first seen.
    assert [g.hash for g in ledger.snapshot()] == ["a", "c", "d"]
    assert ledger.evicted == 1 and len(ledger) == 3


def test_ledger_bounds_causes_per_graph():
    ledger = GraphLedger(max_causes=4)
    for i in range(10):
        ledger.compiled("h", "f", "jax", 0.1, cause=RecompileCause(float(i), f"c{i}"))
    assert [c.description for c in ledger.snapshot()[0].causes] == ["c6", "c7", "c8", "c9"]


def test_events_since_and_drops():
    log = EventLog(capacity=5)
    for i in range(8):
        assert log.emit("step", value=float(i)) == i + 1
    events, dropped = log.since(0)
    assert [e.seq for e in events] == [4, 5, 6, 7, 8]
    events, dropped = log.since(2)
    assert [e.seq for e in events] == [4, 5, 6, 7, 8] and dropped == 1
    events, dropped = log.since(6)
    assert [e.seq for e in events] == [7, 8] and dropped == 0
    assert log.since(8) == ((), 0)
    assert log.last_seq == 8
    events, _ = log.since(0, limit=2)
    assert [e.seq for e in events] == [7, 8]


def test_emit_many_keeps_sequence_numbers_contiguous_next_to_single_emits():
    import threading

    log = EventLog(capacity=100_000)
    stop = threading.Event()

    def single() -> None:  # another thread emitting one at a time meanwhile
        while not stop.is_set():
            log.emit("compile", name="f")

    t = threading.Thread(target=single)
    t.start()
    try:
        for i in range(200):
            log.emit_many("step", [float(i)] * 50, [float(j) for j in range(50)])
    finally:
        stop.set()
        t.join()
    events, dropped = log.since(0, limit=None)
    seqs = [e.seq for e in events]
    assert dropped == 0 and seqs == list(range(1, log.last_seq + 1))
    assert sum(e.kind == "step" for e in events) == 200 * 50
    # Asking from any point gives exactly what came after it.
    for cut in (1, 777, len(seqs) // 2, len(seqs) - 3):
        after, _ = log.since(cut, limit=None)
        assert [e.seq for e in after] == seqs[cut:]


def test_emit_many_with_a_kind_per_event_and_the_ring_bound():
    log = EventLog(capacity=5)
    log.emit_many(["a", "b", "a"], [1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    log.emit_many("c", [4.0, 5.0, 6.0])
    events, dropped = log.since(0)
    assert [(e.seq, e.kind, e.value) for e in events] == [
        (2, "b", 20.0), (3, "a", 30.0), (4, "c", None), (5, "c", None), (6, "c", None)]
    assert dropped == 1
    log.emit_many("d", [])
    assert log.last_seq == 6


def test_a_flood_of_steps_never_pushes_a_recompile_out():
    log = EventLog(capacity=1000)
    log.emit("compile", name="jit(f)")
    log.emit_many("step", [1.0] * 30_000)
    log.emit("recompile", name="jit(f)", detail="x changed")
    log.emit_many(["transfer_to_device", "transfer_from_device"] * 10_000, [2.0] * 20_000)
    events, dropped = log.since(0)
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["compile", "recompile"]  # the last 1000 frequent ones follow
    assert set(kinds[2:]) == {"transfer_to_device", "transfer_from_device"}
    assert len(events) == 1002 and dropped == 50_002 - 1002
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    # Cut to a few, the rare kinds stay and the newest frequent ones fill in.
    few, _ = log.since(0, limit=5)
    assert [e.kind for e in few] == ["compile", "recompile", "transfer_from_device",
                                     "transfer_to_device", "transfer_from_device"]
    assert log.since(0, limit=0) == ((), dropped)


def test_a_batch_makes_its_rows_once_and_only_when_read():
    asked: list[tuple[int, int, int]] = []

    def expand(first: int) -> list[tuple]:  # the whole batch of 4096
        lo, hi = 0, 4096
        asked.append((first, lo, hi))
        return [(first + i, float(i), "step", "", "", "", None, None) for i in range(lo, hi)]

    log = EventLog(capacity=1000)
    log.emit("compile", name="jit(f)")
    log.emit_batch(4096, expand)  # numbered 2..4097
    assert asked == []  # recording a batch makes no rows
    assert log.since(0, limit=0) == ((), 4097 - 1001)  # nor does an answer of none
    assert asked == []
    events, dropped = log.since(4090)
    assert [e.seq for e in events] == list(range(4091, 4098)) and dropped == 0
    assert asked == [(2, 0, 4096)]  # the first reader made the batch's rows, once
    # The ring holds the newest `capacity` of the batch: the rest count as dropped.
    events, dropped = log.since(1)
    assert len(events) == 1000 and events[0].seq == 3098 and dropped == 4096 - 1000
    assert [e.seq for e in log.since(0, limit=3)[0]] == [1, 4096, 4097]
    assert asked == [(2, 0, 4096)]  # later readers made none
    log.emit("step")  # a single event after the batch starts a chunk of its own
    assert [e.seq for e in log.since(4096)[0]] == [4097, 4098]


def test_batches_and_single_events_share_one_ring_and_one_numbering():
    def expand(first: int) -> list[tuple]:  # batches of 4
        lo, hi = 0, 4
        return [(first + i, 0.0, "transfer_to_device", "", "", "", None, float(i))
                for i in range(lo, hi)]

    log = EventLog(capacity=10)
    for _ in range(3):
        log.emit("step")
        log.emit_batch(4, expand)
        log.emit("recompile", name="jit(f)")
    events, dropped = log.since(0, limit=None)
    frequent = [e.seq for e in events if e.kind != "recompile"]
    # steps 1, 7, 13; batches 2-5, 8-11, 14-17: the newest 10 of those
    assert frequent == [7, 8, 9, 10, 11, 13, 14, 15, 16, 17]
    assert [e.seq for e in events if e.kind == "recompile"] == [6, 12, 18]
    assert dropped == 5 and log.last_seq == 18
    for cut in range(19):  # from any point: exactly what came after, in order
        after = [e.seq for e in log.since(cut)[0]]
        assert after == sorted(after) and all(s > cut for s in after)
    log.emit_batch(0, expand)
    assert log.last_seq == 18


def test_single_frequent_events_stay_bounded():
    log = EventLog(capacity=100)
    for i in range(5000):
        log.emit("step", value=float(i))
    events, dropped = log.since(0)
    assert [e.value for e in events] == [float(i) for i in range(4900, 5000)]
    assert dropped == 4900
    assert sum(len(c[3] or ()) for c in log._frequent) <= 100 + 1024


def test_a_mirror_keeps_the_numbers_it_is_given():
    source, mirror = EventLog(), EventLog()
    for i in range(5):
        source.emit("step", value=float(i))
    source.emit("compile", name="jit(f)")
    mirror.mirror(source.since(0)[0][:3])
    mirror.mirror(source.since(2)[0])  # overlaps: 3 is skipped
    assert [e.seq for e in mirror.since(0)[0]] == [1, 2, 3, 4, 5, 6]
    assert mirror.since(0)[0] == source.since(0)[0] and mirror.last_seq == 6
    assert mirror.since(4, limit=1)[0][0].kind == "compile"


def test_an_unchanged_ledger_hands_out_the_same_snapshot():
    ledger = GraphLedger()
    ledger.compiled("a", "jit(f)", "jax", 0.1)
    first = ledger.snapshot()
    assert ledger.snapshot() is first
    ledger.executed("a", "jit(f)", "jax", n=3)
    second = ledger.snapshot()
    assert second is not first and second[0].executions == 3
    ledger.clear()
    assert ledger.snapshot() == ()


def test_a_big_batch_of_ready_rows_holds_only_what_the_ring_keeps():
    log = EventLog(capacity=100)
    log.emit_many("step", [1.0] * 5000, [float(i) for i in range(5000)])
    assert sum(len(c[3]) for c in log._frequent) == 100
    events, dropped = log.since(0)
    assert [e.value for e in events] == [float(i) for i in range(4900, 5000)]
    assert dropped == 4900 and log.last_seq == 5000


def test_event_kinds_have_one_name_each():
    """Engines emit the contract's EventKind members; metrics.recording.events
    keeps no alias constants for them."""
    import re
    from pathlib import Path

    from metrics.recording import events
    from tpu_info.contract.model import EventKind

    assert not [k.name for k in EventKind if hasattr(events, k.name)]
    root = Path(__file__).resolve().parents[3] / "metrics"
    aliases = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
               for n, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"\bev\.[A-Z_]+\b", line)]
    assert not aliases, aliases
