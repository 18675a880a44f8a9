"""What the dashboard remembers about each target between updates.

:class:`TargetData` folds a stream of :class:`~tui.source.Update` s into the
latest snapshot plus short histories (HBM and busy % per device, transfer
byte rates, recent events), one sample per update, so the sparklines and the
event timeline share one time axis. Everything here is pure data handling on
the UI thread: no I/O, no widgets.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> from tui.source import Conn, Update
    >>> d = TargetData("h:1")
    >>> d.apply(Update("h:1", Conn.STREAMING, Snapshot(taken_at_unix=5.0)))
    True
    >>> d.state.value, len(d.samples)
    ('live', 1)
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from tpu_info.contract.catalog import INBOUND_DATA, OUTBOUND_DATA
from tpu_info.contract.model import (
    COMPILE_KINDS,
    TRANSFER_KINDS,
    Event,
    EventKind,
    Finding,
    Snapshot,
)
from tpu_info.views.findings import find
from tpu_info.views.steps import interval_step_seconds, steps_per_second
from tui.source import Conn, Update

HISTORY = 300  # samples kept per target: five minutes at the default 1 s
EVENTS = 500  # newest events kept per target
# Steps and transfers come by the thousand a second: they are rates (the step
# line, Transfers), never rows, and never push a compile out of the ring.
RATE_KINDS = frozenset({EventKind.STEP, *TRANSFER_KINDS})
# Events the dashboard itself notices (their ``seq`` is negative).
DISCONNECT, RECONNECT, FINDING = "disconnect", "reconnect", "finding"


@dataclass(frozen=True, slots=True)
class Sample:
    """One update's worth of chart values (None: not reported)."""

    time_unix: float
    hbm_used: tuple[tuple[int, int | None], ...]  # (device id, bytes)
    busy: tuple[tuple[int, float | None], ...]  # (device id, percent)
    h2d_bytes_per_s: float | None = None
    d2h_bytes_per_s: float | None = None
    events: int = 0  # events that arrived with this sample
    compiles: int = 0  # compile and recompile events among them
    recompiles: int = 0  # recompile events among them
    steps_per_s: float | None = None  # since the sample before
    step_s: float | None = None  # mean step time since the sample before


@dataclass
class TargetData:
    """One target: latest snapshot, connection state and histories."""

    target: str
    state: Conn = Conn.CONNECTING
    snapshot: Snapshot | None = None
    previous: Snapshot | None = None  # the reading before (for rates)
    error: str = ""
    since_unix: float | None = None
    retry_in_s: float | None = None
    source: str = "hook"
    argv: tuple[str, ...] = ()
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=HISTORY))
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS))
    noticed: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS))
    findings: list[Finding] = field(default_factory=list)
    version: int = 0  # bumps on every applied update
    _identity: tuple[int, float] | None = None
    _findings_key: tuple[object, ...] | None = None
    _last_seq: int = 0
    _noticed_n: int = 0

    @property
    def connected(self) -> bool:
        return self.state in (Conn.STREAMING, Conn.POLLING)

    def apply(self, u: Update) -> bool:
        """Folds ``u`` in; returns True when something visible changed."""
        self.version += 1
        self.source = u.source
        if u.snapshot is None:
            changed = (u.state, u.error, u.since_unix) != (self.state, self.error,
                                                             self.since_unix)
            if u.state is Conn.DISCONNECTED and self.state is not Conn.DISCONNECTED \
                    and self.snapshot is not None:
                self._notice(DISCONNECT, u.since_unix or self.snapshot.taken_at_unix,
                             self.target, u.error)
            self.state, self.error, self.since_unix = u.state, u.error, u.since_unix
            self.retry_in_s = u.retry_in_s
            return changed
        s = u.snapshot
        identity = (s.process.pid, s.process.start_time_unix) if s.process else None
        if self._identity is not None and identity != self._identity:
            self.samples.clear()  # a restarted program: its history starts again
            self.events.clear()
            self._last_seq = 0
        self._identity = identity
        prev = self.snapshot
        if self.state is Conn.DISCONNECTED and prev is not None:
            self._notice(RECONNECT, s.taken_at_unix, self.target, u.state.value)
        self.state, self.error, self.since_unix, self.retry_in_s = u.state, "", None, None
        self.snapshot, self.previous = s, prev
        new_events = [e for e in s.events if e.seq > self._last_seq]
        self._last_seq = max(self._last_seq, s.last_seq, *(e.seq for e in new_events[-1:]))
        self.events.extend(e for e in new_events if e.kind not in RATE_KINDS)
        self.samples.append(_sample(prev, s, new_events))
        key = (len(s.graphs), sum(g.compiles for g in s.graphs), s.counters,
               tuple((d.name, d.count) for d in s.distributions), len(s.devices),
               s.left_out, s.sites, s.steps, s.blind_spots)
        if key != self._findings_key:
            self._findings_key = key
            seen = {(f.kind, f.location) for f in self.findings}
            self.findings = find(s)
            for f in self.findings:
                if (f.kind, f.location) not in seen:
                    self._notice(FINDING, s.taken_at_unix, f.kind, f.message, f.location)
        return True

    def _notice(self, kind: str, time_unix: float, name: str, detail: str,
                location: str | None = None) -> None:
        """Records something the dashboard noticed as an event row."""
        self._noticed_n += 1
        self.noticed.append(Event(-self._noticed_n, time_unix, kind, name, "", detail, location))


def _rate(prev: Snapshot | None, s: Snapshot, name: str) -> float | None:
    d = s.distribution(name)
    if d is None:
        return None
    if d.value_rate_per_second is not None:
        return d.value_rate_per_second
    p = prev.distribution(name) if prev is not None else None
    dt = s.taken_at_unix - prev.taken_at_unix if prev is not None else 0.0
    if p is None or dt <= 0 or d.total < p.total:
        return 0.0 if prev is not None else None
    return (d.total - p.total) / dt


def _sample(prev: Snapshot | None, s: Snapshot, new_events: list[Event]) -> Sample:
    return Sample(
        time_unix=s.taken_at_unix,
        hbm_used=tuple((d.id, d.memory.used_bytes) for d in s.devices),
        busy=tuple((d.id, d.busy_percent) for d in s.devices),
        h2d_bytes_per_s=_rate(prev, s, OUTBOUND_DATA),
        d2h_bytes_per_s=_rate(prev, s, INBOUND_DATA),
        events=len(new_events),
        compiles=sum(1 for e in new_events if e.kind in COMPILE_KINDS),
        recompiles=sum(1 for e in new_events if e.kind == EventKind.RECOMPILE),
        steps_per_s=steps_per_second(prev, s),
        step_s=interval_step_seconds(prev, s),
    )


def series(samples: deque[Sample] | list[Sample], attr: str,
           device: int | None = None, last: int | None = None) -> list[float | None]:
    """One value per sample (the ``last`` ones only, when given): a device's
    HBM or busy %, or a transfer rate."""
    out: list[float | None] = []
    chosen = samples if last is None or last >= len(samples) else \
        list(itertools.islice(reversed(samples), last))[::-1]
    for smp in chosen:
        if device is None:
            out.append(getattr(smp, attr))
            continue
        value = None
        for dev, v in getattr(smp, attr):
            if dev == device:
                value = v
                break
        out.append(value)
    return out


@dataclass
class WatchState:
    """Everything the screens draw from; the app owns it and passes it down."""

    interval_s: float
    targets: dict[str, TargetData] = field(default_factory=dict)
    selected: str | None = None
    paused: bool = False
    sort: str = "compiles"
    filter: str = ""
    started: dict[str, float] = field(default_factory=dict)  # this user's, from discovery

    def ordered(self) -> list[TargetData]:
        return list(self.targets.values())

    def current(self) -> TargetData | None:
        return self.targets.get(self.selected) if self.selected else None

    def hosts(self) -> tuple[str, ...]:
        """Hosts of the targets read, else of the addresses, in order."""
        out: dict[str, None] = {}
        for d in self.targets.values():
            p = d.snapshot.process if d.snapshot else None
            host = p.host if p and p.host else d.target.rpartition(":")[0].strip("[]")
            out.setdefault(host, None)
        return tuple(out)
