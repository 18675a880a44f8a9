"""``profiler.trace(duration_s, path)``: a capture inside the program, written to a file.

The capture runs on a background thread so the program keeps training;
the returned :class:`TraceSession` ends it early (:meth:`TraceSession.stop`),
waits for the file (:meth:`TraceSession.wait`), or bounds a block of code
as a context manager. A path ending in ``.gz`` is gzip-compressed. Device
traces (``device=True``) go beside it, into ``<name>_device/``. A capture
still running at interpreter exit is ended and written.

Example:
    >>> import profiler, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
    >>> with profiler.trace(60, path) as session:
    ...     with profiler.Trace("work"):
    ...         pass
    >>> session.wait().path.name
    'trace.json'
"""

from __future__ import annotations

import atexit
import dataclasses
import gzip
import threading
from pathlib import Path
from typing import Any

from profiler.capture import Capture, CaptureResult

__all__ = ["TraceSession", "device_dir_for"]

_EXIT_WAIT_S = 30.0


def device_dir_for(path: Path) -> Path:
    """Where device traces of a capture written to ``path`` go: ``<stem>_device/``
    beside it (``run.json.gz`` -> ``run_device/``)."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return path.with_name(f"{name or 'trace'}_device")


def write_trace(path: Path, data: bytes) -> None:
    """Writes the trace JSON, gzip-compressed when ``path`` ends in ``.gz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


class TraceSession:
    """A capture running on a background thread, writing ``path`` when done.

    Built by :func:`profiler.trace`; its arguments are documented there.
    """

    def __init__(self, duration_s: float, path: str | Path, *, device: bool = False,
                 **limits: Any) -> None:
        self.path = Path(path)
        device_dir = device_dir_for(self.path) if device else None
        self._capture = Capture(duration_s, device_dir=device_dir, **limits)
        self._stop = threading.Event()
        self._result: CaptureResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tpu-info-capture",
                                        daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def _main(self) -> None:
        try:
            result = self._capture.run(self._stop)
            write_trace(self.path, result.trace)
            self._result = dataclasses.replace(result, path=self.path)
        except BaseException as e:  # noqa: BLE001 - handed to wait()'s caller
            self._error = e

    def _at_exit(self) -> None:
        self.stop()
        self._thread.join(_EXIT_WAIT_S)

    @property
    def done(self) -> bool:
        """Whether the capture has ended and the file is written (or failed)."""
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Ends the capture now instead of at the end of its duration."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> CaptureResult:
        """Waits for the file; returns the result (``.path``, ``.notes``, ...).

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
            OSError: the trace could not be written.
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the capture into {self.path} is still running")
        atexit.unregister(self._at_exit)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def __enter__(self) -> TraceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.wait()
