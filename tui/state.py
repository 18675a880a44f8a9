"""What the dashboard remembers about each target between updates.

:class:`TargetData` folds a stream of :class:`~tui.source.Update` s into the
latest snapshot plus short histories (HBM and busy % per device, transfer
byte rates, recent events), one sample per update, so the sparklines and the
event timeline share one time axis. Everything here is pure data handling on
the UI thread: no I/O, no widgets.

Findings (:func:`tpu_info.views.findings.find`, the costliest part of an
update) are recomputed at once when what they read changed shape (a graph, a
compile, an event they read, a device), and at most every
:data:`FINDINGS_EVERY_S` seconds of the target's clock when only counts moved
(every step moves them): at 10 updates a second that is 2 finds a second
instead of 10, and nothing is lost (the Findings panel draws at that pace,
and the next update after the pause, or a disconnect, brings them up to date).

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
import re
from collections import deque
from dataclasses import dataclass, field, replace

from tpu_info.contract.catalog import INBOUND_DATA, OUTBOUND_DATA
from tpu_info.contract.model import (
    COMPILE_KINDS,
    TRANSFER_KINDS,
    Event,
    EventKind,
    Finding,
    LocalScan,
    Snapshot,
)
from tpu_info.views.findings import EVENTS_READ, find
from tpu_info.views.steps import interval_step_seconds, steps_per_second
from tui.procs import ProcessFilter
from tui.source import Conn, Update

HISTORY = 300  # samples kept per target: five minutes at the default 1 s
EVENTS = 500  # newest events kept per target
# Steps and transfers come by the thousand a second: they are rates (the step
# line, Transfers), never rows, and never push a compile out of the ring.
RATE_KINDS = frozenset({EventKind.STEP, *TRANSFER_KINDS})
# Events the dashboard itself notices (their ``seq`` is negative).
DISCONNECT, RECONNECT, FINDING = "disconnect", "reconnect", "finding"
FINDING_POINTS = 300  # refreshes of each finding's history kept
FINDINGS_EVERY_S = 0.5  # counts alone re-run the findings at most this often


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


@dataclass(frozen=True, slots=True)
class FindingPoint:
    """One refresh of a finding: when, how many times, and what it had cost."""

    time_unix: float
    count: int | None
    seconds_lost: float
    seconds_per_step: float | None
    share_of_step: float | None


_FUNCTION_RE = re.compile(r"\b[\w.]+\([^()\s]*(?:\([^()]*\))?[^()\s]*\)")


def finding_ids(findings: list[Finding]) -> list[str]:
    """A name for each finding that stays the same while its counts grow:
    kind, line and the function it names (``recompile_grad_mode|t.py:9|
    compile(Net.forward)``), numbered when two share it."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for f in findings:
        m = _FUNCTION_RE.search(f.message)
        base = f"{f.kind}|{f.location or ''}|{m.group() if m else ''}"
        n = seen[base] = seen.get(base, 0) + 1
        out.append(base if n == 1 else f"{base}#{n}")
    return out


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
    finding_ids: list[str] = field(default_factory=list)  # one per finding, in order
    finding_history: dict[str, deque[FindingPoint]] = field(default_factory=dict)
    # The kinds of event the findings read, kept apart so a flood of steps
    # cannot push a graph break's reason out before its finding is drawn.
    read_events: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS))
    version: int = 0  # bumps on every applied update
    _identity: tuple[int, float] | None = None
    _findings_key: tuple[object, ...] | None = None
    _findings_stale: bool = False  # what they read moved since they were computed
    _found_at: float = float("-inf")  # the reading they were computed from (its time)
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
            if self._findings_stale and self.snapshot is not None:
                self._refresh_findings(self.snapshot)  # the last reading, up to date
                changed = True
            return changed
        s = u.snapshot
        identity = (s.process.pid, s.process.start_time_unix) if s.process else None
        if self._identity is not None and identity != self._identity:
            self.samples.clear()  # a restarted program: its history starts again
            self.events.clear()
            self._last_seq = 0
            self.read_events.clear()
            self.finding_history.clear()
            self._found_at = float("-inf")
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
        self.read_events.extend(e for e in new_events if e.kind in EVENTS_READ)
        last_read = self.read_events[-1].seq if self.read_events else 0
        shape = (len(s.graphs), sum(g.compiles for g in s.graphs), len(s.devices),
                 s.left_out, s.sites, s.blind_spots, last_read)
        key = (shape, s.counters, tuple((d.name, d.count) for d in s.distributions), s.steps)
        news = False
        if key != self._findings_key:
            news = self._findings_key is None or shape != self._findings_key[0]
            self._findings_key = key
            self._findings_stale = True
        t = s.taken_at_unix
        if self._findings_stale and (news or not self._found_at <= t
                                     < self._found_at + FINDINGS_EVERY_S):
            self._refresh_findings(s)
        return True

    def _refresh_findings(self, s: Snapshot) -> None:
        """Findings of ``s`` now; the ones that are new become event rows."""
        seen = {(f.kind, f.location) for f in self.findings}
        self._find(s)
        self._findings_stale, self._found_at = False, s.taken_at_unix
        for f in self.findings:
            if (f.kind, f.location) not in seen:
                self._notice(FINDING, s.taken_at_unix, f.kind, f.message, f.location)

    def _notice(self, kind: str, time_unix: float, name: str, detail: str,
                location: str | None = None) -> None:
        """Records something the dashboard noticed as an event row."""
        self._noticed_n += 1
        self.noticed.append(Event(-self._noticed_n, time_unix, kind, name, "", detail, location))

    def _find(self, s: Snapshot) -> None:
        """The CLI's findings, over every event this target sent that they read
        (a streamed snapshot carries only the events new since the last one),
        and one point of each finding's history."""
        self.findings = find(replace(s, events=tuple(self.read_events)))
        self.finding_ids = finding_ids(self.findings)
        for fid, f in zip(self.finding_ids, self.findings, strict=True):
            points = self.finding_history.get(fid)
            if points is None:
                points = self.finding_history[fid] = deque(maxlen=FINDING_POINTS)
            points.append(FindingPoint(s.taken_at_unix, f.count, f.seconds_lost,
                                       f.seconds_per_step, f.share_of_step))
        if len(self.finding_history) > 4 * FINDING_POINTS:  # bounded: drop the gone ones
            now = set(self.finding_ids)
            for fid in [k for k in self.finding_history if k not in now]:
                del self.finding_history[fid]


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
    sort: str = "cost/step"
    filter: str = ""
    process_filter: ProcessFilter = field(default_factory=ProcessFilter)  # user / pid
    started: dict[str, float] = field(default_factory=dict)  # this user's, from discovery
    local: LocalScan | None = None  # this host's chips and owners (None: not scanned)
    all_chips: bool = False  # list the chips not usable here too (--all)
    host: str = ""  # this host's name: a process elsewhere is never joined to its chips

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
