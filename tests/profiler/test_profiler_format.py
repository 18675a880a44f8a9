"""The Chrome Trace Event format the profiler writes, checked event by event.

:func:`validate_trace` is the checker the other profiler tests use too.
"""

from __future__ import annotations

import gzip
import json
import threading
from typing import Any

import pytest

from profiler import annotations
from profiler.annotations import StepTrace, Trace
from tpu_info.contract.model import Event
from tpu_info.outputs import chrome_trace as chrome

PHASES = set("BEXiICMbensftPOND")
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index",
            "process_labels"}
EPS = 2e-3  # ts and dur are rounded to 1 ns (3 decimals of a microsecond)


def validate_trace(doc: Any) -> list[dict[str, Any]]:
    """Checks ``doc`` (a parsed trace) against the Trace Event format; returns its events.

    Required keys, phase types, non-negative durations, timestamps ordered
    within each thread, B/E balanced, X spans nested within each thread.
    """
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert isinstance(events, list)
    last_ts: dict[tuple[int, int], float] = {}
    open_be: dict[tuple[int, int], list[str]] = {}
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for e in events:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in e, f"{key} missing in {e}"
        assert e["ph"] in PHASES, e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str), e
        key = (e["pid"], e["tid"])
        if e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e.get("args"), dict), e
            continue
        assert e["ts"] >= last_ts.get(key, 0.0), f"out of order on {key}: {e}"
        last_ts[key] = e["ts"]
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            spans.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "B":
            open_be.setdefault(key, []).append(e["name"])
        elif e["ph"] == "E":
            stack = open_be.get(key)
            assert stack, f"E without B on {key}: {e}"
            began = stack.pop()
            assert e["name"] in ("", began), f"E {e['name']!r} closes B {began!r}"
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] in "iI":
            assert e.get("s", "t") in ("g", "p", "t"), e
    for key, stack in open_be.items():
        assert not stack, f"B without E on {key}: {stack}"
    for key, items in spans.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and start >= stack[-1][1] - EPS:
                stack.pop()
            if stack:
                assert end <= stack[-1][1] + EPS, (
                    f"{name} [{start}, {end}] overlaps {stack[-1]} on {key} without nesting")
            stack.append((start, end, name))
    return events


def _window(**kw: Any) -> chrome.Window:
    base = dict(start_ns=1_000_000, end_ns=11_000_000, start_unix=1000.0, pid=42,
                process_name="train.py")
    base.update(kw)
    return chrome.Window(**base)


def test_validator_rejects_bad_traces() -> None:
    good = {"ph": "X", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 1, "name": "a"}
    validate_trace([good])
    for bad in (
        [{k: v for k, v in good.items() if k != "tid"}],
        [dict(good, ph="Z")],
        [dict(good, dur=-1.0)],
        [dict(good, ts=5.0), dict(good, ts=1.0)],
        [dict(good, ph="B")],
        [dict(good, ph="E")],
        [dict(good, ts=0.0, dur=5.0), dict(good, ts=2.0, dur=5.0)],  # overlap, no nesting
    ):
        with pytest.raises(AssertionError):
            validate_trace(bad)


def test_annotations_pair_into_nested_spans_per_thread() -> None:
    w = _window(annotations=[
        ("E", 1_100_000, 7, "began_before", None),   # no B in the window: left out
        ("B", 2_000_000, 7, "outer", {"k": 1}),
        ("B", 2_000_000, 8, "other", None),
        ("B", 3_000_000, 7, "inner", None),
        ("E", 4_000_000, 7, "inner", None),
        ("E", 5_000_000, 7, "outer", None),
        ("B", 6_000_000, 7, "open", None),             # never closed: cut at the end
    ], thread_names={7: "MainThread"})
    doc = chrome.build(w)
    events = validate_trace(doc)
    x = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(x) == {"outer", "inner", "other", "open"}
    assert x["outer"]["ts"] == 1000.0 and x["outer"]["dur"] == 3000.0
    assert x["outer"]["args"] == {"k": 1}
    assert x["inner"]["ts"] == 2000.0 and x["inner"]["dur"] == 1000.0
    assert x["open"]["args"]["still_open_at_end"] is True
    assert x["open"]["ts"] + x["open"]["dur"] == 10_000.0
    names = {(e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert (7, "MainThread") in names and (8, "thread 8") in names
    notes = " ".join(doc["otherData"]["notes"])
    assert "began before the capture" in notes and "still open" in notes


def test_out_of_order_exit_closes_inner_spans_early() -> None:
    w = _window(annotations=[("B", 2_000_000, 7, "a", None), ("B", 3_000_000, 7, "b", None),
                             ("E", 4_000_000, 7, "a", None), ("E", 5_000_000, 7, "b", None)])
    events = validate_trace(chrome.build(w))
    x = {e["name"]: e for e in events if e["ph"] == "X"}
    assert x["b"]["args"] == {"closed_early": True}
    assert set(x) == {"a", "b"}


def test_engine_events_become_spans_instants_and_counters() -> None:
    ev = [
        Event(1, 1000.001, "step"),
        Event(2, 1000.003, "compile", "jit(f)", "abc", "", "t.py:3", 0.002),
        Event(3, 1000.0035, "recompile", "jit(f)", "def", "x changed f32[8] -> f32[16]",
              "t.py:3", 0.0025),   # overlaps the first compile: a second lane
        Event(4, 1000.004, "transfer_to_device", value=4096.0),
        Event(5, 1000.005, "transfer_from_device", value=1024.0),
        Event(6, 1000.006, "cache_hit", "jit(g)", "fff", "persistent cache"),
        Event(7, 1000.007, "step"),
        Event(8, 1000.008, "hook_error", "jax.transfer", detail="boom"),
    ]
    w = _window(events=ev, last_step_unix=999.0, steps_before=10,
                memory=[(2_000_000, {"device 0": 100}), (9_000_000, {"device 0": 300})],
                executions=[(2_000_000, 0), (9_000_000, 5)])
    doc = chrome.build(w)
    events = validate_trace(doc)
    steps = [e for e in events if e["tid"] == chrome.STEPS_TID and e["ph"] == "X"]
    assert [s["name"] for s in steps] == ["step 11", "step 12"]
    assert steps[0]["ts"] == 0.0 and steps[0]["args"]["began_before_capture"] is True
    assert steps[1]["ts"] == pytest.approx(1000.0) and steps[1]["dur"] == pytest.approx(6000.0)
    compiles = [e for e in events if e["ph"] == "X" and e["cat"] == "compile"]
    assert {c["args"]["graph_hash"] for c in compiles} == {"abc", "def"}
    first = next(c for c in compiles if c["args"]["graph_hash"] == "abc")
    assert first["ts"] == pytest.approx(1000.0) and first["dur"] == pytest.approx(2000.0)
    again = next(c for c in compiles if c["args"]["graph_hash"] == "def")
    assert again["args"]["cause"] == "x changed f32[8] -> f32[16]"
    assert again["tid"] != first["tid"]   # overlapping compiles on separate lanes
    counters = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["args"])
    assert counters["compiles"][-1] == {"compiles": 2}
    assert counters["transfer bytes"][-1] == {"to_device": 4096.0, "from_device": 1024.0}
    assert counters["HBM in use (bytes)"] == [{"device 0": 100}, {"device 0": 300}]
    assert counters["executions"][-1] == {"executions": 5}
    instants = {e["name"]: e for e in events if e["ph"] == "i"}
    assert instants["to device"]["args"]["bytes"] == 4096
    assert "cache hit jit(g)" in instants and "hook_error jax.transfer" in instants


def test_encode_cuts_the_latest_events_to_fit() -> None:
    recs = []
    for i in range(2000):
        recs += [("B", 1_000_000 + 2 * i * 1000, 7, f"span{i}", None),
                 ("E", 1_000_000 + (2 * i + 1) * 1000, 7, f"span{i}", None)]
    doc = chrome.build(_window(annotations=recs, end_ns=10_000_000_000))
    full, cut = chrome.encode(doc, 10 << 20)
    assert not cut
    data, cut = chrome.encode(doc, len(full) // 4)
    assert cut and len(data) <= len(full) // 4
    parsed = json.loads(data)
    validate_trace(parsed)
    assert parsed["otherData"]["truncated"] is True
    assert "cut to the first" in parsed["otherData"]["notes"][-1]
    names = [e["name"] for e in parsed["traceEvents"] if e["ph"] == "X"]
    assert names and names == [f"span{i}" for i in range(len(names))]  # earliest kept


def test_annotations_record_nothing_without_a_capture() -> None:
    assert not annotations.recording()
    with Trace("idle"):
        pass
    annotations.start_recording(100)
    try:
        with Trace("busy", size=3):
            pass
    finally:
        recs, full = annotations.stop_recording()
    assert full is None
    assert [(r[0], r[3], r[4]) for r in recs] == [("B", "busy", {"size": 3}), ("E", "busy", None)]
    assert recs[0][2] == threading.get_native_id()


def test_annotation_buffer_stops_at_its_cap() -> None:
    annotations.start_recording(5)
    try:
        for _ in range(10):
            with Trace("x"):
                pass
        assert not annotations.recording()
    finally:
        recs, full = annotations.stop_recording()
    assert len(recs) == 5 and full is not None


def test_trace_decorator_and_step_trace(fresh_metrics) -> None:
    @Trace("work")
    def work(x: int) -> int:
        return x + 1

    annotations.start_recording(100)
    try:
        for i in range(3):
            with StepTrace("train_step", step_num=i):
                assert work(i) == i + 1
    finally:
        recs, _ = annotations.stop_recording()
    assert work.__name__ == "work"
    assert [r[3] for r in recs if r[0] == "B"] == ["train_step", "work"] * 3
    assert [r[4] for r in recs if r[0] == "B" and r[3] == "train_step"] == [
        {"step_num": 0}, {"step_num": 1}, {"step_num": 2}]
    assert fresh_metrics.registry.counter_value("MarkStep") == 3
    assert fresh_metrics.events.since(0)[0][-1].kind == "step"


def test_gzip_output(tmp_path) -> None:
    import profiler

    path = tmp_path / "t.json.gz"
    with profiler.trace(30, path, sample_interval_s=0.01):
        with Trace("a"):
            pass
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert [e["name"] for e in validate_trace(doc) if e["ph"] == "X"] == ["a"]
