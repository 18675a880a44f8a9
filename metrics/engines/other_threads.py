"""CPU time the process's other Python threads spend while the step loop runs:
a data pipeline's prefetch pool (grain's ``grain-prefetch`` threads, a
thread-backed loader, a user's own prefetch thread), engine-agnostic.

Work on those threads is invisible to the training thread's own timing
(:mod:`metrics.engines.host_lines` sees only a batch handed over), yet on a
host with few cores it competes with the step for them: optax's
reduce_on_plateau example fed through grain (16 prefetch threads mapping
``x / 255.`` per example) on one core read "other 99 %, device busy 81 %",
where removing the pipeline's work saved 5.9 ms of CPU and 18 ms of wall a
64 ms step (s10's evaluation round).

How: at :class:`~metrics.recording.thread_busy.ThreadBusy`'s samples (on the
training thread, once a second in the loop, the first few 0.2 s apart) each
live Python thread other than the training thread, this hook's own
(``tpu-info-*``) and threads the threading module did not start (the
engine's own workers calling back into Python) has its CPU time read
(``/proc/self/task/TID/schedstat``, else ``stat``: a file read each, at most
:data:`MAX_THREADS`), and the process's (``time.process_time_ns``). Each
window between two samples gives the other threads' share of the process's
CPU (``OtherThreadsCpu``) and, where the process has at most
:data:`MAX_TASKS` threads (all read), the time they all waited for a core
over the window's wall time (``ProcessRunQueue``: on the CPU backend the
device's work is the engine's own threads, which the training thread's
run queue does not show: at load 7 on one core optax's example got a third
of it while its training thread, waiting for them, hardly queued). The
threads busy in a window have their stacks read (``sys._current_frames``):
the innermost user frame names their work's line, else the innermost
installed library's frame. Threads are grouped by name,
numbers dropped (``grain-prefetch_3`` -> ``grain-prefetch``); read out per
group as ``thread_work`` sites (:meth:`OtherThreads.sites`).

Cost: one sample a second: a file read per thread (~10 us each where
system calls are slow; a process of more than :data:`MAX_TASKS` threads
has only its Python threads read) and a walk of the busy threads' stacks.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from metrics.engines._frames import LIBRARY, USER, LibraryFrames
from metrics.recording.thread_busy import schedstat
from tpu_info.contract import catalog as names
from tpu_info.contract.model import Phase, SiteKind, SiteReading

MAX_THREADS = 64  # Python threads read per sample, at most
MAX_TASKS = 64  # the process's threads, all read for their waits up to this many
MAX_LINES = 32  # distinct lines kept per group
HOOK_PREFIX = "tpu-info"
_NUMBERS = re.compile(r"[-_]\d+")


@dataclass
class Group:
    """The threads of one name: their CPU in the sampled windows, the windows
    they were busy in, how many ran at once (the most), where they were."""

    cpu_ns: int = 0
    windows: int = 0
    threads: int = 0
    first_ns: int = 0
    last_ns: int = 0
    lines: Counter[tuple[str, str]] = field(default_factory=Counter)


def group_name(name: str) -> str:
    """A thread's group: its name, numbers dropped.

    >>> group_name("grain-prefetch_3"), group_name("ThreadPoolExecutor-0_12")
    ('grain-prefetch', 'ThreadPoolExecutor')
    >>> group_name("Thread-5 (worker)")
    'Thread (worker)'
    """
    return _NUMBERS.sub("", name) or name


def thread_times(native_id: int) -> tuple[int, int | None] | None:
    """A thread's (CPU ns so far, ns it waited for a core so far: None where
    not told) by its OS id; None: gone, or not told."""
    got = schedstat(f"/proc/self/task/{native_id}/schedstat")
    if got is not None:
        return got
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_NS, None  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the machine's where
    not told)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def task_ids() -> list[int]:
    """The process's threads' OS ids, every one ([]: not told)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return []


try:
    _TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    _TICK_NS = 10_000_000


class OtherThreads:
    """The samples (:meth:`sample`, from the training thread) and their
    readings (:meth:`sites`, at scrape time)."""

    def __init__(self, frames: LibraryFrames,
                 observe: Callable[[str, float, int], None]) -> None:
        self._frames = frames
        self._observe = observe  # (distribution name, percent, at ns)
        self._prev: dict[int, int] = {}  # native id -> CPU ns at the last sample
        self._waits: dict[int, int] = {}  # every thread's ns waiting for a core, then
        self._proc = self._wall = 0
        self.groups: dict[str, Group] = {}
        self.windows = 0

    def forget(self) -> None:
        """A reset: the groups go; the next sample is a baseline."""
        self.groups, self._prev, self._waits, self._wall = {}, {}, {}, 0

    def sample(self, now: int) -> None:
        """A sample at ``now`` (monotonic ns) on the training thread: the
        window since the last one is counted (the first is a baseline)."""
        proc, me = time.process_time_ns(), threading.get_ident()
        tasks = task_ids()
        every = len(tasks) <= MAX_TASKS  # (a TPU host's runtime has hundreds: not read)
        times = {tid: r for tid in tasks if (r := thread_times(tid)) is not None} if every else {}
        seen: dict[int, int] = {}
        busy: list[tuple[threading.Thread, int]] = []
        for t in threading.enumerate()[:MAX_THREADS]:
            tid = t.native_id
            if (t.ident == me or tid is None or isinstance(t, threading._DummyThread)
                    or t.name.startswith(HOOK_PREFIX)):
                continue
            read = times.get(tid) if every else thread_times(tid)
            if read is None:
                continue
            seen[tid] = read[0]
            spent = read[0] - self._prev.get(tid, 0)  # a thread born in the window: all of it
            if spent > 0 and self._wall:
                busy.append((t, spent))
        waits = {tid: w for tid, (_, w) in times.items() if w is not None}
        waited = sum(w - self._waits.get(tid, 0) for tid, w in waits.items())
        wall, cpu_all = now - self._wall, proc - self._proc
        first, told = not self._wall, bool(waits) and bool(self._waits)
        self._prev, self._waits, self._proc, self._wall = seen, waits, proc, now
        if not first and wall > 0:
            self._observe(names.PROCESS_CORES, float(usable_cores()), now)
        if first or wall <= 0 or cpu_all <= 0 or not seen:
            return
        self.windows += 1
        other = sum(spent for _, spent in busy)
        self._observe(names.OTHER_THREADS_CPU, min(100.0, 100.0 * other / cpu_all), now)
        if told:
            self._observe(names.PROCESS_RUN_QUEUE, min(100.0, 100.0 * waited / wall), now)
        if not busy:
            return
        frames = sys._current_frames()
        counted: Counter[str] = Counter()
        for t, spent in busy:
            name = group_name(t.name)
            g = self.groups.get(name)
            if g is None:
                if len(self.groups) >= MAX_THREADS:
                    continue
                g = self.groups[name] = Group(first_ns=now)
            if not counted[name]:
                g.windows += 1
            counted[name] += 1
            g.cpu_ns += spent
            g.last_ns = now
            where = self._where(frames.get(t.ident or 0)) or self._target(t)
            if where is not None and (where in g.lines or len(g.lines) < MAX_LINES):
                g.lines[where] += 1
        for name, n in counted.items():
            g = self.groups[name]
            g.threads = max(g.threads, n)

    def _where(self, f: FrameType | None) -> tuple[str, str] | None:
        """(``path:line``, function) of a thread's innermost user frame, else
        its innermost installed library's frame; None: neither."""
        inner = None
        while f is not None:
            k = self._frames.kind(f.f_code.co_filename)
            if k == USER:
                return f"{f.f_code.co_filename}:{f.f_lineno}", f.f_code.co_name
            if k == LIBRARY and inner is None:
                inner = (f"{f.f_code.co_filename}:{f.f_lineno}", f.f_code.co_name)
            f = f.f_back
        return inner

    def _target(self, t: threading.Thread) -> tuple[str, str] | None:
        """A thread's own function where it is the user's or a library's (a
        ``threading.Thread(target=prefetch)``; a pool's workers are the
        standard library's): where an idle thread's work is, at least."""
        code = getattr(getattr(t, "_target", None), "__code__", None)
        if code is None or self._frames.kind(code.co_filename) not in (USER, LIBRARY):
            return None
        return f"{code.co_filename}:{code.co_firstlineno}", code.co_name

    def sites(self, mono_to_unix: float) -> list[SiteReading]:
        """One ``thread_work`` reading per group with CPU in the windows:
        ``seconds`` their CPU, ``count`` the windows they were busy in,
        ``timed`` the windows, at the line their stacks were at most."""
        out = []
        for name, g in list(self.groups.items()):
            lines = g.lines.most_common(1)
            path, function = lines[0][0] if lines else ("<threads>:0", "")
            if not path.startswith("<"):
                cut = path.rsplit(":", 1)
                path = f"{os.path.abspath(cut[0])}:{cut[1]}"
            out.append(SiteReading(
                kind=SiteKind.THREAD_WORK.value, location=path, count=g.windows,
                seconds=g.cpu_ns / 1e9, function=function,
                detail=f"{g.threads} thread{'s' if g.threads != 1 else ''} '{name}'",
                first_seen_unix=g.first_ns / 1e9 + mono_to_unix,
                last_seen_unix=g.last_ns / 1e9 + mono_to_unix,
                phase=Phase.STEP.value, occurrences=g.windows, timed=self.windows))
        return out
