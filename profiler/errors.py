"""Errors the profiler raises.

Each carries ``grpc_status``, the name of the ``grpc.StatusCode`` the hook's
server answers a remote capture with when the error happens there (the
server reads the name; it never imports the profiler).

Example:
    >>> from profiler.errors import CaptureBusy
    >>> CaptureBusy("a capture is already running").grpc_status
    'ABORTED'
"""

from __future__ import annotations

__all__ = ["ProfilerError", "CaptureBusy", "InvalidCapture", "ServerNotStarted"]


class ProfilerError(Exception):
    """Base class of the profiler's errors."""

    grpc_status = "INTERNAL"


class CaptureBusy(ProfilerError):
    """Another capture is running in this process (one at a time); retry when it ends."""

    grpc_status = "ABORTED"


class InvalidCapture(ProfilerError, ValueError):
    """A capture was asked for with a bad duration or limit."""

    grpc_status = "INVALID_ARGUMENT"


class ServerNotStarted(ProfilerError):
    """The hook's gRPC server could not be started (the log says why)."""

    grpc_status = "UNAVAILABLE"
