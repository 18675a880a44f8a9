"""Answers that repeat nothing the reader has (:mod:`tpu_info.wire.delta`).

Real parts: the hook's recorder and gRPC server on loopback, our client,
and for the exporter real hooked processes; the raw replies are read with
the generated stub, to see what crossed the wire.
"""

from __future__ import annotations

import socket
import time

import pytest

from metrics.export.server import ANSWER_TTL_S, Server
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from tpu_info.contract.errors import WireError
from tpu_info.contract.model import EventKind, Snapshot, Unit
from tpu_info.net.client import Client, _with_cursor
from tpu_info.net.fanout import fan_out
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import delta


def _recorder(graphs: int = 10, tag: str = "") -> Recorder:
    rec = Recorder()
    for i in range(graphs):
        rec.ledger.compiled(f"{tag}{i:063x}", f"jit(f{i})", "jax", seconds=0.1,
                            signature=("x: f32[8]",))
    d = rec.registry.distribution("ExecuteTime", Unit.TIME_NS)
    for i in range(50):
        d.observe(1000.0 + i)
    for _ in range(20):
        rec.events.emit(EventKind.STEP, value=1.0)
    return rec


@pytest.fixture
def served():
    rec = _recorder()
    server = Server(lambda since: build(rec, (), since), port=0)
    port = server.start()
    yield rec, f"localhost:{port}"
    server.stop(grace=0)


def _next_build() -> None:
    time.sleep(ANSWER_TTL_S * 1.5)  # past the shared build: the next request builds anew


def _raw(client: Client, held: delta.Held | None) -> pb.Snapshot:
    return client._monitor.GetSnapshot(_with_cursor(pb.SnapshotRequest(), held), timeout=10)


def _same_parts(a: Snapshot, b: Snapshot) -> None:
    for name in delta.PARTS:
        assert getattr(a, name) == getattr(b, name), name
    assert [e.seq for e in a.events] == [e.seq for e in b.events]


def test_a_cursor_gets_only_new_events_and_no_unchanged_part(served) -> None:
    rec, target = served
    with Client(target, timeout=10) as c:
        first = c.follow()
        assert len(first.graphs) == 10 and len(first.events) == 20
        _next_build()
        rec.events.emit(EventKind.STEP, value=2.0)
        raw = _raw(c, c._follower.held)
        assert set(raw.unchanged) == set(delta.PARTS)  # nothing else changed
        assert [e.seq for e in raw.events] == [21]
        assert not raw.graphs and not raw.distributions and not raw.HasField("process")
        whole = c.follow()
        assert c._follower.held is not None and c._follower.held[1].unchanged
        _same_parts(whole, c.snapshot())  # the merge is what a full answer says

        _next_build()
        rec.ledger.executed(f"{3:063x}", "jit(f3)", "jax")
        rec.registry.distribution("ExecuteTime").observe(5000.0)
        raw = _raw(c, c._follower.held)
        assert "graphs" not in raw.unchanged and "distributions" not in raw.unchanged
        assert "process" in raw.unchanged and not raw.events
        # Record by record: only the graph and the distribution that changed.
        assert {k.part: len(k.keys) for k in raw.kept} == {"graphs": 10}  # one distribution: sent
        assert [g.hash for g in raw.graphs] == [f"{3:063x}"] and len(raw.distributions) == 1
        whole = c.follow()
        full = c.snapshot()
        _same_parts(whole, full)
        assert [g.executions for g in whole.graphs] == [g.executions for g in full.graphs]


def test_a_reader_without_cursor_gets_every_part(served) -> None:
    _, target = served
    with Client(target, timeout=10) as c:
        c.follow()
        _next_build()
        raw = c._monitor.GetSnapshot(pb.SnapshotRequest(events_since=5), timeout=10)
    assert not raw.unchanged and len(raw.graphs) == 10 and raw.HasField("process")
    assert [e.seq for e in raw.events][0] == 6 and raw.instance  # as older clients read it


def test_a_cursor_the_server_no_longer_holds_gets_every_part(served) -> None:
    _, target = served
    with Client(target, timeout=10) as c:
        whole = c.follow()
        stamp = c._follower.held[1]  # type: ignore[index]
        gone = (whole, stamp._replace(generation=stamp.generation + 10_000))
        raw = _raw(c, gone)
    assert not raw.unchanged and len(raw.graphs) == 10 and not raw.events  # events: still new


def test_a_server_restarted_on_the_same_port_answers_in_full() -> None:
    rec_a, rec_b = _recorder(10, "a"), _recorder(3, "b")
    old = Server(lambda since: build(rec_a, (), since), port=0)
    port = old.start()
    target = f"localhost:{port}"
    with Client(target, timeout=10) as c:
        c.follow()
        old.stop(grace=0)
        new = Server(lambda since: build(rec_b, (), since), port=port)
        assert new.start() == port
        try:
            rec_b.events.emit(EventKind.COMPILE, name="jit(g)")
            raw = _raw(c, c._follower.held)
            assert not raw.unchanged and len(raw.graphs) == 3
            assert len(raw.events) == 21  # its own numbers from 1, not after the old cursor
            whole = c.follow()
        finally:
            new.stop(grace=0)
    assert {g.hash[0] for g in whole.graphs} == {"b"} and len(whole.events) == 21
    assert [e.seq for e in whole.events] == list(range(1, 22))  # nothing of the old one


def test_a_reader_refuses_parts_it_does_not_hold() -> None:
    follower = delta.Follower()
    stamp = delta.Stamp("x", 3, ("graphs",))
    with pytest.raises(WireError, match="graphs"):
        follower.apply(Snapshot(taken_at_unix=1.0), stamp, None)
    assert follower.held is None
    m = pb.Snapshot(instance="i" * 1000, unchanged=["graphs"] * 1000)
    got = delta.stamp_of(m)
    assert len(got.instance) == delta.MAX_INSTANCE and len(got.unchanged) == delta.MAX_UNCHANGED


def test_merged_events_keep_the_rare_kinds_first() -> None:
    from tpu_info.contract.model import Event

    held = (Event(1, 1.0, EventKind.RECOMPILE),) + tuple(
        Event(i, 1.0, EventKind.STEP) for i in range(2, 600))
    new = tuple(Event(i, 1.0, EventKind.STEP) for i in range(590, 1500))
    merged = delta.merge_events(held, new)
    assert len(merged) == delta.EVENTS_KEPT and merged[0].kind == EventKind.RECOMPILE
    assert merged[-1].seq == 1499 and [e.seq for e in merged] == sorted({e.seq for e in merged})


def test_a_followed_stream_yields_whole_snapshots_and_sends_deltas(served) -> None:
    rec, target = served
    with Client(target, timeout=10) as c:
        request = pb.StreamRequest(interval_ms=60)
        request.cursor.SetInParent()
        call = c._monitor.StreamSnapshots(request, timeout=10)
        raw = [next(call) for _ in range(3)]
        call.cancel()
        snaps = []
        for s in c.stream(0.06, follow=True):
            snaps.append(s)
            rec.events.emit(EventKind.STEP, value=3.0)
            if len(snaps) == 3:
                break
    assert not raw[0].unchanged and len(raw[0].graphs) == 10
    assert "graphs" in raw[2].unchanged and not raw[2].graphs
    assert all(len(s.graphs) == 10 and s.process is not None for s in snaps)
    assert snaps[-1].events[-1].seq > 20


def test_fan_out_rounds_ask_with_each_targets_cursor(served) -> None:
    rec, target = served
    followers = {target: delta.Follower()}
    fan_out([target], timeout=10, followers=followers)
    _next_build()
    rec.events.emit(EventKind.STEP, value=4.0)
    [r] = fan_out([target], timeout=10, followers=followers)
    assert r.ok and len(r.value.graphs) == 10 and r.value.events[-1].seq == 21  # type: ignore[union-attr]
    assert followers[target].held[1].unchanged  # type: ignore[index]  # a cursor answer


@pytest.mark.slow
def test_the_exporter_keeps_one_cursor_per_process(tmp_path) -> None:
    from tests.tpu_info.commands.test_exporter import Hooked, _series
    from tpu_info.commands.exporter import ExporterOptions, HostExporter
    from tpu_info.contract.model import LocalScan

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir=runtime, timeout_s=5.0,
                                      libtpu_target=None), scan_chips=LocalScan)
    hooked = [Hooked(runtime, 0), Hooked(runtime, 1)]
    try:
        ex.poll()
        first = ex.body("", "")[0].decode()
        assert len(ex._followers) == 2
        _next_build()
        ex.poll()
        again = ex.body("", "")[0].decode()
        assert all(f.held is not None and f.held[1].unchanged for f in ex._followers.values())
        assert len(_series(again, "tpu_info_process_info")) == 2
        families = {line.split("{")[0] for line in first.splitlines() if "pid=" in line}
        assert families == {line.split("{")[0] for line in again.splitlines() if "pid=" in line}
        hooked.pop().stop()
        ex.poll()
        assert len(ex._followers) == 1
    finally:
        for h in hooked:
            h.stop()


def test_the_cli_streaming_rounds_ask_with_cursors(served) -> None:
    from tpu_info.commands.gather import gather
    from tpu_info.net import fanout

    rec, target = served
    looks = []
    for _ in range(2):
        looks.append(gather([target], use_discovery=False, probe_libtpu=False,
                            scan_devices=False).views[0].snapshot)
        _next_build()
        rec.events.emit(EventKind.STEP, value=5.0)
    assert all(s is not None and len(s.graphs) == 10 for s in looks)
    assert fanout._follower(target).held[1].unchanged  # type: ignore[index]


def test_a_kept_list_from_a_stranger_is_bounded_and_names_no_record_twice() -> None:
    from tpu_info.contract.model import GraphRecord

    graphs = tuple(GraphRecord(hash=f"h{i}", name="f", engine="jax", first_seen_unix=1.0,
                               last_seen_unix=1.0) for i in range(3))
    base = Snapshot(taken_at_unix=1.0, graphs=graphs)
    follower = delta.Follower()
    held = (base, delta.Stamp("x", 1))
    keys = ("h1",) * 5000 + ("h0", "nope", "h2") + tuple(f"k{i}" for i in range(5000))
    got = follower.apply(Snapshot(taken_at_unix=2.0), delta.Stamp("x", 2, (), (
        ("graphs", keys, ()),)), held)
    assert [g.hash for g in got.graphs] == ["h1", "h0", "h2"]


def test_fan_out_keeps_channels_of_targets_that_answer_only(served) -> None:
    from tpu_info.net.fanout import Channels

    _, target = served
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_target = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there
    channels = Channels()
    fan_out([target, dead_target], timeout=5, channels=channels)
    kept = channels.take(target)
    assert kept is not None and channels.take(dead_target) is None
    channels.put(kept)
    [r] = fan_out([target], timeout=5, channels=channels)
    assert r.ok and channels.take(target) is kept  # the same channel, asked again
    channels.put(kept)
    channels.close()
    assert channels.take(target) is None
