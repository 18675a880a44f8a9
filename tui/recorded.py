"""A recorded step flood: a JAX training loop at about 1,200 steps a second.

Deterministic frames (one a second, ``NOW`` minus the history) of a process
that marks every step, so each frame carries a thousand ``step`` events and
a few transfers, plus what must not scroll away under them: a first compile,
a cache hit, a recompile with its cause, a graph break, and (optionally) the
disconnect at the end. Pilot and snapshot tests of the step line, the events
panel and the help screen read it; a frame's ``StepTime`` distribution has
the hook's shipped percentiles, so P50/P99 come out of the same view as
``tpu-info metrics``.

Example:
    >>> src = flood()
    >>> snaps = [u.snapshot for u in src.initial() if getattr(u, "snapshot", None)]
    >>> len(snaps), sum(len(s.events) for s in snaps) > 60_000
    (60, True)
"""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.catalog import (
    CACHED_COMPILE,
    MARK_STEP,
    OUTBOUND_DATA,
    STEP_TIME,
    TRANSFER_TO_DEVICE_TIME,
    UNCACHED_COMPILE,
)
from tpu_info.contract.model import (
    STEPS_MARKED,
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
    StepsReading,
    Unit,
)
from tui.fake import GIB, NOW, FakeSource, dist
from tui.source import Conn, Update

TARGET = "127.0.0.1:40500"
FRAMES = 60
STEPS_PER_FRAME = 1200  # steps a second, before the recompile's stall
STEP_EVENTS = 1000  # step events a frame carries (the hook's ring holds this many)
RECOMPILE_AT = 40  # the frame with the recompile (20 s before the end)
PROGRAM = "/home/alice/project/loop.py"
CAUSE = RecompileCause(NOW - (FRAMES - 1 - RECOMPILE_AT) - 0.2,
                       "argument 'x' changed f32[32,4] -> f32[33,4]", f"{PROGRAM}:14",
                       "x", "f32[32,4]", "f32[33,4]")
_STEP = "a1b2c3d4e5f6" + "7" * 52
_STEP2 = "f6e5d4c3b2a1" + "8" * 52
# One step's time (ns) as the hook's buckets see it: mostly 0.8 ms, a slow tail.
_STEP_TIME = dist(STEP_TIME, Unit.TIME_NS, [780_000.0 + 1_000 * (i % 40) for i in range(190)]
                  + [2.5e6] * 8 + [9.0e6, 4.1e8])
_H2D = dist(TRANSFER_TO_DEVICE_TIME, Unit.TIME_NS, [90_000.0 * (1 + i % 5) for i in range(50)])


def steps_done(k: int) -> int:
    """Steps after frame ``k`` (the recompile frame loses a third of its steps)."""
    return sum(STEPS_PER_FRAME - (400 if j == RECOMPILE_AT else 0) + (j % 7) * 10
               for j in range(k + 1))


def _graphs(k: int) -> tuple[GraphRecord, ...]:
    out = [GraphRecord(_STEP, "jit(train_step)", "jax", NOW - 70, NOW, compiles=1,
                       compile_seconds_total=0.42, compile_seconds_last=0.42,
                       executions=min(steps_done(k), steps_done(RECOMPILE_AT - 1)),
                       signature=("f32[32,4]",), signatures=(("f32[32,4]",),),
                       causes=(RecompileCause(NOW - 70, "first call", f"{PROGRAM}:14"),))]
    if k >= RECOMPILE_AT:
        out.append(GraphRecord(_STEP2, "jit(train_step)", "jax", CAUSE.time_unix, NOW,
                               compiles=1, compile_seconds_total=0.39,
                               compile_seconds_last=0.39,
                               executions=steps_done(k) - steps_done(RECOMPILE_AT - 1),
                               signature=("f32[33,4]",), signatures=(("f32[33,4]",),),
                               causes=(CAUSE,)))
    return tuple(out)


def _events(k: int, t: float, seq: int) -> tuple[Event, ...]:
    """Frame ``k``'s events: a thousand steps, transfers, and the rare ones."""
    rare: list[Event] = []
    if k == 0:
        rare.append(Event(0, t - 0.9, EventKind.COMPILE, "jit(train_step)", _STEP,
                          "first call", f"{PROGRAM}:14", 0.42))
    if k == 20:
        rare.append(Event(0, t - 0.5, EventKind.CACHE_HIT, "jit(eval_step)", "", "disk cache"))
    if k == RECOMPILE_AT:
        rare.append(Event(0, CAUSE.time_unix, EventKind.RECOMPILE, "jit(train_step)", _STEP2,
                          CAUSE.description, CAUSE.location, 0.39))
    if k == RECOMPILE_AT + 5:
        rare.append(Event(0, t - 0.6, EventKind.GRAPH_BREAK, "forward", "",
                          "call to a function torch.compile cannot trace: print",
                          f"{PROGRAM}:22"))
    steps = [Event(0, t - 1 + i / STEP_EVENTS, EventKind.STEP) for i in range(STEP_EVENTS)]
    moves = [Event(0, t - 1 + i / 10, EventKind.TRANSFER_TO_DEVICE, value=4096.0)
             for i in range(10)]
    merged = sorted(rare + steps + moves, key=lambda e: e.time_unix)
    return tuple(replace(e, seq=seq + i + 1) for i, e in enumerate(merged))


def flood_frame(k: int, seq: int, t: float, *, pid: int = 5151, user: str = "alice",
                start_time_unix: float = NOW - 70) -> Snapshot:
    """Frame ``k`` of the flood (events numbered after ``seq``), read at ``t``."""
    marks = steps_done(k)
    events = _events(k, t, seq)
    step_time = replace(_STEP_TIME, count=marks, total=marks * 830_000.0)
    busy = 35.0 if k == RECOMPILE_AT else 92.0 + (k % 5)
    return Snapshot(
        taken_at_unix=t, uptime_seconds=70.0 - (FRAMES - 1) + k,
        process=ProcessRecord(pid=pid, name="loop.py", argv=("python", "loop.py"),
                              host="tpu-vm-1", user=user, engine="jax",
                              versions={"jax": "0.10.0"}, start_time_unix=start_time_unix),
        devices=(DeviceRecord(id=0, kind="TPU v5 lite", platform="tpu", memory=MemoryReading(
            used_bytes=int(2.5 * GIB), limit_bytes=int(15.75 * GIB), source="memory_stats"),
            busy_percent=busy),),
        counters=(CounterReading(CACHED_COMPILE, int(k >= 20)), CounterReading(MARK_STEP, marks),
                  CounterReading(UNCACHED_COMPILE, 1 + (k >= RECOMPILE_AT))),
        distributions=(replace(_H2D, count=10 * (k + 1)), step_time,
                       DistributionReading(OUTBOUND_DATA, Unit.BYTES, 10 * (k + 1),
                                           4096.0 * 10 * (k + 1), 4096.0, 4096.0)),
        graphs=_graphs(k), events=events, last_seq=events[-1].seq,
        steps=StepsReading(marks, STEPS_MARKED, "metrics.mark_step", float(k + 1)))


def flood_updates(target: str = TARGET, frames: int = FRAMES, **kw: object) -> list[Update]:
    """The flood's frames as updates of ``target``, the last one read at ``NOW``."""
    out, seq = [], 0
    for k in range(frames):
        snap = flood_frame(k, seq, NOW - (frames - 1) + k, **kw)  # type: ignore[arg-type]
        seq = snap.last_seq
        out.append(Update(target, Conn.STREAMING, snap))
    return out


def flood(*, disconnected: bool = False) -> FakeSource:
    """The flood as a source (``disconnected``: the process went away at the end)."""
    out: list = [Update(TARGET, Conn.CONNECTING), *flood_updates()]
    if disconnected:
        out.append(Update(TARGET, Conn.DISCONNECTED, error="cannot connect (connection "
                          "refused)", since_unix=NOW, retry_in_s=1.0))
    return FakeSource(out)
