"""The command's clock: ``--timeout`` is its wall time, and every target is
still asked with a real wait however long the start took.

A command's deadline counts from the moment its process started (what
``time tpu-info`` measures), so a quiet machine ends within ``--timeout``.
On a loaded machine the start itself (Python, imports, discovery, local
scans: about 0.2 s of CPU, many seconds when 20 busy processes share 2
cores) can use the whole budget before any request is sent; a target is
then never failed unasked ("no time left"): requests sent after the
deadline still wait :data:`FIRST_WAIT_S` (or ``--timeout`` when less) for
their answer.

Example:
    >>> import time
    >>> now = time.monotonic()
    >>> round(wait_until(now - 5, timeout=3, now=now) - now, 3)  # the start took it all
    2.0
    >>> round(wait_until(now + 2.5, timeout=3, now=now) - now, 3)  # time is left
    2.5
"""

from __future__ import annotations

import os
import time

# What a request sent after the command's deadline still waits for its answer:
# a live target answers a snapshot in milliseconds on a quiet machine; at load
# 20 on 2 cores its server is starved too, and answers took 0.04-1 s.
FIRST_WAIT_S = 2.0


def process_started(stat_path: str = "/proc/self/stat") -> float:
    """``time.monotonic()`` of the moment this process started (exec), from
    the kernel's record of it (10 ms resolution); now when it cannot be read,
    or when the process is older than a minute (not a command just started)."""
    now = time.monotonic()
    try:
        with open(stat_path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0.0 <= age <= 60.0 else now


def first_wait(timeout: float) -> float:
    """The least a request waits for its answer: :data:`FIRST_WAIT_S`, or
    ``timeout`` when less."""
    return min(timeout, FIRST_WAIT_S)


def wait_until(deadline: float, timeout: float, now: float | None = None) -> float:
    """When requests sent ``now`` must have been answered: the command's
    ``deadline``, or ``now`` plus :func:`first_wait` when that is later."""
    now = time.monotonic() if now is None else now
    return max(deadline, now + first_wait(timeout))
