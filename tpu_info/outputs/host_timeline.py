"""The host timeline of a program that never loaded the profiler.

Its hook answers a capture with only the window
(:data:`tpu_info.contract.captures.WINDOW_FORMAT`: the start, the length,
the last event number before it, and the device files); ``tpu-info
profile`` read the hook's events and snapshots over the same window
(:mod:`tpu_info.net.capture_events`). :func:`fill` puts the two together in
the profiler's format (:mod:`tpu_info.outputs.chrome_trace`): compile and
recompile spans with their causes, steps, transfers and other hook events,
and counter tracks for compiles, transfer bytes, device memory and
executions. Annotations (``profiler.Trace`` spans) need ``import profiler``.

Example:
    >>> import json
    >>> from tpu_info.contract.captures import RemoteCapture
    >>> from tpu_info.contract.model import Event
    >>> window = {"traceEvents": [], "otherData": {"capture_start_unix": 100.0,
    ...           "duration_s": 2.0, "events_after_seq": 0, "notes": []}}
    >>> cap = RemoteCapture(json.dumps(window).encode(), format="tpu-info-window")
    >>> seen = Seen(events={1: Event(1, 100.5, "step")}, first_seq=0)
    >>> doc = json.loads(fill(cap, seen).trace)
    >>> doc["otherData"]["host_timeline"]
    'built by tpu-info profile from the hook events it read over the window'
"""

from __future__ import annotations

import json
import math
from typing import Any

from tpu_info.contract.captures import CHROME_JSON, RemoteCapture
from tpu_info.contract.errors import ProtocolMismatch
from tpu_info.contract.model import EventKind
from tpu_info.net.capture_events import Seen
from tpu_info.outputs import chrome_trace

__all__ = ["fill", "MAX_TRACE_BYTES"]

MAX_TRACE_BYTES = 32 * 1024 * 1024  # as the profiler's: the JSON written at most
_SOURCE = "built by tpu-info profile from the hook events it read over the window"


def _window(cap: RemoteCapture) -> tuple[dict[str, Any], int, float, float, int]:
    """The reply's document, process id, start, length and first event number.

    Raises:
        ProtocolMismatch: the reply does not describe a window.
    """
    try:
        doc = json.loads(cap.trace)
        other = doc["otherData"]
        start = float(other["capture_start_unix"])
        seconds = float(other["duration_s"])
        after = int(other["events_after_seq"])
        pid = next((int(e["pid"]) for e in doc.get("traceEvents", ())
                    if isinstance(e, dict) and e.get("name") == "process_name"), 0)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProtocolMismatch(f"the hook's capture window is not readable ({e!r})") from None
    if not (math.isfinite(start) and math.isfinite(seconds) and 0 <= seconds <= 3600):
        raise ProtocolMismatch("the hook's capture window has no valid start or length")
    return doc, pid, start, seconds, after


def fill(cap: RemoteCapture, seen: Seen) -> RemoteCapture:
    """The trace of the window ``cap`` marks, from what ``seen`` read.

    Raises:
        ProtocolMismatch: ``cap`` does not describe a window.
    """
    doc, pid, start, seconds, after = _window(cap)
    end = start + seconds
    ordered = [seen.events[k] for k in sorted(seen.events)]
    window = [e for e in ordered if e.seq > after and e.time_unix <= end]
    before = [e for e in ordered if e.seq <= after]
    process = next((e["args"]["name"] for e in doc.get("traceEvents", ())
                    if isinstance(e, dict) and e.get("name") == "process_name"),
                   f"pid {pid}")
    w = chrome_trace.Window(start_ns=0, end_ns=round(seconds * 1e9), start_unix=start, pid=pid,
                            process_name=str(process))
    w.events, w.events_after_seq = window, after
    w.events_left_out = frozenset(e.seq for e in ordered if e.seq > after and e.time_unix > end)
    w.last_step_unix = next((e.time_unix for e in reversed(before)
                             if e.kind == EventKind.STEP), None)
    early = seen.first_seq if seen.first_seq is not None else after
    w.steps_before = seen.steps_at_first + sum(
        1 for e in ordered if early < e.seq <= after and e.kind == EventKind.STEP)
    through = doc["otherData"].get("events_through_seq")
    through = int(through) if isinstance(through, int) else seen.cursor
    if seen.capped:  # what came after the cap was not dropped: it was left out
        through = min(through, seen.cursor)
    w.events_dropped = max(0, through - after - sum(1 for e in ordered
                                                    if after < e.seq <= through))
    executed_before = next((s.executions for s in seen.samples if s.executions is not None), 0)
    for s in seen.samples:
        if not start <= s.time_unix <= end:
            continue
        t = round((s.time_unix - start) * 1e9)
        if s.memory:
            w.memory.append((t, dict(s.memory)))
        if s.executions is not None:
            w.executions.append((t, max(s.executions - executed_before, 0)))
    w.notes = [str(n) for n in doc["otherData"].get("notes", ()) if isinstance(n, str)]
    if seen.capped:
        w.notes.append(f"hook events after the first {len(seen.events)} read are left out "
                       "(at most that many are kept)")
    if seen.error:
        w.notes.append(f"the hook's events could not be read ({seen.error}): the timeline "
                       "may miss some")
    w.extra = {"host_timeline": _SOURCE,
               "device_traces": [f.name for f in cap.files]}
    built = chrome_trace.build(w)
    data, cut = chrome_trace.encode(built, MAX_TRACE_BYTES)
    sent = json.loads(data) if cut else built
    return RemoteCapture(trace=data, format=CHROME_JSON, files=cap.files,
                         notes=tuple(sent["otherData"]["notes"]),
                         truncated=cap.truncated or cut or seen.capped,
                         event_count=len(sent["traceEvents"]))
