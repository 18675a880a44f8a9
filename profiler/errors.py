"""Errors the profiler raises.

Each carries ``grpc_status``, the name of the ``grpc.StatusCode`` the hook's
server answers a remote capture with when the error happens there (the
server reads the name; it never imports the profiler). :class:`CaptureBusy`
is :class:`tpu_info.contract.errors.CaptureBusy`: one error whether the capture that
was refused is local or remote.

Example:
    >>> from profiler.errors import CaptureBusy
    >>> CaptureBusy("a capture is already running").grpc_status
    'ABORTED'
"""

from __future__ import annotations

from tpu_info.contract.errors import CaptureBusy

__all__ = ["ProfilerError", "CaptureBusy", "InvalidCapture", "ServerNotStarted"]


class ProfilerError(Exception):
    """Base class of the profiler's errors."""

    grpc_status = "INTERNAL"


class InvalidCapture(ProfilerError, ValueError):
    """A capture was asked for with a bad duration or limit."""

    grpc_status = "INVALID_ARGUMENT"


class ServerNotStarted(ProfilerError):
    """The hook's gRPC server could not be started (the log says why)."""

    grpc_status = "UNAVAILABLE"
