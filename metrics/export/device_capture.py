"""Where a remote capture's device traces go, and what of them is sent.

Device traces of a ``Monitor.Capture`` (only when the program opted in, at
most :data:`MAX_DEVICE_DURATION_S`) are written into a fresh private
temporary folder made here (never a path the caller chose), read back into
the reply up to :data:`MAX_FILES` files and :data:`MAX_FILE_BYTES` bytes,
and the folder is removed whatever happens (sent, too large, the client
gone, the capture failed): nothing stays on the program's disk. Folders of
this user's processes that were killed mid-capture are removed by the next
device capture on the host. Both captures use it: the profiler's
(``profiler.remote``) and the hook's own (:mod:`metrics.export.capture_window`).

Example:
    >>> with private_folder(False) as folder:
    ...     folder is None
    True
    >>> too_long(30.0) is not None, too_long(2.0)
    (True, None)
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tpu_info.contract.captures import CaptureFile

__all__ = ["MAX_FILE_BYTES", "MAX_FILES", "MAX_DEVICE_DURATION_S", "TEMP_PREFIX",
           "too_long", "private_folder", "read_files"]

MAX_FILE_BYTES = 24 * 1024 * 1024  # device files sent back, all together
MAX_FILES = 16                     # device files sent back (jax writes 1-2, torch 1)
# A device trace grows the program by hundreds of MB a second (a JAX loop at
# 2,000 steps/s: 0.3 -> 2.8 GB RSS in 10 s), so device windows are short.
MAX_DEVICE_DURATION_S = 10.0
TEMP_PREFIX = "tpu-info-capture-"  # + "<pid>-<random>"
_SWEEP_ENTRIES = 10_000  # temp-dir entries looked at for abandoned folders, at most


def too_long(duration_s: float) -> str | None:
    """Why a device window of ``duration_s`` is refused (None: it is not)."""
    if duration_s <= MAX_DEVICE_DURATION_S:
        return None
    return (f"device traces are at most {MAX_DEVICE_DURATION_S:g} s "
            f"(they cost the program memory), got {duration_s:g} s")


@contextmanager
def private_folder(device: bool) -> Iterator[Path | None]:
    """A fresh private folder for one capture's device traces (None when
    ``device`` is false), removed on the way out with the memory its
    profilers freed handed back."""
    if not device:
        yield None
        return
    _sweep_abandoned(Path(tempfile.gettempdir()))
    folder = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _return_freed_memory()


def read_files(folder: Path, paths: Sequence[Path]) -> tuple[tuple[CaptureFile, ...], str]:
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
