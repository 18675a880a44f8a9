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
    ('chrome-json', ())
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
from pathlib import Path

from profiler.capture import Capture
from profiler.errors import InvalidCapture
from tpu_info.contract.captures import CaptureFile, RemoteCapture

__all__ = ["capture", "MAX_FILE_BYTES", "MAX_FILES",
           "MAX_DEVICE_DURATION_S", "TEMP_PREFIX"]

MAX_FILE_BYTES = 24 * 1024 * 1024  # device files sent back, all together
MAX_FILES = 16                     # device files sent back (jax writes 1-2, torch 1)
# A device trace grows the program by hundreds of MB a second (a JAX loop at
# 2,000 steps/s: 0.3 -> 2.8 GB RSS in 10 s), so device windows are short.
MAX_DEVICE_DURATION_S = 10.0
TEMP_PREFIX = "tpu-info-capture-"  # + "<pid>-<random>"
_SWEEP_ENTRIES = 10_000  # temp-dir entries looked at for abandoned folders, at most


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
        files: tuple[CaptureFile, ...] = ()
        notes, truncated = result.notes, result.truncated
        if tmp is not None:
            files, left_out = _read_files(tmp, result.device_files)
            if left_out:
                notes, truncated = (*notes, left_out), True
        return RemoteCapture(trace=result.trace, files=files, notes=tuple(notes),
                             truncated=truncated, event_count=result.event_count)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            _return_freed_memory()


def _read_files(folder: Path, paths: Sequence[Path]) -> tuple[tuple[CaptureFile, ...], str]:
    """The device files in order while they fit the caps, and a note naming
    the rest ("" when none was left out; their folder is removed all the same)."""
    room = MAX_FILE_BYTES
    files: list[CaptureFile] = []
    left_out: list[tuple[str, int]] = []
    for p in paths:
        name = p.relative_to(folder).as_posix()
        size = p.stat().st_size
        if len(files) >= MAX_FILES or size > room:
            left_out.append((name, size))
            continue
        files.append(CaptureFile(name, size, data=p.read_bytes()))
        room -= size
    if not left_out:
        return tuple(files), ""
    total = sum(s for _, s in left_out)
    return tuple(files), (f"{len(left_out)} device trace file(s) ({total / 1e6:.1f} MB) left "
                          f"out: a capture sends at most {MAX_FILES} files and "
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
