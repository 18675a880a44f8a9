"""The host timeline ``tpu-info profile`` builds for a program without the
profiler (issue 32, item 4): the window from the hook's reply, the events
and samples read over it, in the profiler's Chrome trace format.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpu_info.contract.captures import CHROME_JSON, WINDOW_FORMAT, CaptureFile, RemoteCapture
from tpu_info.contract.errors import ProtocolMismatch
from tpu_info.contract.model import Event, Snapshot
from tpu_info.net.capture_events import Sample, Seen
from tpu_info.outputs.host_timeline import fill

START = 1000.0


def _window(after: int = 10, through: int | None = None, seconds: float = 2.0) -> RemoteCapture:
    other: dict[str, Any] = {"capture_start_unix": START, "duration_s": seconds,
                             "events_after_seq": after, "notes": ["from the hook"]}
    if through is not None:
        other["events_through_seq"] = through
    doc = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 42, "tid": 0, "ts": 0,
                            "args": {"name": "train.py (pid 42)"}}], "otherData": other}
    return RemoteCapture(json.dumps(doc).encode(), format=WINDOW_FORMAT,
                         files=(CaptureFile("jax/x.xplane.pb", 3, b"abc"),))


def _doc(cap: RemoteCapture) -> dict[str, Any]:
    assert cap.format == CHROME_JSON
    return json.loads(cap.trace)


def _kind(doc: dict[str, Any], ph: str, cat: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and e.get("cat") == cat]


def test_the_window_events_become_the_profilers_spans_and_counters() -> None:
    events = [
        Event(9, START - 0.5, "step"),                              # before: starts step 1's span
        Event(10, START - 0.1, "transfer_to_device", value=8.0),    # before: left out
        Event(11, START + 0.2, "step"),
        Event(12, START + 0.5, "compile", name="jit(f)", graph_hash="ab", value=0.25),
        Event(13, START + 0.6, "recompile", name="jit(f)", graph_hash="cd", value=0.05,
              detail="x: shape f32[8] -> f32[9]"),
        Event(14, START + 0.7, "transfer_from_device", value=64.0),
        Event(15, START + 0.9, "step"),
        Event(16, START + 2.5, "step"),                             # after the window
    ]
    seen = Seen(events={e.seq: e for e in events}, first_seq=8, steps_at_first=4,
                samples=[Sample(START - 0.2, {"device 0": 100}, 50),
                         Sample(START + 1.0, {"device 0": 300}, 70),
                         Sample(START + 3.0, {"device 0": 999}, 90)])
    cap = fill(_window(after=10, through=15), seen)
    doc = _doc(cap)
    assert cap.files[0].name == "jax/x.xplane.pb" and cap.event_count == len(doc["traceEvents"])
    steps = _kind(doc, "X", "step")
    # MarkStep was 4 at the first read, plus step 9 before the window: 6 and 7 in it.
    assert [(s["args"]["step"], s["ts"], s["dur"]) for s in steps] == [
        (6, 0.0, 200000.0), (7, 200000.0, 700000.0)]
    assert steps[0]["args"]["began_before_capture"] is True
    compiles = _kind(doc, "X", "compile")
    assert [(c["name"], c["ts"], c["dur"]) for c in compiles] == [
        ("compile jit(f)", 250000.0, 250000.0), ("recompile jit(f)", 550000.0, 50000.0)]
    assert compiles[0]["args"]["cause"] == "first compile"
    assert compiles[1]["args"]["cause"] == "x: shape f32[8] -> f32[9]"
    [moved] = _kind(doc, "i", "transfer")
    assert moved["name"] == "from device" and moved["args"]["bytes"] == 64
    counters = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["args"])
    assert counters["HBM in use (bytes)"] == [{"device 0": 300}]  # the sample inside only
    assert counters["executions"] == [{"executions": 20}]
    assert counters["compiles"][-1] == {"compiles": 2}
    other = doc["otherData"]
    assert other["capture_start_unix"] == START and other["duration_s"] == 2.0
    assert other["notes"] == ["from the hook"]
    assert other["device_traces"] == ["jax/x.xplane.pb"]
    assert {e["pid"] for e in doc["traceEvents"]} == {42}
    assert any(e["args"].get("name") == "train.py (pid 42)" for e in doc["traceEvents"]
               if e["ph"] == "M")


def test_dropped_events_are_counted_and_no_step_span_bridges_them() -> None:
    # Events 11..20 happened; 14..17 were never read (the ring moved on).
    read = [Event(11, START + 0.1, "step"), Event(12, START + 0.2, "step"),
            Event(13, START + 0.3, "step"), Event(18, START + 0.8, "step"),
            Event(19, START + 0.9, "step"), Event(20, START + 1.0, "step")]
    seen = Seen(events={e.seq: e for e in read}, first_seq=10, error="UNAVAILABLE")
    doc = _doc(fill(_window(after=10, through=20), seen))
    steps = _kind(doc, "X", "step")
    assert [s["name"] for s in steps] == ["step 2", "step 3", "step", "step"]
    assert all(not (s["ts"] < 300000.0 < s["ts"] + s["dur"]) for s in steps)  # none across
    # A gap right after the window's start: no step is numbered.
    seen.events.pop(11)
    steps = _kind(_doc(fill(_window(after=10, through=20), seen)), "X", "step")
    assert [s["name"] for s in steps] == ["step", "step", "step"]
    notes = doc["otherData"]["notes"]
    assert any(n.startswith("4 hook event(s) were dropped") for n in notes), notes
    assert any("could not be read (UNAVAILABLE)" in n for n in notes), notes


def test_an_event_after_the_end_numbered_before_steps_in_the_window_is_no_gap() -> None:
    # Numbers follow the order events reached the hook's log: a compile emitted
    # just after the window's end (13) came before the journal fold that
    # numbered the last steps of the window (14, 15). Leaving 13 out is no gap
    # (before: steps 14 and 15 unnumbered, the loaded suite's rare KeyError 'args').
    read = [Event(11, START + 0.1, "step"), Event(12, START + 0.5, "step"),
            Event(13, START + 2.1, "compile", name="jit(f)", graph_hash="ab", value=0.1),
            Event(14, START + 1.5, "step"), Event(15, START + 1.9, "step")]
    seen = Seen(events={e.seq: e for e in read}, first_seq=10)
    steps = _kind(_doc(fill(_window(after=10, through=15), seen)), "X", "step")
    assert [s["args"]["step"] for s in steps] == [2, 3, 4]


@pytest.mark.parametrize("trace", [b"not json", b"{}", b'{"otherData": {"duration_s": 1}}',
                                   b'{"otherData": {"capture_start_unix": "nan", '
                                   b'"duration_s": 1, "events_after_seq": 0}}'])
def test_a_reply_that_is_no_window_is_refused_in_one_line(trace: bytes) -> None:
    with pytest.raises(ProtocolMismatch, match="capture window"):
        fill(RemoteCapture(trace, format=WINDOW_FORMAT), Seen())


def test_events_past_the_cap_are_left_out_not_counted_as_dropped(monkeypatch) -> None:
    from tpu_info.net import capture_events

    monkeypatch.setattr(capture_events, "MAX_EVENTS", 3)
    seen = Seen(first_seq=10)
    events = tuple(Event(s, START + s / 100, "step") for s in range(11, 21))
    seen.add(Snapshot(taken_at_unix=START + 1, events=events, last_seq=20))
    assert seen.capped and sorted(seen.events) == [11, 12, 13]
    cap = fill(_window(after=10, through=20), seen)
    notes = _doc(cap)["otherData"]["notes"]
    assert cap.truncated and not any("dropped" in n for n in notes), notes
    assert any("after the first 3 read are left out" in n for n in notes), notes
