"""The trace capture the exporter serves, registered by whoever provides one.

``metrics`` records; ``profiler`` captures, and depends on ``metrics``, so
``metrics`` never imports ``profiler``. Instead ``import profiler`` calls
:func:`register_capture` with its capture (``profiler.remote.capture``),
and ``Monitor.Capture`` runs whatever is registered when a call comes, so
the order of ``import profiler`` and ``metrics.install()`` does not matter.
A program that never imported the profiler runs the hook's own capture
instead (``run``'s ``default``: :mod:`metrics.export.capture_window`, the
window and the device traces; ``tpu-info profile`` builds the host timeline
from the hook's events); ``tpu-info run`` (the program's stand-in start-up
code, which wires the two together) registers one that loads the profiler
at the first capture.

This module imports only the standard library and the contract's capture
record (:class:`tpu_info.contract.captures.RemoteCapture`): ``import profiler`` reaches
it without loading grpc.

Example:
    >>> import threading
    >>> previous = registered_capture()
    >>> register_capture(lambda duration_s, device, stop: f"{duration_s:g} s")
    >>> run(0.5, False, threading.Event())
    '0.5 s'
    >>> register_capture(previous)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from tpu_info.contract.captures import RemoteCapture
from tpu_info.contract.model import Snapshot

if TYPE_CHECKING:
    from metrics.export.owner import Caller

__all__ = ["CaptureFn", "SnapshotFn", "Recorder", "ProfilerNotLoaded", "status_name",
           "register_capture", "registered_capture", "run", "NOT_LOADED"]

log = logging.getLogger("metrics.export")

# grpc.StatusCode's error names, spelled out: this module stays free of grpc,
# which a program serving from its helper never loads (its import and its
# teardown at exit cost the program; a test checks the list against grpc's).
STATUS_NAMES = frozenset({
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"})


# recorder(duration_s, device, stop): records until the duration ends or
# ``stop`` is set, returns the trace; what :func:`register_capture` takes.
Recorder = Callable[[float, bool, threading.Event], RemoteCapture]

# capture_fn(duration_s, device, stop, caller): what the server calls (the
# program's gate: metrics._capture). It checks the caller (who, from where:
# metrics.export.owner), then records until the duration ends or ``stop``
# is set (the client went away, the server stops). Errors it raises answer
# with the status named by their ``grpc_status`` attribute
# (PERMISSION_DENIED for a caller who is not the owner, ABORTED for a
# capture already running), INVALID_ARGUMENT for a ValueError, else INTERNAL.
CaptureFn = Callable[[float, bool, threading.Event, "Caller"], RemoteCapture]

# snapshot_fn(since): the program's snapshot with the events after ``since``;
# what a server (in the program, or its helper's link) answers reads with.
SnapshotFn = Callable[[int], Snapshot]

NOT_LOADED = ("this program has not loaded the profiler, so it cannot be traced: add "
              "`import profiler` to it (or start it with `tpu-info run`)")


class ProfilerNotLoaded(Exception):
    """A capture was asked for, but nothing registered one (no ``import profiler``)."""

    grpc_status = "FAILED_PRECONDITION"


_lock = threading.Lock()
_registered: Recorder | None = None


def register_capture(recorder: Recorder | None) -> None:
    """Makes ``recorder`` the capture ``Monitor.Capture`` runs (None: none);
    the last registration wins."""
    global _registered
    with _lock:
        _registered = recorder


def registered_capture() -> Recorder | None:
    """The registered capture, or None."""
    return _registered


def run(duration_s: float, device: bool, stop: threading.Event,
        default: Recorder | None = None) -> RemoteCapture:
    """Runs the registered capture, else ``default``.

    Raises:
        ProfilerNotLoaded: nothing is registered and there is no default.
    """
    recorder = _registered or default
    if recorder is None:
        raise ProfilerNotLoaded(NOT_LOADED)
    return recorder(duration_s, device, stop)


def status_name(error: Exception) -> str:
    """The grpc status (its name) a capture function's exception answers with:
    its ``grpc_status`` attribute, INVALID_ARGUMENT for a ValueError, else
    INTERNAL (logged)."""
    named = getattr(error, "grpc_status", None)
    if isinstance(named, str) and named in STATUS_NAMES:
        return named
    if isinstance(error, ValueError):
        return "INVALID_ARGUMENT"
    log.warning("tpu-info: trace capture failed: %r", error)
    return "INTERNAL"
