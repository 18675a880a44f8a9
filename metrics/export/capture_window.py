"""The capture every hooked program answers, with or without ``import profiler``.

A program that never loaded the profiler has no annotations to record, but
its hook already sends everything else a host timeline shows: compiles and
recompiles with their durations and causes, steps, transfers, syncs, each
with its time (the snapshot's events), and device memory. So the hook only
marks the window here: it waits out the duration (or until ``stop``), runs
the engines' own device profilers over it when asked (through their
adapters: :class:`metrics.engines.device_profilers.DeviceWindow`), and
answers :data:`~tpu_info.contract.captures.WINDOW_FORMAT`: a Chrome trace
with the window's start, length and first event sequence number in
``otherData``. ``tpu-info profile`` builds the timeline from the events it
reads over the same window (:mod:`tpu_info.commands.profile`).

Nothing is added to the program's hot path; the owner check and the device
opt-in run before this (``metrics._capture``). One capture at a time.

Example:
    >>> import json, threading
    >>> from metrics.recording import whoami
from metrics.recording.recorder import Recorder
    >>> out = record(0.01, False, threading.Event(), [], Recorder())
    >>> out.format, sorted(json.loads(out.trace)["otherData"])[:2]
    ('tpu-info-window', ['capture_start_unix', 'duration_s'])
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence

from metrics.engines.base import Engine
from metrics.engines.device_profilers import DeviceWindow
from metrics.export import device_capture
from metrics.recording import whoami
from metrics.recording.recorder import Recorder
from tpu_info.contract.captures import WINDOW_FORMAT, CaptureFile, RemoteCapture
from tpu_info.contract.errors import CaptureBusy

__all__ = ["record", "NO_PROFILER_NOTE"]

NO_PROFILER_NOTE = ("the program did not load the profiler: the host timeline is its hook's "
                    "events (no Trace/StepTrace spans: add `import profiler` for those)")

_busy = threading.Lock()


def record(duration_s: float, device: bool, stop: threading.Event,
           engines: Sequence[Engine], recorder: Recorder) -> RemoteCapture:
    """Marks a window of ``duration_s`` seconds (device traces too when
    ``device``) and returns it.

    Raises:
        ValueError: a device window longer than
            :data:`metrics.export.device_capture.MAX_DEVICE_DURATION_S`.
        CaptureBusy: another capture is running in this process.
    """
    if device and (why := device_capture.too_long(duration_s)):
        raise ValueError(why)
    if not _busy.acquire(blocking=False):
        raise CaptureBusy("a trace capture is already running in this process; "
                          "try again when it ends (at most 5 minutes)")
    try:
        return _record(duration_s, device, stop, engines, recorder)
    finally:
        _busy.release()


def _record(duration_s: float, device: bool, stop: threading.Event,
            engines: Sequence[Engine], recorder: Recorder) -> RemoteCapture:
    notes = [NO_PROFILER_NOTE]
    with device_capture.private_folder(device) as folder:
        window = DeviceWindow(engines, folder) if folder is not None else None
        # The start, then the last event number: every later event is in the window.
        start_unix, started = time.time(), time.monotonic()
        first_seq = recorder.events.last_seq
        if window is not None:
            window.start()
        try:
            stop.wait(max(0.0, duration_s - (time.monotonic() - started)))
        finally:
            seconds = time.monotonic() - started
            written = window.stop() if window is not None else []
        files: tuple[CaptureFile, ...] = ()
        left_out = ""
        if folder is not None and window is not None:
            notes += window.notes
            files, left_out = device_capture.read_files(folder, written)
            if left_out:
                notes.append(left_out)
    argv0 = whoami.program()
    pid = os.getpid()
    doc = {
        "traceEvents": [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                         "args": {"name": f"{argv0} (pid {pid})"}}],
        "displayTimeUnit": "ms",
        "otherData": {"tool": "tpu-info hook", "capture_start_unix": start_unix,
                      "duration_s": round(seconds, 6), "events_after_seq": first_seq,
                      "events_through_seq": recorder.events.last_seq,
                      "time_unit": "microseconds since capture_start_unix",
                      "truncated": bool(left_out), "notes": notes},
    }
    return RemoteCapture(trace=json.dumps(doc, separators=(",", ":")).encode(),
                         format=WINDOW_FORMAT, files=files, notes=tuple(notes),
                         truncated=bool(left_out), event_count=len(doc["traceEvents"]))
