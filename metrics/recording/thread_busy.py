"""How busy the training thread keeps itself: its CPU time over wall time, a
sample a second of the step loop after its first few (``TrainingThreadBusy``);
the time it was ready to run but waited for a core (Linux's schedstat, where
the OS tells it) is out of the wall time: on a loaded machine a host-bound
thread read 50-80 % and the copies' and host work's bounds took it for one
waiting on the device.

Whether a host-side cost (a numpy batch's copy made inside the jitted call)
lengthens the loop depends on who sets its pace. Near 100 % the thread never
waited: the host set the pace and every microsecond of its work is on the
loop's critical path. Low, it waited for the device (a read, or dispatch held
back by a full queue: neither spends CPU time), so host work overlapped
device work. The device's own sampled times cannot tell the two apart: they
are upper bounds (the watcher wakes when the training thread lets go of the
interpreter lock), and on the TPU machine a host-bound step whose loop runs
at 195 us a step sampled 471 us (``bench/RESULTS-TPU.md``).

Read on the step function's timed calls, at most once a :data:`SPACING_NS`
(the first :data:`FIRST` samples :data:`FIRST_SPACING_NS` apart, so a loop of
a few seconds has a median to stand on: on the TPU a 2 s host-bound loop had
one sample, and the reader wants three): one clock read there already, then
a thread CPU-time read (a system call: 5.6 us under gVisor) and a read of
``/proc/thread-self/schedstat``.

Example:
    >>> busy = ThreadBusy(samples.append)                   # doctest: +SKIP
    >>> busy.tick(time.monotonic_ns())  # on the training thread  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SCHEDSTAT = "/proc/thread-self/schedstat"

SPACING_NS = 1_000_000_000
FIRST, FIRST_SPACING_NS = 8, 200_000_000


def run_queue_wait_ns() -> int | None:
    """ns this thread has waited for a core so far (Linux schedstat's second
    field), None where not told (gVisor, another OS)."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class ThreadBusy:
    """Ticks from the training thread; each tick a second or more after the
    last (on the same thread) observes the CPU share of the time between."""

    __slots__ = ("_observe", "_next", "_thread", "_wall", "_cpu", "_ticks", "_waited",
                 "_wait")

    def __init__(self, observe: Callable[[float, int], None],
                 waited: Callable[[], int | None] | None = None) -> None:
        self._observe = observe  # (percent, at ns): a distribution's observe_at
        self._next = 0
        self._thread = 0
        self._wall = self._cpu = 0
        self._ticks = 0
        self._waited = run_queue_wait_ns if waited is None else waited
        self._wait: int | None = None

    def tick(self, now: int) -> None:
        """The step's timed call ended at ``now`` (monotonic ns), on this thread."""
        if now < self._next:
            return
        self._ticks += 1
        self._next = now + (FIRST_SPACING_NS if self._ticks <= FIRST else SPACING_NS)
        thread, cpu, wait = threading.get_ident(), time.thread_time_ns(), self._waited()
        if thread == self._thread and now > self._wall:
            # Time the thread was ready to run but waited for a core (a loaded
            # machine) is not time it waited for the device: out of the wall.
            queued = wait - self._wait if wait is not None and self._wait is not None else 0
            span = max(now - self._wall - max(0, queued), cpu - self._cpu, 1)
            self._observe(min(100.0, 100.0 * (cpu - self._cpu) / span), now)
        self._thread, self._wall, self._cpu, self._wait = thread, now, cpu, wait
