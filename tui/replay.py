"""A saved run replayed in the dashboard (``tpu-info --watch --from FILE``).

The file holds the run's last snapshot: its events (compiles, recompiles,
graph breaks, steps) and each distribution's recent samples carry their
times. The replay cuts the run into :data:`FRAMES` moments from its start
to its end; each frame holds the events and recent samples up to that
moment (the counters and tables are the run's final ones: the file keeps no
earlier values), so the time line, the step-time strip and the events panel
fill in as they did while it ran. The last frame is the whole snapshot,
then the target reads as ended, with how and when.

Example:
    >>> from tpu_info.contract.model import Event, Snapshot
    >>> s = Snapshot(110.0, uptime_seconds=10.0, last_seq=2,
    ...              events=(Event(1, 101.0, "compile"), Event(2, 109.0, "recompile")))
    >>> [len(f.events) for f in frames(s, 3)]
    [1, 1, 2]
"""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.model import DistributionReading, Samples, Snapshot
from tui.source import Conn, Found, Source, Update

FRAMES = 60


def _cut_recent(d: DistributionReading, until: float) -> DistributionReading:
    if not d.recent:
        return d
    kept = [(t, v) for t, v in d.recent if t <= until]
    return replace(d, recent=Samples([t for t, _ in kept], [v for _, v in kept]))


def frames(s: Snapshot, n: int = FRAMES) -> list[Snapshot]:
    """``n`` snapshots of the run at even moments from its start to its end."""
    end = s.taken_at_unix
    start = end - max(0.0, s.uptime_seconds)
    out = []
    for k in range(1, n + 1):
        at = start + (end - start) * k / n
        if k == n:
            out.append(s)
            break
        events = tuple(e for e in s.events if e.time_unix <= at)
        out.append(replace(
            s, taken_at_unix=at, uptime_seconds=at - start, events=events,
            last_seq=events[-1].seq if events else 0,
            distributions=tuple(_cut_recent(d, at) for d in s.distributions)))
    return out


class ReplaySource(Source):
    """The frames of one saved run, delivered at once, then its end."""

    def __init__(self, label: str, snapshot: Snapshot, ended: str, ended_unix: float) -> None:
        self.label = label
        self.snapshot = snapshot
        self.ended = ended
        self.ended_unix = ended_unix

    def initial(self) -> list[Update | Found]:
        out: list[Update | Found] = [Update(self.label, Conn.CONNECTING)]
        out += [Update(self.label, Conn.POLLING, f) for f in frames(self.snapshot)]
        out.append(Update(self.label, Conn.DISCONNECTED,
                          error=f"a saved run: the program ended ({self.ended})",
                          since_unix=self.ended_unix or self.snapshot.taken_at_unix))
        return out
