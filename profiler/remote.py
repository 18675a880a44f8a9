"""The capture the hook's gRPC server runs for ``Monitor.Capture`` once the
program loaded the profiler (annotations included).

The server calls :func:`capture` on one of its threads, after
:mod:`metrics.export.owner` has found the caller to be the program's owner.
The trace comes back as bytes. Device traces (only when the program opted
in) go through :mod:`metrics.export.device_capture`: a private temporary
folder, capped files sent back, the folder removed whatever happens.

Example:
    >>> import threading
    >>> out = capture(0.05, device=False, stop=threading.Event())
    >>> out.format, out.files
    ('chrome-json', ())
"""

from __future__ import annotations

import threading

from metrics.export import device_capture
from profiler.capture import Capture
from profiler.errors import InvalidCapture
from tpu_info.contract.captures import CaptureFile, RemoteCapture

__all__ = ["capture"]


def capture(duration_s: float, device: bool, stop: threading.Event) -> RemoteCapture:
    """Records for ``duration_s`` seconds (or until ``stop``) and returns the trace.

    Raises:
        InvalidCapture: a duration out of range (device traces: at most
            :data:`metrics.export.device_capture.MAX_DEVICE_DURATION_S`).
        CaptureBusy: another capture is running in this process.
    """
    if device and (why := device_capture.too_long(duration_s)):
        raise InvalidCapture(why)
    with device_capture.private_folder(device) as tmp:
        result = Capture(duration_s, device_dir=tmp).run(stop)
        files: tuple[CaptureFile, ...] = ()
        notes, truncated = result.notes, result.truncated
        if tmp is not None:
            files, left_out = device_capture.read_files(tmp, result.device_files)
            if left_out:
                notes, truncated = (*notes, left_out), True
        return RemoteCapture(trace=result.trace, files=files, notes=tuple(notes),
                             truncated=truncated, event_count=result.event_count)
