"""Who this process is, as the OS says it: its argv, program name, user and host.

The one place the hook reads them, each through
:func:`tpu_info.contract.safe.os_text`: the OS allows any bytes in an
argument, a path, a user or a host name, Python hands the ones that are not
UTF-8 over as lone surrogates (``surrogateescape``), and a snapshot, a
discovery record, a saved run, ``--json``, HTML and Prometheus labels can
only carry valid text. Such a byte becomes ``\\xNN`` (``caf\\xe9.txt``), so a
program given a Latin-1 file name is read, saved and shown like any other.

Example:
    >>> import sys
    >>> sys.argv = ["train.py", "/data/caf\\udce9.txt"]
    >>> argv()
    ('train.py', '/data/caf\\\\xe9.txt')
    >>> program()
    'train.py'
"""

from __future__ import annotations

import getpass
import os
import socket
import sys

from tpu_info.contract.safe import os_text

_last: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


def argv() -> tuple[str, ...]:
    """``sys.argv`` as valid text (the same tuple while ``sys.argv`` does not change)."""
    global _last
    raw = tuple(str(a) for a in sys.argv)
    seen, made = _last
    if raw == seen:
        return made
    made = tuple(os_text(a) for a in raw)
    _last = (raw, made)
    return made


def program(args: tuple[str, ...] | None = None) -> str:
    """The program's file name (``train.py``; ``-c`` for ``python -c``), or
    ``python`` when argv says nothing."""
    args = argv() if args is None else args
    return os.path.basename(args[0]) if args and args[0] else "python"


def user() -> str:
    """The user's name (its uid when it has none)."""
    try:
        return os_text(getpass.getuser())
    except Exception:  # noqa: BLE001 - no passwd entry nor LOGNAME: the uid
        return str(os.getuid())


def host() -> str:
    """This host's name."""
    return os_text(socket.gethostname())
