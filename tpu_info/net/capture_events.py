"""A capture call with the hook's events read alongside it.

``tpu-info profile`` asks the hook for a capture (``Monitor.Capture``, the
owner's call) and, on a second channel, reads snapshots of the same program
every :data:`POLL_S` seconds: the events after the last one read (a
snapshot carries at most the newest 1,000, so reading often keeps a busy
program's window whole) and the device memory and execution count of each
moment. A program that never loaded the profiler answers the capture with
only its window (:data:`tpu_info.contract.captures.WINDOW_FORMAT`); the
events and samples read here are its host timeline
(:mod:`tpu_info.outputs.host_timeline`). A profiler's full trace needs
none of them, and a target that does not answer snapshots (an old or a
fake hook) still captures: the reading stops at its first error.

Example (no hook here: the capture fails, and says so)::

    cap, seen = capture_with_events("127.0.0.1:1", 1.0, device=False, secret="s",
                                    timeout=0.5)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tpu_info.contract import catalog as names
from tpu_info.contract.captures import WINDOW_FORMAT, RemoteCapture
from tpu_info.contract.errors import TpuInfoError
from tpu_info.contract.model import Event, Snapshot
from tpu_info.net.client import Client

__all__ = ["Seen", "Sample", "capture_with_events", "POLL_S", "MAX_EVENTS"]

POLL_S = 0.2
MAX_EVENTS = 200_000  # events kept at most (the profiler's max_events): bounded memory


@dataclass(frozen=True)
class Sample:
    """One snapshot's moment: its time, device memory in use, executions."""

    time_unix: float
    memory: dict[str, int]
    executions: int | None


@dataclass
class Seen:
    """What the snapshots read during a capture showed.

    Attributes:
        events: every event read, by sequence number.
        first_seq: the hook's last event number before the capture was asked for.
        steps_at_first: its ``MarkStep`` count then.
        samples: one per snapshot read.
        error: why the reading stopped early ("" when it did not).
        capped: reading stopped at :data:`MAX_EVENTS` events.
    """

    events: dict[int, Event] = field(default_factory=dict)
    first_seq: int | None = None
    steps_at_first: int = 0
    samples: list[Sample] = field(default_factory=list)
    error: str = ""
    capped: bool = False

    def add(self, snap: Snapshot) -> None:
        """Takes in one snapshot."""
        if self.first_seq is None:
            self.first_seq = snap.last_seq
            self.steps_at_first = snap.counter(names.MARK_STEP)
        for e in snap.events:
            if len(self.events) >= MAX_EVENTS:
                self.capped = True
                break
            self.events[e.seq] = e
        memory = {f"device {d.id}": int(d.memory.used_bytes) for d in snap.devices
                  if d.memory.used_bytes is not None}
        executed = next((c.value for c in snap.counters if c.name == names.EXECUTE_COUNT), None)
        self.samples.append(Sample(snap.taken_at_unix, memory, executed))

    @property
    def cursor(self) -> int:
        """The newest event number read."""
        return max(self.events, default=self.first_seq or 0)


def _read(watcher: Client, seen: Seen, since: int) -> bool:
    """Reads one snapshot into ``seen``; False (and why) once reading failed."""
    if seen.error or seen.capped:
        return False
    try:
        seen.add(watcher.snapshot(events_since=since))
    except TpuInfoError as e:
        seen.error = str(e)
        return False
    return True


def capture_with_events(target: str, duration_s: float, *, device: bool, secret: str | None,
                        timeout: float) -> tuple[RemoteCapture, Seen]:
    """Runs the capture, reading snapshots until it answers.

    Raises:
        TpuInfoError: the capture failed (see :meth:`Client.capture_files`).
        ValueError: a duration out of range.
    """
    seen = Seen()
    box: dict[str, object] = {}

    def run_capture() -> None:
        try:
            with Client(target, timeout=timeout) as c:
                box["cap"] = c.capture_files(duration_s, device=device, secret=secret)
        except (TpuInfoError, ValueError) as e:
            box["error"] = e

    with Client(target, timeout=timeout) as watcher:
        _read(watcher, seen, 0)  # before the window: where its events begin
        worker = threading.Thread(target=run_capture, name="tpu-info-capture", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(POLL_S)
            if worker.is_alive():
                _read(watcher, seen, seen.cursor)
        error = box.get("error")
        if isinstance(error, BaseException):
            raise error
        cap = box["cap"]
        assert isinstance(cap, RemoteCapture)
        if cap.format == WINDOW_FORMAT:
            _read(watcher, seen, seen.cursor)  # the window's last events
    return cap, seen
