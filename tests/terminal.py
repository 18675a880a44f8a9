"""A program run on a real pseudo-terminal, for tests of what a terminal shows."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path


def on_a_pty(argv: list[str], env: dict[str, str], cwd: Path | str, width: int | None = None,
             timeout: float = 60) -> bytes:
    """Everything ``argv`` wrote to a pseudo-terminal (``width`` columns wide
    when given, else the pty's default), once it exited 0."""
    main, sub = pty.openpty()
    if width is not None:
        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    proc = subprocess.Popen(argv, stdin=sub, stdout=sub, stderr=sub, env=env, cwd=cwd)
    os.close(sub)
    out = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(main)
    assert proc.wait(timeout) == 0, out[-3000:]
    return out
