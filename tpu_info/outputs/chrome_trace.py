"""One capture window as Chrome Trace Event JSON (Perfetto, chrome://tracing).

The format only, shared by the two builders of a trace: the profiler in
the program (``profiler.capture``: annotations too) and ``tpu-info
profile``, which builds the host timeline of a program that never loaded
the profiler from the events and snapshots the hook sends. It imports
only the contract: neither ``metrics`` nor ``profiler``.

:func:`build` turns what a capture gathered (annotation records, the
recorder's events, sampled memory and execution counts) into a trace
document: ``X`` spans for annotations, steps and compiles,
``i`` instants for transfers and cache hits, ``C`` counter tracks for HBM
in use, compiles, transfer bytes and executions, and ``M`` names for the
process and every track. :func:`encode` serializes it under a byte cap.
Times are microseconds since the capture started; ``otherData`` carries the
start as a unix time, the notes and whether anything was cut.

Example:
    >>> w = Window(start_ns=0, end_ns=2_000_000, start_unix=1e9, pid=1,
    ...            process_name="train.py")
    >>> w.annotations = [("B", 1000, 7, "fwd", None), ("E", 5000, 7, "fwd", None)]
    >>> doc = build(w)
    >>> [e["dur"] for e in doc["traceEvents"] if e["ph"] == "X"]
    [4.0]
    >>> data, cut = encode(doc, max_bytes=1 << 20)
    >>> cut
    False
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tpu_info.contract.model import CALLED_FROM, COMPILE_KINDS, TRANSFER_KINDS, Event, EventKind

__all__ = ["Record", "Window", "build", "encode", "STEPS_TID", "COMPILES_TID", "TRANSFERS_TID",
           "EVENTS_TID"]

# An annotation entry or exit: (phase "B"/"E", perf_counter_ns, native
# thread id, name, args or None), as ``profiler.annotations`` records them.
Record = tuple[str, int, int, str, "dict[str, Any] | None"]

# Tracks of engine events get thread ids no real thread has (Linux caps
# thread ids at 2**22), sorted above the program's own threads.
_BASE = 0x7FFF0000
STEPS_TID = _BASE + 1
COMPILES_TID = _BASE + 2   # further lanes: COMPILES_TID + 100 * k
TRANSFERS_TID = _BASE + 3
EVENTS_TID = _BASE + 5
COUNTERS_TID = _BASE
_TRACK_NAMES = {STEPS_TID: "steps (metrics.mark_step)", COMPILES_TID: "compiles",
                TRANSFERS_TID: "transfers", EVENTS_TID: "other hook events"}


@dataclass
class Window:
    """What one capture gathered; times are ``perf_counter_ns`` or unix seconds.

    Attributes:
        start_ns: ``perf_counter_ns()`` when the capture started; trace time 0.
        end_ns: ``perf_counter_ns()`` when it ended.
        start_unix: ``time.time()`` taken together with ``start_ns``.
        annotations: :data:`Record` tuples (the profiler's annotations).
        annotations_full_at_ns: when the annotation buffer filled, if it did.
        events: the recorder's events of the window, in sequence order.
        events_dropped: events the recorder's ring dropped before they were read.
        events_after_seq: the last event number before the window, when known
            (a gap after it also leaves steps unnumbered).
        events_left_out: numbers of events that were read but are not in
            ``events`` (they came after the window's end): not a gap.
        last_step_unix: time of the last step event before the window, if any.
        steps_before: ``MarkStep`` count when the window started.
        memory: ``(perf_counter_ns, {"device 0": bytes_in_use, ...})`` samples.
        executions: ``(perf_counter_ns, executions since the start)`` samples.
        thread_names: native thread id -> name.
        notes: sentences for ``otherData.notes``.
        extra: more ``otherData`` entries (device trace files, limits).
    """

    start_ns: int
    end_ns: int
    start_unix: float
    pid: int
    process_name: str
    annotations: list[Record] = field(default_factory=list)
    annotations_full_at_ns: int | None = None
    events: list[Event] = field(default_factory=list)
    events_dropped: int = 0
    events_after_seq: int | None = None
    events_left_out: frozenset[int] = frozenset()
    last_step_unix: float | None = None
    steps_before: int = 0
    memory: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    executions: list[tuple[int, int]] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class _Clock:
    def __init__(self, w: Window) -> None:
        self.start_ns = w.start_ns
        self.start_unix = w.start_unix
        self.end_us = self.ns(w.end_ns)

    def ns(self, t: int) -> float:
        return round((t - self.start_ns) / 1000.0, 3)

    def unix(self, t: float) -> float:
        return round((t - self.start_unix) * 1e6, 3)

    def clamp(self, us: float) -> float:
        return min(max(us, 0.0), self.end_us)


def _span(name: str, ts: float, end: float, pid: int, tid: int, cat: str,
          args: dict[str, Any] | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "X", "name": name, "cat": cat, "ts": ts,
                         "dur": round(max(end - ts, 0.0), 3), "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def _instant(name: str, ts: float, pid: int, tid: int, cat: str,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "i", "s": "t", "name": name, "cat": cat, "ts": ts,
                         "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def _counter(name: str, ts: float, pid: int, values: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "name": name, "cat": "counter", "ts": ts, "pid": pid,
            "tid": COUNTERS_TID, "args": values}


def _annotation_spans(w: Window, clock: _Clock) -> tuple[list[dict[str, Any]], set[int]]:
    """Pairs B/E records per thread into nested X spans."""
    out: list[dict[str, Any]] = []
    stacks: dict[int, list[tuple[str, int, dict[str, Any] | None]]] = {}
    unmatched = 0
    for phase, t, tid, name, args in w.annotations:
        stack = stacks.setdefault(tid, [])
        if phase == "B":
            stack.append((name, t, args))
            continue
        # Find the span this ends; spans above it (left open by generators or
        # coroutines) end here too, so nesting stays valid.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == name:
                break
        else:
            unmatched += 1  # began before the capture did
            continue
        while len(stack) > i:
            n, t0, a = stack.pop()
            if len(stack) > i:
                a = dict(a or {}, closed_early=True)
            out.append(_span(n, clock.ns(t0), clock.ns(t), w.pid, tid, "user", a))
    end = w.annotations_full_at_ns if w.annotations_full_at_ns is not None else w.end_ns
    open_left = 0
    for tid, stack in stacks.items():
        while stack:
            n, t0, a = stack.pop()
            open_left += 1
            out.append(_span(n, clock.ns(t0), clock.ns(max(end, t0)), w.pid, tid, "user",
                             dict(a or {}, still_open_at_end=True)))
    if unmatched:
        w.notes.append(f"{unmatched} annotation(s) that began before the capture are left out")
    if open_left:
        w.notes.append(f"{open_left} annotation(s) still open when recording ended are cut "
                       "there (args.still_open_at_end)")
    return out, set(stacks)


def _step_spans(w: Window, clock: _Clock) -> list[dict[str, Any]]:
    """A span from each step to the next. Where event numbers are missing
    (the ring, or a reader, dropped events), steps may be missing too: no
    span bridges the gap, and steps after it carry no number."""
    out = []
    prev = w.last_step_unix
    n: int | None = w.steps_before
    last_seq = w.events_after_seq
    gap = False
    for e in w.events:
        # Numbers follow the order events reached the log, not their times: a
        # journal folded after a direct event numbers earlier steps after it,
        # so an event past the window's end can sit between two in it.
        gap = gap or (last_seq is not None and any(
            s not in w.events_left_out for s in range(last_seq + 1, e.seq)))
        last_seq = e.seq
        if e.kind != EventKind.STEP:
            continue
        n = None if gap or n is None else n + 1
        end = clock.clamp(clock.unix(e.time_unix))
        if prev is not None and not gap:
            start = clock.unix(prev)
            args: dict[str, Any] = {"step": n} if n is not None else {}
            if start < 0:
                args["began_before_capture"] = True
            out.append(_span("step" if n is None else f"step {n}", clock.clamp(start), end,
                             w.pid, STEPS_TID, "step", args))
        prev, gap = e.time_unix, False
    return out


def _lanes(spans: list[dict[str, Any]], first_tid: int) -> set[int]:
    """Puts overlapping spans on separate lanes (tids) so each lane nests."""
    lane_end: list[float] = []
    for s in sorted(spans, key=lambda s: s["ts"]):
        i = next((k for k, end in enumerate(lane_end) if s["ts"] >= end), len(lane_end))
        if i == len(lane_end):
            lane_end.append(0.0)
        lane_end[i] = s["ts"] + s["dur"]
        s["tid"] = first_tid + 100 * i
    return {first_tid + 100 * i for i in range(len(lane_end))}


def _engine_events(w: Window, clock: _Clock) -> tuple[list[dict[str, Any]], dict[int, str]]:
    out: list[dict[str, Any]] = []
    compiles: list[dict[str, Any]] = []
    tracks: dict[int, str] = {}
    n_compiles = 0
    moved = {"to_device": 0.0, "from_device": 0.0}
    out.append(_counter("compiles", 0.0, w.pid, {"compiles": 0}))
    out.append(_counter("transfer bytes", 0.0, w.pid, dict(moved)))
    for e in w.events:
        ts = clock.clamp(clock.unix(e.time_unix))
        base: dict[str, Any] = {"seq": e.seq}
        if e.graph_hash:
            base["graph_hash"] = e.graph_hash
        if e.location:
            base["location"] = e.location
        if e.kind in COMPILE_KINDS:
            seconds = max(e.value or 0.0, 0.0)
            cause = e.detail
            if cause.startswith(CALLED_FROM):  # a first compile reached through helpers
                base["called_from"], cause = cause[len(CALLED_FROM):], ""
            args = dict(base, kind=e.kind, compile_seconds=seconds,
                        cause=cause or ("first compile" if e.kind == EventKind.COMPILE else ""))
            start = clock.clamp(round(clock.unix(e.time_unix) - seconds * 1e6, 3))
            compiles.append(_span(f"{e.kind} {e.name}", start, ts, w.pid, COMPILES_TID,
                                  "compile", args))
            n_compiles += 1
            out.append(_counter("compiles", ts, w.pid, {"compiles": n_compiles}))
        elif e.kind in TRANSFER_KINDS:
            direction = e.kind.removeprefix("transfer_")
            nbytes = float(e.value or 0.0)
            moved[direction] += nbytes
            out.append(_instant(direction.replace("_", " "), ts, w.pid, TRANSFERS_TID,
                                "transfer", dict(base, bytes=int(nbytes))))
            out.append(_counter("transfer bytes", ts, w.pid, dict(moved)))
            tracks[TRANSFERS_TID] = _TRACK_NAMES[TRANSFERS_TID]
        elif e.kind == EventKind.CACHE_HIT:
            out.append(_instant(f"cache hit {e.name}", ts, w.pid, COMPILES_TID, "compile",
                                dict(base, detail=e.detail)))
            tracks[COMPILES_TID] = _TRACK_NAMES[COMPILES_TID]
        elif e.kind != EventKind.STEP:
            args = dict(base, detail=e.detail) if e.detail else base
            if e.value is not None:
                args["value"] = e.value
            out.append(_instant(f"{e.kind} {e.name}".strip(), ts, w.pid, EVENTS_TID, e.kind,
                                args))
            tracks[EVENTS_TID] = _TRACK_NAMES[EVENTS_TID]
    for tid in _lanes(compiles, COMPILES_TID):
        k = (tid - COMPILES_TID) // 100
        tracks[tid] = "compiles" + (f" ({k + 1})" if k else "")
    return out + compiles, tracks


def _sampled(w: Window, clock: _Clock) -> list[dict[str, Any]]:
    out = [_counter("HBM in use (bytes)", clock.clamp(clock.ns(t)), w.pid, dict(values))
           for t, values in w.memory if values]
    out += [_counter("executions", clock.clamp(clock.ns(t)), w.pid, {"executions": n})
            for t, n in w.executions]
    return out


def _metadata(w: Window, tids: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": w.pid, "tid": 0, "ts": 0,
         "args": {"name": w.process_name}},
    ]
    for tid, name in sorted(tids.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": w.pid, "tid": tid, "ts": 0,
                    "args": {"name": name}})
        if tid >= _BASE:  # engine tracks first, in a fixed order
            out.append({"ph": "M", "name": "thread_sort_index", "pid": w.pid, "tid": tid,
                        "ts": 0, "args": {"sort_index": -100 + (tid - _BASE) % 100}})
    return out


def build(w: Window) -> dict[str, Any]:
    """The Chrome trace document of one window (``traceEvents`` and ``otherData``)."""
    clock = _Clock(w)
    spans, user_tids = _annotation_spans(w, clock)
    steps = _step_spans(w, clock)
    engine, tracks = _engine_events(w, clock)
    sampled = _sampled(w, clock)
    tids = {tid: w.thread_names.get(tid, f"thread {tid}") for tid in user_tids}
    if steps:
        tids[STEPS_TID] = _TRACK_NAMES[STEPS_TID]
    tids.update(tracks)
    body = spans + steps + engine + sampled
    # Within a thread: by time, an enclosing span before what it encloses.
    body.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    if w.events_dropped:
        w.notes.append(f"{w.events_dropped} hook event(s) were dropped by the event ring "
                       "before the capture read them (no step span bridges a gap, and "
                       "steps after one are not numbered)")
    other = {
        "tool": "tpu-info profiler",
        "capture_start_unix": w.start_unix,
        "duration_s": round((w.end_ns - w.start_ns) / 1e9, 6),
        "time_unit": "microseconds since capture_start_unix",
        "truncated": w.annotations_full_at_ns is not None,
        "notes": list(w.notes),
        **w.extra,
    }
    return {"traceEvents": _metadata(w, tids) + body, "displayTimeUnit": "ms",
            "otherData": other}


def encode(doc: dict[str, Any], max_bytes: int) -> tuple[bytes, bool]:
    """Compact JSON of ``doc``, cutting its latest events to fit ``max_bytes``.

    Returns the bytes and whether events were cut (then ``otherData`` says
    how many and ``truncated`` is true).
    """
    data = json.dumps(doc, separators=(",", ":")).encode()
    if len(data) <= max_bytes:
        return data, False
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    body = [e for e in events if e["ph"] != "M"]
    keep = len(body)
    other = dict(doc["otherData"], truncated=True)
    while keep > 0:
        keep = int(keep * max_bytes / len(data) * 0.95)
        notes = list(doc["otherData"].get("notes", [])) + [
            f"cut to the first {keep} of {len(body)} events to stay under {max_bytes} bytes"]
        cut = dict(doc, traceEvents=meta + body[:keep], otherData=dict(other, notes=notes))
        data = json.dumps(cut, separators=(",", ":")).encode()
        if len(data) <= max_bytes:
            return data, True
    raise ValueError(f"max_bytes={max_bytes} is too small for the trace's metadata")
