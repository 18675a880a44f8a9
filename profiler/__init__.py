"""Step and region annotations, trace capture, one Chrome/Perfetto timeline.

Annotate with torch_xla's names, capture a window inside the program or
from outside it (``tpu-info profile --duration 5 -o trace.json``), and open
the file in https://ui.perfetto.dev or chrome://tracing: user spans per
thread, steps, compiles with their graph hash and recompile cause,
transfers, and counter tracks for HBM in use, compiles and transfer bytes
on one timeline.

Example:
    >>> import profiler, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json.gz")
    >>> session = profiler.trace(5, path)          # records in the background
    >>> for step in range(3):
    ...     with profiler.StepTrace("train_step", step_num=step):
    ...         with profiler.Trace("forward"):
    ...             pass
    >>> session.stop()                             # or let the 5 s run out
    >>> session.wait().path.name
    'trace.json.gz'

``import profiler`` imports neither jax nor torch; annotations cost one
flag check while no capture runs. It registers :func:`profiler.remote.capture`
with the exporter (:func:`metrics.export.register_capture`), so ``tpu-info
profile`` can trace the program: ``metrics`` never imports ``profiler``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from metrics.export import captures
from profiler.annotations import StepTrace, Trace
from profiler.capture import (
    DEFAULT_MAX_ANNOTATIONS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    MAX_DURATION_S,
    CaptureResult,
)
from profiler.errors import CaptureBusy, InvalidCapture, ProfilerError, ServerNotStarted
from profiler.local import TraceSession

__all__ = ["Trace", "StepTrace", "start_server", "trace", "TraceSession", "CaptureResult",
           "ProfilerError", "CaptureBusy", "InvalidCapture", "ServerNotStarted",
           "MAX_DURATION_S"]


def _remote_capture(duration_s: float, device: bool, stop: threading.Event) -> Any:
    """What the exporter's ``Monitor.Capture`` runs: :func:`profiler.remote.capture`
    (loaded at the first capture: ``import profiler`` stays light)."""
    from profiler import remote

    return remote.capture(duration_s, device, stop)


captures.register_capture(_remote_capture)


def start_server(port: int | None = None) -> str:
    """Makes sure the hook's gRPC server runs (``metrics.install(serve=True)``)
    and returns its ``host:port``; ``tpu-info profile`` captures through it.

    Args:
        port: pin the port (default: the exporter's rule: ``$TPU_INFO_PORT``,
            else 8431 when free, else any free port). Ignored when the
            server already runs.

    Raises:
        ServerNotStarted: the server could not start (for example the port is taken).
    """
    import metrics

    metrics.install(serve=True, port=port)
    exporter = metrics.exporter()
    if exporter is None or exporter.stopped:
        raise ServerNotStarted("the tpu-info server did not start; the log says why")
    return str(exporter.address)


def trace(
    duration_s: float,
    path: str | Path,
    *,
    device: bool = False,
    max_annotations: int = DEFAULT_MAX_ANNOTATIONS,
    max_events: int = DEFAULT_MAX_EVENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    **options: Any,
) -> TraceSession:
    """Starts capturing for ``duration_s`` seconds into ``path``, in the background.

    Args:
        duration_s: seconds to record (at most 300).
        path: the Chrome trace JSON to write; gzip-compressed if it ends in ``.gz``.
        device: also run ``jax.profiler`` / ``torch.profiler`` (for the engines
            imported) into ``<name>_device/`` beside ``path``.
        max_annotations: annotation entries and exits kept at most.
        max_events: hook events (compiles, transfers, steps) kept at most.
        max_bytes: largest JSON written (its latest events are cut to fit).
        **options: ``sample_interval_s`` (memory sampling period, default 0.1).

    Returns:
        The running :class:`TraceSession`: ``.wait()`` returns the
        :class:`CaptureResult`, ``.stop()`` ends it early; as a context
        manager the capture ends with the block.

    Raises:
        CaptureBusy: another capture is running in this process.
        InvalidCapture: a duration or limit out of range.
    """
    return TraceSession(duration_s, path, device=device, max_annotations=max_annotations,
                        max_events=max_events, max_bytes=max_bytes, **options)
