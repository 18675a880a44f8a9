"""Where the dashboard's records come from: live targets or fixture data.

A :class:`Source` hands the app :class:`Update` s (one target's snapshot, or
its connection state) through a ``sink`` callable. It never draws and never
runs on the UI thread: the app runs each of :meth:`Source.loops` in a thread
worker, and ``sink`` posts a message to the app (thread-safe).

:class:`LiveSource` reads real targets. Each :class:`TargetReader` holds the
server-streaming call open (``Monitor/StreamSnapshots``), falls back to
polling ``GetSnapshot`` (or libtpu's service) when streaming is refused,
and after a failure reports "disconnected" and retries with backoff.
:class:`DiscoveryLoop` rescans the runtime directory so programs started (or
restarted) after the dashboard are picked up, and scans this host's chips and
their owners (sysfs, ``/proc``) every :data:`HOST_EVERY_S` seconds, as the
exporter does each poll, and when the hooked processes change. :mod:`tui.fake` holds a
deterministic source for tests and benchmarks.

Example:
    >>> src = LiveSource(["localhost:1"], interval_s=1.0, discover=False)
    >>> [r.target for r in src.readers]
    ['localhost:1']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from tpu_info.commands.gather import libtpu_targets, local_targets
from tpu_info.contract.errors import NotAMonitor, ServerError, TimedOut, TpuInfoError
from tpu_info.contract.model import LocalScan, Snapshot
from tpu_info.net.client import Client

Clock = Callable[[], float]
BACKOFF_S: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
# The host scan reads every process's open files in /proc (tens of ms on a busy
# host): as often as the exporter's poll, not at the dashboard's rate.
HOST_EVERY_S = 5.0


class Conn(StrEnum):
    """A target's connection state as the header shows it."""

    CONNECTING = "connecting"
    STREAMING = "live"
    POLLING = "polling"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class Update:
    """One thing a reader learned about one target.

    Attributes:
        target: ``host:port``.
        state: connection state after this update.
        snapshot: the snapshot read, when ``state`` is live or polling.
        error: why the target is disconnected (one line).
        since_unix: when it became disconnected (first failure of a run).
        retry_in_s: seconds until the next attempt, when disconnected.
        source: ``hook`` or ``libtpu``.
    """

    target: str
    state: Conn
    snapshot: Snapshot | None = None
    error: str = ""
    since_unix: float | None = None
    retry_in_s: float | None = None
    source: str = "hook"


@dataclass(frozen=True, slots=True)
class Found:
    """Discovery's view of the live hooked processes: ``(target, argv)``, and
    ``started``: ``(target, start time)`` of those this user's records name;
    ``local``: this host's chips and their owners, when scanned this time
    (None: keep the last scan)."""

    processes: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)
    started: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    local: LocalScan | None = None


Sink = Callable[[Update | Found], None]
Loop = Callable[[Sink, threading.Event], None]


class Source:
    """What the app reads from. Subclasses override the parts they need."""

    def initial(self) -> list[Update | Found]:
        """Updates known at once (delivered on mount, before any loop runs)."""
        return []

    def loops(self) -> list[tuple[str, Loop]]:
        """``(name, loop)`` pairs the app runs in thread workers."""
        return []

    def add_target(self, target: str) -> tuple[str, Loop] | None:
        """Starts reading ``target`` too; returns the loop to run, if any."""
        return None

    def drop_target(self, target: str) -> None:
        """Stops reading ``target``."""

    def reconnect(self) -> None:
        """Retries disconnected targets now instead of after their backoff."""

    def stop(self) -> None:
        """Ends every loop and closes every connection (idempotent)."""


class TargetReader:
    """Reads one target until stopped: stream, else poll, else back off.

    Args:
        target: ``host:port``.
        interval_s: seconds between snapshots.
        timeout_s: deadline for each unary call.
        clock: wall clock for "disconnected since".
        backoff_s: successive waits after failures (the last repeats).
        client_factory: builds a :class:`~tpu_info.net.client.Client` (injectable).
    """

    def __init__(self, target: str, interval_s: float, timeout_s: float = 3.0, *,
                 clock: Clock = time.time, backoff_s: Sequence[float] = BACKOFF_S,
                 client_factory: Callable[..., Client] = Client,
                 silence_s: float | None = None) -> None:
        self.target = target
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.backoff_s = tuple(backoff_s)
        self._factory = client_factory
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._client: Client | None = None
        # A process that stops answering (SIGSTOP, a hang) keeps its socket
        # open: after this long without a snapshot the channel is closed.
        self.silence_s = silence_s if silence_s is not None else max(5.0, 5 * interval_s)
        self._silent = False

    def wake(self) -> None:
        """Cuts a backoff wait short."""
        self._wake.set()

    def stop(self) -> None:
        """Ends :meth:`run`: closes the channel, which cancels a blocked stream."""
        self._stopped.set()
        self._wake.set()
        with self._lock:
            if self._client is not None:
                self._client.close()

    def _open(self) -> Client | None:
        with self._lock:
            if self._stopped.is_set():
                return None
            self._client = self._factory(self.target, timeout=self.timeout_s)
            return self._client

    def run(self, sink: Sink, stop: threading.Event) -> None:
        """Reads until ``stop`` is set (or :meth:`stop` is called)."""
        failures, down_since, since = 0, None, 0
        done = lambda: stop.is_set() or self._stopped.is_set()  # noqa: E731
        while not done():
            client = self._open()
            if client is None:
                return
            self._silent = False
            watchdog = _Watchdog(self.silence_s, lambda c=client: self._went_silent(c))
            try:
                watchdog.kick()
                for snap, state, source in self._read(client, since, done):
                    watchdog.kick()
                    since = snap.last_seq if snap.last_seq >= since else 0
                    failures, down_since = 0, None
                    sink(Update(self.target, state, snap, source=source))
            except TpuInfoError as e:
                if done():
                    return
                failures += 1
                down_since = down_since or self.clock()
                delay = self.backoff_s[min(failures, len(self.backoff_s)) - 1]
                error = (f"no answer for {self.silence_s:g} s (the process may be stopped "
                         "or hung)") if self._silent else (e.detail or str(e))
                sink(Update(self.target, Conn.DISCONNECTED, error=error,
                            since_unix=down_since, retry_in_s=delay))
                self._wake.clear()
                self._wake.wait(delay)
            finally:
                watchdog.cancel()
                client.close()

    def _went_silent(self, client: Client) -> None:
        self._silent = True
        client.close()  # a blocked stream or call ends with an error

    def _read(self, client: Client, since: int, done: Callable[[], bool]):  # type: ignore[no-untyped-def]
        """Yields ``(snapshot, state, source)``: streaming first, then polling."""
        try:
            for snap in client.stream(self.interval_s, events_since=since, follow=True):
                yield snap, Conn.STREAMING, "hook"
                if done():
                    return
            if done():
                return
            raise ServerError("the stream ended", target=self.target)
        except (NotAMonitor, ServerError):
            if done():
                return
            if self._silent:  # the watchdog closed the channel under the stream
                raise TimedOut("no answer", target=self.target) from None
        # Streaming refused (too many streams, an older hook, or libtpu): poll.
        while not done():
            started = time.monotonic()
            try:
                source, snap = client.read_latest()
            except ValueError:  # the watchdog closed the channel between calls
                raise TimedOut("no answer", target=self.target) from None
            yield snap, Conn.POLLING, source
            self._stopped.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


class _Watchdog:
    """Calls ``fire`` unless kicked at least every ``seconds``."""

    def __init__(self, seconds: float, fire: Callable[[], None]) -> None:
        self._seconds = seconds
        self._fire = fire
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def kick(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self._seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class DiscoveryLoop:
    """Rescans the runtime directory every ``every_s`` seconds.

    Posts :class:`Found` with every live hooked process, plus libtpu's
    ``localhost:8431`` when ``probe_libtpu`` and it is libtpu this user may
    read (:func:`tpu_info.commands.gather.local_targets` decides, as for ``tpu-info``).
    A look costs a ``stat`` of the directory and a read of ``/proc/net/tcp``
    while nothing changes (:class:`tpu_info.net.discovery.Rescanner`).

    Args:
        runtime_dir: where discovery looks (default: the usual place).
        every_s: seconds between looks.
        probe_libtpu: also read libtpu's port when it is libtpu.
        proc_root: where ``/proc`` is (tests point it at a fixture tree).
        libtpu_target: libtpu's address, or several (default: 8431 and
            ``$TPU_RUNTIME_METRICS_PORTS``).
        scan_host: scans this host's chips and owners
            (:func:`tpu_info.host.devices.scan_local`; None: never).
        host_every_s: seconds between host scans (one also follows a change
            in the hooked processes, at the next look).
        clock: a monotonic clock (tests step it).
    """

    def __init__(self, runtime_dir: str | Path | None = None, every_s: float = 2.0,
                 probe_libtpu: bool = True, *, proc_root: str | Path = "/proc",
                 libtpu_target: str | Sequence[str] | None = None,
                 scan_host: Callable[[], LocalScan] | None = None,
                 host_every_s: float = HOST_EVERY_S,
                 clock: Clock = time.monotonic) -> None:
        from tpu_info.host.listeners import ProcNet
        from tpu_info.net.discovery import Rescanner

        self.runtime_dir = runtime_dir
        self.every_s = every_s
        self.probe_libtpu = probe_libtpu
        # None: 8431 and $TPU_RUNTIME_METRICS_PORTS
        self.libtpu_target = libtpu_targets() if libtpu_target is None else libtpu_target
        self.net = ProcNet(proc_root)
        self.rescanner = Rescanner(runtime_dir, port_owners=self.net.owners_by_port)
        self.scan_host = scan_host
        self.host_every_s = host_every_s
        self.clock = clock
        self.host_scans = 0
        self._host_at = -float("inf")
        self._host_key: tuple[str, ...] | None = None
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def scan(self) -> Found:
        scan = self.rescanner.scan()
        picked = local_targets(scan, self.net,
                               libtpu_target=self.libtpu_target if self.probe_libtpu else None)
        found = list(picked.processes)
        found += [(libtpu, ()) for libtpu in picked.libtpus]
        started = tuple((p.target, p.start_time or 0.0) for p in scan.processes)
        return self._with_host(Found(tuple(found), started))

    def _with_host(self, found: Found) -> Found:
        """``found`` with a host scan when one is due: every ``host_every_s``,
        or at once when the hooked processes changed (a chip's owner came or went)."""
        if self.scan_host is None:
            return found
        key = tuple(sorted(t for t, _ in found.processes))
        now = self.clock()
        if key == self._host_key and now - self._host_at < self.host_every_s:
            return found
        self._host_key, self._host_at = key, now
        self.host_scans += 1
        return replace(found, local=self.scan_host())

    def run(self, sink: Sink, stop: threading.Event) -> None:
        while not (stop.is_set() or self._stopped.is_set()):
            sink(self.scan())
            self._stopped.wait(self.every_s)


class LiveSource(Source):
    """Real targets: the ones named, plus what discovery finds.

    Args:
        targets: ``host:port`` addresses named by the user.
        interval_s: seconds between snapshots (the server's floor is 50 ms).
        timeout_s: deadline for unary calls.
        discover: also read this host's hooked processes (and libtpu), and scan
            its chips and their owners.
        runtime_dir: where discovery looks (default: the usual place).
        probe_libtpu: with ``discover``, also read libtpu's port when it listens.
        backoff_s: waits between reconnection attempts (the last repeats).
        clock: wall clock for "disconnected since".
    """

    def __init__(self, targets: Sequence[str], interval_s: float = 1.0, timeout_s: float = 3.0,
                 *, discover: bool = True, runtime_dir: str | Path | None = None,
                 probe_libtpu: bool = True, backoff_s: Sequence[float] = BACKOFF_S,
                 clock: Clock = time.time) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.backoff_s = tuple(backoff_s)
        self.readers: list[TargetReader] = []
        self.discovery = (DiscoveryLoop(runtime_dir, probe_libtpu=probe_libtpu,
                                        scan_host=_scan_host) if discover else None)
        self._stop = threading.Event()
        for t in dict.fromkeys(targets):
            self._reader(t)

    def _reader(self, target: str) -> TargetReader:
        r = TargetReader(target, self.interval_s, self.timeout_s, clock=self.clock,
                         backoff_s=self.backoff_s)
        self.readers.append(r)
        return r

    def initial(self) -> list[Update | Found]:
        return [Update(r.target, Conn.CONNECTING) for r in self.readers]

    def loops(self) -> list[tuple[str, Loop]]:
        out: list[tuple[str, Loop]] = [(r.target, r.run) for r in self.readers]
        if self.discovery is not None:
            out.append(("discovery", self.discovery.run))
        return out

    def add_target(self, target: str) -> tuple[str, Loop] | None:
        if self._stop.is_set() or any(r.target == target for r in self.readers):
            return None
        r = self._reader(target)
        return r.target, r.run

    def drop_target(self, target: str) -> None:
        for r in [r for r in self.readers if r.target == target]:
            r.stop()
            self.readers.remove(r)

    def reconnect(self) -> None:
        for r in self.readers:
            r.wake()

    def stop(self) -> None:
        self._stop.set()
        if self.discovery is not None:
            self.discovery.stop()
        for r in list(self.readers):
            r.stop()


def _scan_host() -> LocalScan:
    from tpu_info.host.devices import scan_local  # only where the dashboard reads this host

    return scan_local()
