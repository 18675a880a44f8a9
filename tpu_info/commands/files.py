"""Files the commands write, whole or not at all.

A write that fails half way (a full disk, a file-size limit, a quota) must
not leave a truncated or empty file where the user expects a trace:
:func:`write_all` writes each file to a temporary name in its destination's
directory and renames them into place only after every write succeeded
(``rename`` within one directory is atomic), removing the temporaries when
any write fails. A destination that exists and is not a regular file
(``/dev/stdout``, a FIFO) is written directly: a device is never replaced.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_all([(d / "a.json", b"{}")])
    >>> (d / "a.json").read_bytes()
    b'{}'
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path


def _special(path: Path) -> bool:
    """Whether ``path`` exists and is not a regular file (a device, a FIFO)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _write_temp(path: Path, data: bytes) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a full disk can show only here (delayed allocation)
        os.chmod(name, 0o666 & ~_umask())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_all(files: Sequence[tuple[Path, bytes]]) -> None:
    """Writes every ``(path, data)`` whole, or none of the regular files.

    Raises:
        OSError: a write, a rename or the temporary file failed; no
            temporary file is left, and no destination was replaced.
    """
    done: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            if _special(path):
                continue
            done.append((_write_temp(path, data), path))
    except BaseException:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)
        raise
    try:
        for tmp, path in done:
            os.replace(tmp, path)
    finally:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)
    for path, data in files:  # devices last: nothing of ours is left half written
        if _special(path):
            path.write_bytes(data)
