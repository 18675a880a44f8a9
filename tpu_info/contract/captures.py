"""A trace capture's reply (``tpu_info.v1.Monitor/Capture``) as one record:
the profiler builds it in the program, the hook's server sends it, the
client decodes it, and ``tpu-info profile`` writes it out.

Example:
    >>> cap = RemoteCapture(trace=b'{"traceEvents": []}', files=(CaptureFile("d.pb", 3, b"abc"),))
    >>> cap.format, cap.files[0].size_bytes
    ('chrome-json', 3)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CaptureFile", "RemoteCapture", "CHROME_JSON", "WINDOW_FORMAT"]

CHROME_JSON = "chrome-json"  # the whole trace, built in the program by the profiler
# A program that never loaded the profiler: the reply is a Chrome trace with
# only the window (otherData: capture_start_unix, duration_s, events_after_seq)
# and the device files; ``tpu-info profile`` fills in the host timeline from
# the hook's events and snapshots of that window. Still valid Chrome JSON, so
# an older client writes an empty timeline with a note, not a broken file.
WINDOW_FORMAT = "tpu-info-window"


@dataclass(frozen=True, slots=True)
class CaptureFile:
    """A device-profiler file of a capture: ``name`` is the hook's label for
    it (relative to the capture's folder; never a local path to use);
    ``data`` is None when an older hook kept it on its host (``server_path``)."""

    name: str
    size_bytes: int
    data: bytes | None = None
    server_path: str = ""


@dataclass(frozen=True, slots=True)
class RemoteCapture:
    """A capture's reply: the Chrome trace JSON and what came with it."""

    trace: bytes
    format: str = CHROME_JSON
    files: tuple[CaptureFile, ...] = ()
    notes: tuple[str, ...] = ()
    truncated: bool = False
    event_count: int = 0
