"""The capture the hook's gRPC server runs for ``Monitor.Capture``.

The server calls :func:`capture` on one of its threads. The trace comes
back as bytes; device traces are written into a fresh private temporary
folder this function creates (never a path the caller chose), read back
into the reply when they fit, and the folder removed. Files too large to
send stay there and are named in the reply.

Example:
    >>> import threading
    >>> out = capture(0.05, device=False, stop=threading.Event())
    >>> out.format, out.files
    ('chrome-json', [])
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from profiler.capture import Capture

__all__ = ["capture", "RemoteCapture", "RemoteFile", "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 24 * 1024 * 1024  # device files sent back, all together


@dataclass(frozen=True)
class RemoteFile:
    """One device-trace file: ``name`` is relative to the capture's folder;
    ``data`` is None when it was too large to send (it stays at ``server_path``)."""

    name: str
    size_bytes: int
    data: bytes | None = None
    server_path: str = ""


@dataclass
class RemoteCapture:
    """What the server puts in a ``CaptureReply``."""

    trace: bytes
    format: str = "chrome-json"
    files: list[RemoteFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    truncated: bool = False
    event_count: int = 0


def capture(duration_s: float, device: bool, stop: threading.Event) -> RemoteCapture:
    """Records for ``duration_s`` seconds (or until ``stop``) and returns the trace.

    Raises:
        InvalidCapture: a duration out of range.
        CaptureBusy: another capture is running in this process.
    """
    tmp = Path(tempfile.mkdtemp(prefix="tpu-info-capture-")) if device else None
    try:
        result = Capture(duration_s, device_dir=tmp).run(stop)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    out = RemoteCapture(trace=result.trace, notes=list(result.notes),
                        truncated=result.truncated, event_count=result.event_count)
    if tmp is None:
        return out
    sizes = [(p, p.stat().st_size) for p in result.device_files]
    send = sum(s for _, s in sizes) <= MAX_FILE_BYTES
    for p, size in sizes:
        name = p.relative_to(tmp).as_posix()
        if send:
            out.files.append(RemoteFile(name, size, data=p.read_bytes()))
        else:
            out.files.append(RemoteFile(name, size, server_path=str(p)))
    if send:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        out.notes.append(f"device traces total more than {MAX_FILE_BYTES} bytes: they stay "
                         f"on the server in {tmp}")
    return out
