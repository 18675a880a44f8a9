"""How busy the training thread keeps itself: its CPU time over wall time, a
sample a second of the step loop after its first few (``TrainingThreadBusy``;
the time it was ready to run but waited for a core, Linux's schedstat where
the OS tells it, is out of the wall time: on a loaded machine a host-bound
thread read 50-80 % and the copies' and host work's bounds took it for one
waiting on the device), and the time the step's own call spent blocked
(``DispatchWaitTime``).

Whether a host-side cost (a numpy batch's copy made inside the jitted call)
lengthens the loop depends on who sets its pace. Near 100 % the thread never
waited: the host set the pace and every microsecond of its work is on the
loop's critical path. Low, it waited for the device (a read, or dispatch held
back by a full queue: neither spends CPU time), so host work overlapped
device work. The device's own sampled times cannot tell the two apart: they
are upper bounds (the watcher wakes when the training thread lets go of the
interpreter lock), and on the TPU machine a host-bound step whose loop runs
at 195 us a step sampled 471 us (``bench/RESULTS-TPU.md``).

The step's call blocked: a device-bound loop with no read each step fills
the device's queue, and then the call waits in JAX's dispatch for a slot
(CPU JAX bounds the computations in flight; a TPU's queue is bounded too).
That wait is the host's slack: host work (a library wrapper's, a numpy
argument's copy) added to the step shortens it, and removed lengthens it,
so the loop's time does not move. The call's wall time less the thread's
CPU time in it (the thread's usage read at the call's start too, on the
samples only: ``getrusage(RUSAGE_THREAD)``) is what it waited; a call with
no voluntary context switch did not wait (it lost the CPU only to the
scheduler: under load, issue 41's host-bound nnx_lifted read 39 us a call
that way) and reads 0. Where the OS counts no voluntary switches at all
(gVisor, the TPU machine's sandbox: a 50 ms sleep reads none), a thread that
has run a JAX program's first calls with none is on such an OS: the wait is
not known there, and is no longer sampled (nothing published).

The wait is sampled on its own, on the step's timed calls from its
:data:`WAIT_AFTER`-th, at most one every :data:`WAIT_SPACING_NS` (so a
few seconds of loop give a mean to stand on): two ``getrusage`` calls (a
system call each). The CPU share is read on the step function's timed
calls, at most once a :data:`SPACING_NS` (the first :data:`FIRST` samples
:data:`FIRST_SPACING_NS` apart, so a loop of a few seconds has a median to
stand on: on the TPU a 2 s host-bound loop had one sample, and the reader
wants three): one clock read there already, then
a thread CPU-time read (a system call: 5.6 us under gVisor) and a read of
``/proc/thread-self/schedstat``.

Example:
    >>> busy = ThreadBusy(samples.append, waits.append)     # doctest: +SKIP
    >>> began = usage() if start >= busy.wait_due_ns else None   # doctest: +SKIP
    >>> busy.tick(time.monotonic_ns(), start, began)  # it ended  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

try:
    import resource
    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD  # Linux
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _RUSAGE_THREAD = None

SCHEDSTAT = "/proc/thread-self/schedstat"

SPACING_NS = 1_000_000_000
FIRST, FIRST_SPACING_NS = 8, 200_000_000
SHARES_KEPT = 15  # the latest samples' CPU shares kept (cpu_share: their median)
# A call's wait: sampled at most once a WAIT_SPACING_NS (two usage reads),
# from the step's WAIT_AFTER-th call (the device's queue fills in its first
# calls: CPU JAX holds 32 computations in flight, and nnx_mnist's first 8
# samples, taken then, all read 0).
WAIT_SPACING_NS = 200_000_000
WAIT_AFTER = 64


class Usage(NamedTuple):
    """The calling thread's CPU ns and voluntary context switches (-1: not
    told, as off Linux)."""

    cpu_ns: int
    switches: int


def usage() -> Usage:
    """The calling thread's :class:`Usage` (one system call)."""
    if _RUSAGE_THREAD is not None:
        try:
            r = resource.getrusage(_RUSAGE_THREAD)
            return Usage(round((r.ru_utime + r.ru_stime) * 1e9), r.ru_nvcsw)
        except OSError:  # pragma: no cover - a sandbox without it
            pass
    return Usage(time.thread_time_ns(), -1)


def schedstat(path: str = SCHEDSTAT) -> tuple[int, int] | None:
    """A thread's (ns on a core, ns it waited for one) so far from Linux's
    schedstat file at ``path`` (this thread's by default); None where not
    told (gVisor, another OS, a thread gone)."""
    try:
        with open(path, "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def run_queue_wait_ns() -> int | None:
    """ns this thread has waited for a core so far (schedstat's second
    field), None where not told (gVisor, another OS)."""
    got = schedstat()
    return None if got is None else got[1]


def blocked_ns(began: tuple[int, int, int | None], ended: tuple[int, int, int | None]) -> int:
    """ns a thread was blocked between two readings of (wall ns, its CPU ns,
    ns it had waited for a core: :func:`run_queue_wait_ns`, None where not
    told): off the CPU, less the time it was ready to run and waited for a
    core (a loaded machine's, not a wait for the device: at load 10 on 2
    cores an evaluation's 0.2-0.7 s JAX gaps read as blocked behind the
    queued steps nearly whole, and went unsaid: jax/gaps.py).

    Example:
        >>> blocked_ns((0, 0, 50), (1_000, 100, 650))   # 900 off the CPU, 600 of it runnable
        300
        >>> blocked_ns((0, 0, None), (1_000, 100, None))  # not told: all off-CPU time
        900
    """
    off = (ended[0] - began[0]) - (ended[1] - began[1])
    if began[2] is not None and ended[2] is not None:
        off -= ended[2] - began[2]
    return max(0, off)


class ThreadBusy:
    """Ticks from the training thread; each tick a second or more after the
    last (on the same thread) observes the CPU share of the time between,
    and, where the caller read the thread's usage at the call's start, the
    call's wait."""

    __slots__ = ("_observe", "_waited", "_run_queue", "due_ns", "wait_due_ns", "_thread",
                 "_wall", "_cpu", "_ticks", "_queued", "_loaded", "window", "shares")

    def __init__(self, observe: Callable[[float, int], None] | None,
                 waited: Callable[[float, int], None] | None = None,
                 run_queue: Callable[[], int | None] | None = None,
                 loaded: Callable[[float, int], None] | None = None) -> None:
        self._observe = observe  # (percent, at ns): a distribution's observe_at
        self._waited = waited  # (ns the call was off the CPU, at ns)
        # (percent of the wall time the thread was ready to run but waited for
        # a core, at ns: TrainingThreadRunQueue, where the OS tells it)
        self._loaded = loaded
        self.due_ns = 0  # the clock (ns) from which the next tick samples
        self.wait_due_ns = 0  # and from which a call's start is sampled for its wait
        self._thread = 0
        self._wall = self._cpu = 0
        self._ticks = 0
        self._run_queue = run_queue_wait_ns if run_queue is None else run_queue
        self._queued: int | None = None
        # Called with ``now`` at each sample too: the process's other threads'
        # CPU (metrics.engines.other_threads), read on the same cadence.
        self.window: Callable[[int], None] | None = None
        # The latest samples' CPU share of the thread's wall (0..1): how much of
        # a step period was the host's own work, not a wait (cpu_share).
        self.shares: deque[float] = deque(maxlen=SHARES_KEPT)

    def _wait(self, now: int, start: int, began: Usage) -> None:
        self.wait_due_ns = now + WAIT_SPACING_NS
        if self._waited is None:
            return
        if began.switches == 0:  # never a voluntary switch in the thread's life: not counted
            self.wait_due_ns = 1 << 62  # here (gVisor: a sleep reads none), so no wait is
            return  # known: no more usage reads (two system calls a sample)
        ended = usage()
        # No voluntary switch: the call never blocked (off the CPU only where
        # the scheduler ran another thread: a loaded machine's).
        blocked = ended.switches < 0 or ended.switches > began.switches
        off = (now - start) - (ended.cpu_ns - began.cpu_ns)
        self._waited(float(max(0, off)) if blocked else 0.0, now)

    def tick(self, now: int, start: int = 0, began: Usage | None = None) -> None:
        """The step's timed call (from ``start``; the thread's :func:`usage`
        then ``began``, read by the caller where ``start`` reached
        :attr:`wait_due_ns`) ended at ``now`` (monotonic ns), on this thread."""
        if began is not None:
            self._wait(now, start, began)
        if now < self.due_ns:
            return
        self._ticks += 1
        self.due_ns = now + (FIRST_SPACING_NS if self._ticks <= FIRST else SPACING_NS)
        thread, cpu, wait = threading.get_ident(), time.thread_time_ns(), self._run_queue()
        if thread == self._thread and now > self._wall:
            # Time the thread was ready to run but waited for a core (a loaded
            # machine) is not time it waited for the device: out of the wall.
            told = wait is not None and self._queued is not None
            queued = max(0, wait - self._queued) if told else 0  # type: ignore[operator]
            span = max(now - self._wall - queued, cpu - self._cpu, 1)
            share = min(1.0, (cpu - self._cpu) / span)
            self.shares.append(share)
            if self._observe is not None:
                self._observe(100.0 * share, now)
            if told and self._loaded is not None:
                self._loaded(min(100.0, 100.0 * queued / (now - self._wall)), now)
        self._thread, self._wall, self._cpu, self._queued = thread, now, cpu, wait
        if self.window is not None:
            self.window(now)

    def cpu_share(self) -> float | None:
        """The median CPU share of the thread's wall over its latest samples
        (0..1; None before the first window): the part of a step period that
        was the host's own work, not a wait for the device at a read or in a
        dispatch (read time, off the training thread)."""
        got = sorted(list(self.shares))  # (one C call: a safe copy beside the appends)
        return got[len(got) // 2] if got else None
