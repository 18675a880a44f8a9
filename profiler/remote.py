"""The capture the hook's gRPC server runs for ``Monitor.Capture``.

The server calls :func:`capture` on one of its threads, after
:mod:`metrics.export.owner` has found the caller to be the program's owner.
The trace comes back as bytes. Device traces (only when the program opted
in, at most :data:`MAX_DEVICE_DURATION_S`) are written into a fresh private
temporary folder this function creates (never a path the caller chose),
read back into the reply up to :data:`MAX_FILES` files and
:data:`MAX_FILE_BYTES` bytes, and the folder is removed whatever happens
(sent, too large, the client gone, the capture failed): nothing stays on
the program's disk. Folders of this user's processes that were killed
mid-capture are removed by the next device capture on the host.

Example:
    >>> import threading
    >>> out = capture(0.05, device=False, stop=threading.Event())
    >>> out.format, out.files
    ('chrome-json', [])
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profiler.capture import Capture
from profiler.errors import InvalidCapture

__all__ = ["capture", "RemoteCapture", "RemoteFile", "MAX_FILE_BYTES", "MAX_FILES",
           "MAX_DEVICE_DURATION_S", "TEMP_PREFIX"]

MAX_FILE_BYTES = 24 * 1024 * 1024  # device files sent back, all together
MAX_FILES = 16                     # device files sent back (jax writes 1-2, torch 1)
# A device trace grows the program by hundreds of MB a second (a JAX loop at
# 2,000 steps/s: 0.3 -> 2.8 GB RSS in 10 s), so device windows are short.
MAX_DEVICE_DURATION_S = 10.0
TEMP_PREFIX = "tpu-info-capture-"  # + "<pid>-<random>"
_SWEEP_ENTRIES = 10_000  # temp-dir entries looked at for abandoned folders, at most


@dataclass(frozen=True)
class RemoteFile:
    """One device-trace file: ``name`` is relative to the capture's folder (a
    label for the client, which chooses its own file names); ``data`` its bytes.
    ``server_path`` is always empty: no file is left on the program's host."""

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
        InvalidCapture: a duration out of range (device traces: at most
            :data:`MAX_DEVICE_DURATION_S`).
        CaptureBusy: another capture is running in this process.
    """
    if device and duration_s > MAX_DEVICE_DURATION_S:
        raise InvalidCapture(f"device traces are at most {MAX_DEVICE_DURATION_S:g} s "
                             f"(they cost the program memory), got {duration_s:g} s")
    tmp = None
    if device:
        _sweep_abandoned(Path(tempfile.gettempdir()))
        tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        result = Capture(duration_s, device_dir=tmp).run(stop)
        out = RemoteCapture(trace=result.trace, notes=list(result.notes),
                            truncated=result.truncated, event_count=result.event_count)
        if tmp is not None:
            _attach(out, tmp, result.device_files)
        return out
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            _return_freed_memory()


def _attach(out: RemoteCapture, folder: Path, paths: Sequence[Path]) -> None:
    """Reads the device files into ``out`` in order while they fit the caps;
    the rest are named in a note (their folder is removed all the same)."""
    room = MAX_FILE_BYTES
    left_out: list[tuple[str, int]] = []
    for p in paths:
        name = p.relative_to(folder).as_posix()
        size = p.stat().st_size
        if len(out.files) >= MAX_FILES or size > room:
            left_out.append((name, size))
            continue
        out.files.append(RemoteFile(name, size, data=p.read_bytes()))
        room -= size
    if left_out:
        total = sum(s for _, s in left_out)
        out.truncated = True
        out.notes.append(f"{len(left_out)} device trace file(s) ({total / 1e6:.1f} MB) left out: "
                         f"a capture sends at most {MAX_FILES} files and "
                         f"{MAX_FILE_BYTES // 2**20} MiB; record a shorter window")


def _sweep_abandoned(root: Path) -> None:
    """Removes capture folders under ``root`` that this user's dead processes
    left (a ``kill -9`` mid-capture skips every ``finally``)."""
    uid = os.geteuid()
    try:
        with os.scandir(root) as entries:
            for n, entry in enumerate(entries):
                if n >= _SWEEP_ENTRIES:
                    return
                pid = entry.name.removeprefix(TEMP_PREFIX).partition("-")[0]
                if not entry.name.startswith(TEMP_PREFIX) or not pid.isdigit():
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not _alive(int(pid)):
                    shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass  # an unreadable temp dir: nothing to sweep


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists (another user's) or cannot tell: leave it
    return True


def _return_freed_memory() -> None:
    """Hands the device profilers' freed buffers back to the OS (glibc keeps
    them otherwise: the program would stay gigabytes larger after a capture)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc
