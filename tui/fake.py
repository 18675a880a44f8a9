"""Deterministic data for tests and benchmarks: a frozen clock and fake sources.

The records are real :mod:`tpu_info.contract.model` records, built from constants, so
snapshot tests exercise the same drawing code as live targets. A fake stands
in only for the network: :class:`FakeSource` delivers a fixed history on
mount and, when asked, keeps producing synthetic frames from a thread loop
(for the CPU benchmark).

Example:
    >>> src = FakeSource.demo()
    >>> len([u for u in src.initial() if u.snapshot is not None])
    60
    >>> FrozenClock()() == NOW
    True
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import replace

from tpu_info.contract.buckets import percentile
from tpu_info.contract.catalog import (
    CACHED_COMPILE,
    COMPILE_TIME,
    EXECUTE_TIME,
    INBOUND_DATA,
    MARK_STEP,
    OUTBOUND_DATA,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
    UNCACHED_COMPILE,
)
from tpu_info.contract.model import (
    PERCENTILES,
    BucketCounts,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    Event,
    EventKind,
    GraphRecord,
    MemoryReading,
    ProcessRecord,
    RecompileCause,
    Snapshot,
    Unit,
)
from tui.source import Conn, Found, Loop, Sink, Source, Update

NOW = 1_750_000_000.0  # 2025-06-15 15:06:40 UTC
GIB = 2**30
MAIN = "127.0.0.1:40123"
REMOTE = "10.0.0.7:8431"
TRAIN = "/home/alice/project/train.py"


class FrozenClock:
    """A clock that says ``now`` until told otherwise."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def dist(name: str, unit: Unit, samples: list[float], gamma: float = 1.02) -> DistributionReading:
    """A distribution as a hook sends it: log buckets and shipped percentiles."""
    pos: dict[int, int] = {}
    for v in samples:
        k = math.ceil(math.log(v) / math.log(gamma) - 1e-9)
        pos[k] = pos.get(k, 0) + 1
    b = BucketCounts(gamma=gamma, positive=pos)
    lo, hi = min(samples), max(samples)
    pct = tuple((p, percentile(b, len(samples), p, lo, hi)) for p in PERCENTILES)
    return DistributionReading(name=name, unit=unit, count=len(samples),
                               total=float(sum(samples)), min=lo, max=hi, percentiles=pct,
                               buckets=b)


_CAUSE = RecompileCause(NOW - 14, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                        f"{TRAIN}:88", "batch", "f32[32,128]", "f32[17,128]")
_H2D = dist(TRANSFER_TO_DEVICE_TIME, Unit.TIME_NS,
            [180_000 * (1 + (i % 10) / 10) for i in range(239)] + [9.5e6])
_D2H = dist(TRANSFER_FROM_DEVICE_TIME, Unit.TIME_NS,
            [1.1e6 * (1 + (i % 10) / 10) for i in range(118)])
_COMPILE = dist(COMPILE_TIME, Unit.TIME_NS, [4.2e9, 3.9e9, 1.25e9, 4e6, 4e6, 4e6])
_EXECUTE = dist(EXECUTE_TIME, Unit.TIME_NS, [2.0e6 * (1 + (i % 5) / 10) for i in range(200)])
# JAX's own set-up graphs (PRNG keys, initial arrays): no line of the program's,
# run once, before the first step.
_SETUP = tuple(
    GraphRecord(h + "4" * 52, name, "jax", NOW - 610 + i, NOW - 610 + i, compiles=1,
                compile_seconds_total=secs, compile_seconds_last=secs)
    for i, (h, name, secs) in enumerate((("a1b2c3d4e5f6", "jit(_threefry_split)", 0.4),
                                         ("a2b3c4d5e6f7", "jit(_normal)", 1.1),
                                         ("a3b4c5d6e7f8", "jit(_normal)", 0.9),
                                         ("a4b5c6d7e8f9", "jit(broadcast_in_dim)", 0.09))))


def _graphs(k: int) -> tuple[GraphRecord, ...]:
    """The demo process's graphs after frame ``k`` (a recompile at frame 45)."""
    sig32, sig17 = ("f32[32,128]", "i32[32]"), ("f32[17,128]", "i32[17]")
    out = [
        GraphRecord("3f9a1c0b7d2e" + "0" * 52, "jit(train_step)", "jax", NOW - 600, NOW - 1,
                    compiles=1, compile_seconds_total=4.2, compile_seconds_last=4.2,
                    executions=60 + min(k, 45) * 2, signature=sig32, signatures=(sig32,),
                    causes=(RecompileCause(NOW - 600, "first call", f"{TRAIN}:88"),)),
        GraphRecord("0c44de12ab98" + "2" * 52, "jit(eval_step)", "jax", NOW - 300, NOW - 60,
                    compiles=1, compile_seconds_total=1.25, compile_seconds_last=1.25,
                    cache_hits=1, executions=None,
                    causes=(RecompileCause(NOW - 300, "first call", f"{TRAIN}:120"),)),
        GraphRecord("9d0e7f6a5b4c" + "3" * 52,
                    "jit(_very_long_function_name_from_a_generated_module_that_goes_on)",
                    "jax", NOW - 500, NOW - 400, compiles=3, compile_seconds_total=0.012,
                    compile_seconds_last=0.004, executions=3,
                    signature=("f32[8]",), signatures=(("f32[4]",), ("f32[8]",), ("f32[16]",)),
                    causes=(RecompileCause(NOW - 480, "argument 'x' changed f32[4] -> f32[8]",
                                           "/srv/gen/module.py:12", "x", "f32[4]", "f32[8]"),)),
        GraphRecord("5e6f708192a3" + "5" * 52, "jit(loss_fn)", "jax", NOW - 590, NOW - 1,
                    compiles=1, compile_seconds_total=0.8, compile_seconds_last=0.8,
                    executions=118 + k),
    ]
    if k >= 45:
        out.insert(1, GraphRecord("b71e55aa90c4" + "1" * 52, "jit(train_step)", "jax", NOW - 14,
                                  NOW - 1, compiles=1, compile_seconds_total=3.9,
                                  compile_seconds_last=3.9, executions=(k - 45) * 2 + 1,
                                  signature=sig17, signatures=(sig17,), causes=(_CAUSE,)))
    return (*out, *_SETUP)


def _events(k: int, t: float, seq: int) -> tuple[tuple[Event, ...], int]:
    out = [Event(seq + 1, t - 0.5, EventKind.STEP)]
    if k % 3 == 0:
        out.append(Event(seq + 2, t - 0.4, EventKind.TRANSFER_TO_DEVICE, value=float(4 * 2**20)))
    if k % 10 == 5:
        out.append(Event(len(out) + seq + 1, t - 0.3, EventKind.TRANSFER_FROM_DEVICE, value=4.0))
    if k == 45:
        out.append(Event(len(out) + seq + 1, t - 0.9, EventKind.RECOMPILE, "jit(train_step)",
                         "b71e55aa90c4" + "1" * 52, _CAUSE.description, _CAUSE.location, 3.9))
    out = [replace(e, seq=seq + i + 1) for i, e in enumerate(out)]
    return tuple(out), seq + len(out)


def demo_frame(k: int, seq: int, t: float, devices: int = 4) -> tuple[Snapshot, int]:
    """Frame ``k`` of the demo JAX training process; returns it and its last seq."""
    events, last = _events(k, t, seq)
    dip = 1.0 if k in (45, 46) else 0.0
    devs = tuple(
        DeviceRecord(id=i, kind="TPU v5 lite", platform="tpu",
                     memory=MemoryReading(used_bytes=int((3.25 + i + 0.02 * (k % 20)
                                                         - 1.5 * dip) * GIB),
                                          peak_bytes=int(8 * GIB), limit_bytes=int(15.75 * GIB),
                                          source="memory_stats"),
                     busy_percent=0.0 if dip else float(80 + (k * 7 + i * 3) % 19))
        for i in range(devices))
    out_bytes = sum(4 * 2**20 * (1 + j % 4) for j in range(0, k + 1, 3))
    return Snapshot(
        taken_at_unix=t, uptime_seconds=725.0 - 59 + k,
        process=ProcessRecord(pid=4242, name="train.py", argv=("python", "train.py"),
                              host="tpu-vm-1", user="alice", engine="jax",
                              versions={"jax": "0.10.0", "jaxlib": "0.10.0"},
                              start_time_unix=NOW - 725),
        devices=devs,
        counters=(CounterReading(CACHED_COMPILE, 1), CounterReading(MARK_STEP, 61 + k),
                  CounterReading(UNCACHED_COMPILE, 5 + (k >= 45))),
        distributions=(_COMPILE, _EXECUTE, _H2D,
                       DistributionReading(OUTBOUND_DATA, Unit.BYTES, 40 + k // 3,
                                           float(out_bytes), 4.0 * 2**20, 16.0 * 2**20),
                       _D2H, DistributionReading(INBOUND_DATA, Unit.BYTES, 118, 472.0, 4.0, 4.0)),
        graphs=_graphs(k), events=events, last_seq=last,
    ), last


class FakeSource(Source):
    """Fixed updates on mount, plus optional synthetic frames from a thread.

    Args:
        updates: delivered at once, in order, before the first draw.
        live: ``live(n)`` returns the updates of tick ``n`` (None: no loop).
        interval_s: seconds between live ticks.
    """

    def __init__(self, updates: list[Update | Found],
                 live: Callable[[int], list[Update | Found]] | None = None,
                 interval_s: float = 1.0) -> None:
        self.updates = updates
        self.live = live
        self.interval_s = interval_s
        self.reconnects = 0
        self.stopped = threading.Event()

    @classmethod
    def demo(cls, *, frames: int = 60, disconnected: bool = False, remote: bool = True,
             devices: int = 4) -> FakeSource:
        """A JAX training process (60 s of history, a recompile 15 s ago) and,
        with ``remote``, a second target that is down. ``disconnected``: the
        training process went away 20 s ago."""
        out: list[Update | Found] = [Update(MAIN, Conn.CONNECTING)]
        if remote:
            out.append(Update(REMOTE, Conn.CONNECTING))
        seq = 0
        for k in range(frames):
            snap, seq = demo_frame(k, seq, NOW - (frames - 1) + k, devices)
            out.append(Update(MAIN, Conn.STREAMING, snap))
        if remote:
            out.append(Update(REMOTE, Conn.DISCONNECTED, error="cannot connect (failed to "
                              "connect to all addresses; last error: connection refused)",
                              since_unix=NOW - 95, retry_in_s=15.0))
        if disconnected:
            out.append(Update(MAIN, Conn.DISCONNECTED, error="cannot connect (connection "
                              "refused)", since_unix=NOW - 20, retry_in_s=4.0))
        return cls(out)

    def initial(self) -> list[Update | Found]:
        return list(self.updates)

    def loops(self) -> list[tuple[str, Loop]]:
        return [("fake", self._loop)] if self.live is not None else []

    def _loop(self, sink: Sink, stop: threading.Event) -> None:
        n = 0
        while not (stop.is_set() or self.stopped.wait(self.interval_s)):
            assert self.live is not None
            for u in self.live(n):
                sink(u)
            n += 1

    def reconnect(self) -> None:
        self.reconnects += 1

    def stop(self) -> None:
        self.stopped.set()


def synthetic(devices: int = 8, graphs: int = 500, interval_s: float = 1.0,
              clock: Callable[[], float] | None = None) -> FakeSource:
    """A busy process with ``devices`` devices and ``graphs`` graphs, ticking
    every ``interval_s``: each tick a few graphs execute, memory moves, a
    step and a transfer are recorded (the benchmark's load)."""
    import time

    now = clock or time.time
    names = [f"jit(fn_{i % (graphs // 2 or 1)})" for i in range(graphs)]
    table = [GraphRecord(f"{i:012x}" + "a" * 52, names[i], "jax", NOW, NOW,
                         compiles=1 + (i % 7 == 0), compile_seconds_total=0.01 * (i % 50),
                         compile_seconds_last=0.01, executions=i) for i in range(graphs)]
    proc = ProcessRecord(pid=777, name="big.py", host="bench", engine="jax",
                         versions={"jax": "0.10.0"}, start_time_unix=NOW)
    state = {"seq": 0, "out": 0.0}

    def tick(n: int) -> list[Update | Found]:
        for j in range(5):
            i = (n * 5 + j) % graphs
            g = table[i]
            table[i] = replace(g, executions=(g.executions or 0) + 1, last_seen_unix=now())
        seq = state["seq"]
        t = now()
        events = (Event(seq + 1, t, EventKind.STEP),
                  Event(seq + 2, t, EventKind.TRANSFER_TO_DEVICE, value=float(2**20)))
        state["seq"] = seq + 2
        state["out"] += 2**20
        devs = tuple(DeviceRecord(id=i, kind="TPU v5 lite", platform="tpu", memory=MemoryReading(
            used_bytes=int((4 + i + 0.1 * (n % 10)) * GIB), limit_bytes=16 * GIB,
            source="memory_stats"), busy_percent=float((n * 7 + i) % 100))
            for i in range(devices))
        snap = Snapshot(taken_at_unix=t, uptime_seconds=60.0 + n, process=proc, devices=devs,
                        counters=(CounterReading(MARK_STEP, n),
                                  CounterReading(UNCACHED_COMPILE, graphs)),
                        distributions=(_H2D, DistributionReading(
                            OUTBOUND_DATA, Unit.BYTES, n + 1, state["out"], 2**20, 2**20)),
                        graphs=tuple(table), events=events, last_seq=seq + 2)
        return [Update("127.0.0.1:50000", Conn.STREAMING, snap)]

    return FakeSource(tick(0), live=tick, interval_s=interval_s)
