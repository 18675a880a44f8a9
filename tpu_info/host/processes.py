"""Who a process is, from ``/proc``: its name, user and command line.

Google's ``tpu-info -p`` and nvidia-smi name every process that holds an
accelerator, hooked or not; this is how the host scan does it without psutil
(plain reads keep ``tpu-info``'s start-up fast). ``proc_root`` is an argument
so tests point it at a fixture tree.

Example:
    >>> describe(1, proc_root="/nonexistent")
    OwnerRecord(pid=1, name='', user='', command='')
    >>> real_uid(1, proc_root="/nonexistent") is None
    True
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable

from tpu_info.contract.model import OwnerRecord

PROC_ROOT = "/proc"
COMMAND_CHARS = 500  # a command line is shown, not parsed: enough to recognise it


def _read(path: str, limit: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _uid(status: bytes) -> int | None:
    """The real uid in ``/proc/<pid>/status`` (None: not there)."""
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    return None


def _user(status: bytes) -> str:
    """The real uid's name from ``/proc/<pid>/status`` (the uid when unnamed)."""
    uid = _uid(status)
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a container's uid without a passwd entry
        return str(uid)


def real_uid(pid: int, proc_root: str = PROC_ROOT) -> int | None:
    """``pid``'s real uid from ``/proc/<pid>/status``: whose process it is (the
    uid the kernel checks a signal against); None when it is gone or unreadable."""
    return _uid(_read(os.path.join(proc_root, str(pid), "status")))


def short_name(argv: list[str], comm: str) -> str:
    """What a table calls a process: a Python program by its script
    (``train.py``), module (``-m trainer``) or ``python3 -c``; anything else by
    its executable's base name; ``comm`` when the command line is unreadable."""
    if not argv:
        return comm
    exe = os.path.basename(argv[0]) or argv[0]
    if exe.startswith("python") and len(argv) > 1:
        rest = [a for a in argv[1:] if not (a.startswith("-") and a not in ("-c", "-m"))]
        if rest[:1] == ["-m"] and len(rest) > 1:
            return f"-m {rest[1]}"
        if rest[:1] == ["-c"]:
            return f"{exe} -c"
        if rest:
            return os.path.basename(rest[0]) or rest[0]
    return exe


def describe(pid: int, proc_root: str = PROC_ROOT) -> OwnerRecord:
    """``pid``'s name (:func:`short_name`), user and command line; empty
    fields for what is unreadable."""
    where = os.path.join(proc_root, str(pid))
    comm = _read(os.path.join(where, "comm"), 256).decode("utf-8", "replace").strip()
    argv = [a.decode("utf-8", "replace")
            for a in _read(os.path.join(where, "cmdline"), COMMAND_CHARS * 4).split(b"\0") if a]
    command = " ".join(argv)[:COMMAND_CHARS]
    name = short_name(argv, comm)
    user = _user(_read(os.path.join(where, "status")))
    return OwnerRecord(pid=pid, name=name, user=user, command=command)


def describe_all(pids: Iterable[int], proc_root: str = PROC_ROOT) -> tuple[OwnerRecord, ...]:
    """:func:`describe` for each distinct pid, in pid order."""
    return tuple(describe(p, proc_root) for p in sorted(set(pids)))
