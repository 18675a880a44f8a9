"""Who may make the program do work beyond reading a snapshot: its owner, on its host.

Snapshots (``GetSnapshot``, ``StreamSnapshots``, ``ListMetrics``) and libtpu's
``RuntimeMetricService`` stay open to every local caller, as libtpu's are.
A trace capture makes the program record, allocate and write files, so it is
granted only to a caller that

* sends this process's capture secret (:func:`metrics.export.discovery.capture_secret`)
  as the gRPC metadata :data:`TOKEN_KEY`: the secret is written only into
  the 0600 discovery record, so sending it proves the caller can read that
  record (the program's user, or root); and
* connects over loopback (``context.peer()``), so a secret that leaked does
  not open captures to other hosts, whatever ``TPU_INFO_BIND`` says.

The check runs where the secret is known, in the program: the serve="process"
helper forwards the token and the peer it saw, and the program decides.

Example:
    >>> is_loopback_peer("ipv4:127.0.0.1:5000"), is_loopback_peer("ipv4:192.0.2.2:5000")
    (True, False)
    >>> check(Caller(token="s3cret", peer="ipv6:[::1]:5000"), "s3cret")  # allowed: no error
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpu_info.contract.discovery_record import CAPTURE_TOKEN_METADATA
from tpu_info.net.targets import is_loopback_host

if TYPE_CHECKING:  # the program imports this module through its helper, which needs no grpc
    import grpc

__all__ = ["TOKEN_KEY", "Caller", "NotOwner", "caller_of", "check", "is_loopback_peer"]

TOKEN_KEY = CAPTURE_TOKEN_METADATA
_MAX_TOKEN_CHARS = 256


class NotOwner(Exception):
    """The caller is not the program's owner on this host; answers PERMISSION_DENIED."""

    grpc_status = "PERMISSION_DENIED"


@dataclass(frozen=True)
class Caller:
    """Who asks for a capture: the token they sent ("" if none) and their
    address as grpc names it (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""

    token: str = field(default="", repr=False)
    peer: str = ""


def caller_of(context: grpc.ServicerContext) -> Caller:
    """The :class:`Caller` of an RPC: its :data:`TOKEN_KEY` metadata and peer."""
    token = ""
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_KEY and isinstance(value, str):
            token = value[:_MAX_TOKEN_CHARS]
    return Caller(token=token, peer=context.peer() or "")


def is_loopback_peer(peer: str) -> bool:
    """Whether a grpc peer string is a loopback connection (``ipv4:127.x``,
    ``ipv6:[::1]``, IPv4-mapped loopback) or a unix socket; anything else,
    an empty or unparsable string included, is not."""
    scheme, _, rest = peer.partition(":")
    if scheme == "unix":
        return True  # a unix socket is reachable from this host only
    if scheme == "ipv4":
        host = rest.rpartition(":")[0]
    elif scheme == "ipv6":
        host = rest.rpartition("]")[0].removeprefix("[").replace("%25", "%")
        host = host.partition("%")[0]  # a zone id (fe80::1%eth0) is not loopback anyway
    else:
        return False
    return bool(host) and host != "localhost" and is_loopback_host(host)


def check(caller: Caller, secret: str) -> None:
    """Allows the capture, or raises :class:`NotOwner` saying why.

    Args:
        caller: who asks.
        secret: this process's capture secret ("" refuses everyone).
    """
    if not is_loopback_peer(caller.peer):
        raise NotOwner("captures are only taken over loopback, from the program's own host; "
                       "run tpu-info profile on that host, as the user who runs the program")
    if not (secret and caller.token
            and hmac.compare_digest(caller.token.encode(), secret.encode())):
        raise NotOwner("captures are for the program's owner: run tpu-info profile as the "
                       "user who runs the program, on its host (it reads the program's "
                       "private discovery record)")
