"""The one exception family of tpu-info.

Every error a client can meet while talking to a target is a
:class:`TpuInfoError` that carries the target (``host:port``) it concerns, so a
fan-out over many targets can report each failure on its own line.

Example:
    >>> from tpu_info.contract.errors import Unreachable, TpuInfoError
    >>> err = Unreachable("connection refused", target="localhost:1")
    >>> isinstance(err, TpuInfoError), err.target
    (True, 'localhost:1')
    >>> str(err)
    'localhost:1: connection refused'
"""

from __future__ import annotations


class TpuInfoError(Exception):
    """Base class: something went wrong talking to (or reading) a target.

    Attributes:
        target: the address concerned (``host:port``), or ``""`` when none.
        detail: the message without the target prefix.
    """

    def __init__(self, detail: str, *, target: str = "") -> None:
        self.detail = detail
        self.target = target
        super().__init__(f"{target}: {detail}" if target else detail)

    def with_target(self, target: str) -> TpuInfoError:
        """A copy of this error (same class) naming ``target``."""
        err = type(self)(self.detail, target=target)
        err.__cause__ = self.__cause__
        return err


class Unreachable(TpuInfoError):
    """Nothing accepted a connection there (refused, no route, bad address)."""


class TimedOut(TpuInfoError):
    """The target did not answer within the timeout."""


class NotAMonitor(TpuInfoError):
    """Something answered, but it is not a tpu-info or libtpu monitor (an HTTP
    server, another gRPC service, or a peer sending bytes that are not gRPC)."""


class ProtocolMismatch(TpuInfoError):
    """A monitor answered in a protocol version or shape this client cannot read."""


class WireError(ProtocolMismatch):
    """A reply decoded, but its contents are invalid (raised by :mod:`tpu_info.wire.codec`)."""


class ReplyTooLarge(TpuInfoError):
    """The reply exceeded the client's maximum message size."""


class ServerError(TpuInfoError):
    """The monitor answered with an error of its own (for example INTERNAL)."""


class CaptureBusy(ServerError):
    """A trace capture was refused because another one is running in that
    process; retry when it ends. The profiler raises it in the program (one
    capture at a time), and the client raises it when the hook answered so
    (``grpc_status``: the status the hook's server answers with)."""

    grpc_status = "ABORTED"


class CaptureRefused(ServerError):
    """A trace capture is for the program's owner on its host: no record of
    this user names the target, or the hook refused the caller."""
