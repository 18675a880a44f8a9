"""One capture window: annotations, the recorder's events and sampled
device memory between a start and an end, made into one Chrome trace.

A :class:`Capture` runs on whichever thread calls :meth:`Capture.run` (the
local :func:`profiler.trace` starts a background thread for it; the gRPC
server runs it on one of its workers). While it waits out the window it
samples every installed engine's ``devices()`` memory and the execution
counter, and drains the recorder's event log (``EventLog.since``) so the
ring cannot overwrite the window's events before they are read. Nothing is
added to the program's hot path except the annotation buffer.

One capture at a time per process: a second one raises :class:`CaptureBusy`
at construction. Limits: duration at most :data:`MAX_DURATION_S`; at most
``max_annotations`` annotation records and ``max_events`` hook events (then
recording stops and ``otherData.truncated`` is set); the JSON at most
``max_bytes`` (its latest events are cut to fit).

Example:
    >>> import threading
    >>> cap = Capture(0.05)
    >>> result = cap.run(threading.Event())
    >>> result.trace.startswith(b'{"traceEvents"')
    True
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import metrics
from metrics.engines.device_profilers import DeviceWindow
from metrics.recording.recorder import Recorder
from profiler import annotations
from profiler.errors import CaptureBusy, InvalidCapture
from tpu_info.contract import catalog as names
from tpu_info.contract.model import EventKind
from tpu_info.outputs import chrome_trace as chrome

__all__ = ["Capture", "CaptureResult", "MAX_DURATION_S", "DEFAULT_MAX_ANNOTATIONS",
           "DEFAULT_MAX_EVENTS", "DEFAULT_MAX_BYTES", "DEFAULT_SAMPLE_INTERVAL_S"]

MAX_DURATION_S = 300.0
DEFAULT_MAX_ANNOTATIONS = 400_000     # entries and exits: 200,000 spans
DEFAULT_MAX_EVENTS = 200_000          # compiles, transfers, steps ... from the event log
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # the JSON; well under the server's 64 MiB replies
DEFAULT_SAMPLE_INTERVAL_S = 0.1

_busy = threading.Lock()


@dataclass(frozen=True)
class CaptureResult:
    """A finished capture.

    Attributes:
        trace: the Chrome trace JSON (not compressed).
        event_count: trace events in it (metadata included).
        truncated: whether a limit cut recording or the JSON short.
        notes: what was left out or went wrong, one sentence each.
        device_files: files the device profilers wrote.
        path: where :func:`profiler.trace` wrote the trace (None for remote captures).
    """

    trace: bytes
    event_count: int
    truncated: bool
    notes: tuple[str, ...] = ()
    device_files: tuple[Path, ...] = ()
    path: Path | None = None


def _check_limit(name: str, value: float, low: float, high: float | None = None) -> None:
    if not value >= low or (high is not None and value > high) or value != value:
        bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise InvalidCapture(f"{name} must be {bound}, got {value!r}")


class Capture:
    """One capture window; reserves the process's capture slot when built.

    Args:
        duration_s: seconds to record (at most :data:`MAX_DURATION_S`).
        device_dir: also run the device profilers, writing under this folder.
        recorder: the recorder to read (default: the process's).
        engines: returns the installed engine adapters (default: ``metrics``').
        max_annotations: annotation entries and exits kept at most.
        max_events: hook events kept at most.
        max_bytes: largest JSON produced.
        sample_interval_s: seconds between memory samples (and event drains).

    Raises:
        InvalidCapture: a duration or limit out of range.
        CaptureBusy: another capture is running in this process.
    """

    def __init__(
        self,
        duration_s: float,
        *,
        device_dir: Path | None = None,
        recorder: Recorder | None = None,
        engines: Callable[[], Sequence[Any]] = metrics.installed_engines,
        max_annotations: int = DEFAULT_MAX_ANNOTATIONS,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    ) -> None:
        _check_limit("duration_s", duration_s, 0.001, MAX_DURATION_S)
        _check_limit("max_annotations", max_annotations, 1)
        _check_limit("max_events", max_events, 1)
        _check_limit("max_bytes", max_bytes, 4096)
        _check_limit("sample_interval_s", sample_interval_s, 0.001, 60.0)
        self.duration_s = float(duration_s)
        self.device_dir = device_dir
        self._rec = recorder if recorder is not None else metrics.recorder()
        self._engines = engines
        self.max_annotations = int(max_annotations)
        self.max_events = int(max_events)
        self.max_bytes = int(max_bytes)
        self.sample_interval_s = float(sample_interval_s)
        if not _busy.acquire(blocking=False):
            raise CaptureBusy("a trace capture is already running in this process; "
                              "try again when it ends (at most 5 minutes)")
        self._released = False

    def release(self) -> None:
        """Frees the capture slot without running (:meth:`run` frees it too)."""
        if not self._released:
            self._released = True
            _busy.release()

    def run(self, stop: threading.Event) -> CaptureResult:
        """Records for the duration, or until ``stop`` is set; returns the trace."""
        try:
            return self._run(stop)
        finally:
            self.release()

    # The window --------------------------------------------------------------

    def _run(self, stop: threading.Event) -> CaptureResult:
        rec = self._rec
        seq = rec.events.last_seq
        last_step = _last_step_before(rec, seq)
        steps_before = rec.registry.counter_value(names.MARK_STEP) or 0
        exec_before = rec.registry.counter_value(names.EXECUTE_COUNT) or 0
        threads = _thread_names()
        w = chrome.Window(start_ns=time.perf_counter_ns(), end_ns=0, start_unix=time.time(),
                          pid=os.getpid(), process_name=_process_name(),
                          last_step_unix=last_step, steps_before=steps_before)
        if not self._engines():
            w.notes.append("no engine hook is installed (metrics.install()): the trace "
                           "has annotations and steps only")
        annotations.start_recording(self.max_annotations)
        device = (DeviceWindow(list(self._engines()), self.device_dir)
                  if self.device_dir is not None else None)
        device_files: list[Path] = []
        try:
            if device is not None:
                device.start()
            deadline = w.start_ns + int(self.duration_s * 1e9)
            while True:
                seq = self._drain(w, seq)
                self._sample(w, exec_before)
                left = (deadline - time.perf_counter_ns()) / 1e9
                if left <= 0 or stop.wait(min(self.sample_interval_s, left)):
                    break
        finally:
            w.end_ns = time.perf_counter_ns()
            end_unix = w.start_unix + (w.end_ns - w.start_ns) / 1e9
            w.annotations, w.annotations_full_at_ns = annotations.stop_recording()
            if device is not None:
                device_files = device.stop()
                w.notes.extend(device.notes)
        self._drain(w, seq)
        w.events_left_out = frozenset(e.seq for e in w.events if e.time_unix > end_unix)
        w.events = [e for e in w.events if e.time_unix <= end_unix]
        self._sample(w, exec_before)
        w.thread_names = {**threads, **_thread_names()}
        if w.annotations_full_at_ns is not None:
            w.notes.append(f"annotation recording stopped at {self.max_annotations} records "
                           "(max_annotations)")
        w.extra["limits"] = {"max_annotations": self.max_annotations,
                             "max_events": self.max_events, "max_bytes": self.max_bytes}
        if self.device_dir is not None:
            w.extra["device_dir"] = str(self.device_dir)
            w.extra["device_traces"] = [p.relative_to(self.device_dir).as_posix()
                                        for p in device_files]
        doc = chrome.build(w)
        truncated = bool(doc["otherData"]["truncated"]) or w.extra.get("events_capped", False)
        doc["otherData"]["truncated"] = truncated
        data, cut = chrome.encode(doc, self.max_bytes)
        n = len(doc["traceEvents"])
        notes = tuple(doc["otherData"]["notes"])
        if cut:
            sent = json.loads(data)
            n = len(sent["traceEvents"])
            notes = tuple(sent["otherData"]["notes"])
        return CaptureResult(trace=data, event_count=n, truncated=truncated or cut,
                             notes=notes, device_files=tuple(device_files))

    def _drain(self, w: chrome.Window, seq: int) -> int:
        events, dropped = self._rec.events.since(seq)
        if not events:
            return seq
        w.events_dropped += dropped
        last = events[-1].seq
        room = self.max_events - len(w.events)
        if len(events) > room:
            if not w.extra.get("events_capped"):
                w.extra["events_capped"] = True
                w.notes.append(f"hook events after the first {self.max_events} are left out "
                               "(max_events)")
            events = events[:max(room, 0)]
        w.events.extend(events)
        return last

    def _sample(self, w: chrome.Window, exec_before: int) -> None:
        now = time.perf_counter_ns()
        engines = list(self._engines())
        values: dict[str, int] = {}
        for eng in engines:
            try:
                for d in eng.devices():
                    used = d.memory.used_bytes
                    if used is not None:
                        label = f"device {d.id}" if len(engines) == 1 else f"{eng.name} {d.id}"
                        values[label] = int(used)
            except Exception as e:  # noqa: BLE001 - a failed sample is a note, not a crash
                note = f"memory of {getattr(eng, 'name', eng)} could not be read: {e!r}"
                if note not in w.notes:
                    w.notes.append(note)
        if values:
            w.memory.append((now, values))
        executed = self._rec.registry.counter_value(names.EXECUTE_COUNT)
        if executed is not None:
            w.executions.append((now, max(executed - exec_before, 0)))


def _last_step_before(rec: Recorder, seq: int) -> float | None:
    events, _ = rec.events.since(max(0, seq - rec.events.capacity))
    for e in reversed(events):
        if e.seq <= seq and e.kind == EventKind.STEP:
            return e.time_unix
    return None


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _process_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return f"{os.path.basename(argv0)} (pid {os.getpid()})"

