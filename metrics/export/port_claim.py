"""This user's hooked programs take turns at libtpu's port (8431).

Each program probes 8431 with a plain socket and, when it is free, binds it
with gRPC; a program that binds it between another's probe and bind makes
that one's gRPC print ``Failed to add port ... Address already in use``
into its stderr (eight programs started together: 3 to 7 of them did). So
the probe and the bind are made under an exclusive lock on a file in the
user's runtime directory, waited for at most :data:`WAIT_S` (the holder
binds in about a millisecond); a program that cannot have it in time, or
has no runtime directory, does not try 8431 (an ephemeral port instead).

Example:
    >>> with claimed(8431) as mine:                         # doctest: +SKIP
    ...     if mine and port_free(...): bind(8431)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from metrics.export import discovery
from tpu_info.contract import discovery_record as _record

WAIT_S = 1.0


@contextlib.contextmanager
def claimed(port: int) -> Iterator[bool]:
    """Holds this user's lock on ``port`` for the block; yields whether it
    was had (False: none could be had in time: leave the port alone)."""
    fd = -1
    try:
        dir_fd = discovery.ensure_private_dir(_record.runtime_dir())
        try:
            fd = os.open(f"port-{port}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    fd = -1
                    break
                time.sleep(0.002)
    except OSError:
        if fd >= 0:
            os.close(fd)
        fd = -1
    try:
        yield fd >= 0
    finally:
        if fd >= 0:
            os.close(fd)  # (the lock goes with it)
