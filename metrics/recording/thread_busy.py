"""How busy the training thread keeps itself: its CPU time over wall time, a
sample a second of the step loop after its first few (``TrainingThreadBusy``).

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
a thread CPU-time read (a system call: 5.6 us under gVisor).

Example:
    >>> busy = ThreadBusy(samples.append)                   # doctest: +SKIP
    >>> busy.tick(time.monotonic_ns())  # on the training thread  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SPACING_NS = 1_000_000_000
FIRST, FIRST_SPACING_NS = 8, 200_000_000


class ThreadBusy:
    """Ticks from the training thread; each tick a second or more after the
    last (on the same thread) observes the CPU share of the time between."""

    __slots__ = ("_observe", "_next", "_thread", "_wall", "_cpu", "_ticks")

    def __init__(self, observe: Callable[[float, int], None]) -> None:
        self._observe = observe  # (percent, at ns): a distribution's observe_at
        self._next = 0
        self._thread = 0
        self._wall = self._cpu = 0
        self._ticks = 0

    def tick(self, now: int) -> None:
        """The step's timed call ended at ``now`` (monotonic ns), on this thread."""
        if now < self._next:
            return
        self._ticks += 1
        self._next = now + (FIRST_SPACING_NS if self._ticks <= FIRST else SPACING_NS)
        thread, cpu = threading.get_ident(), time.thread_time_ns()
        if thread == self._thread and now > self._wall:
            self._observe(min(100.0, 100.0 * (cpu - self._cpu) / (now - self._wall)), now)
        self._thread, self._wall, self._cpu = thread, now, cpu
