"""Which hooked processes a ``tpu-info exporter`` poll asks, and why not the others.

A host may hold many more discovery records than programs that answer (a
thousand records of live processes whose servers are gone or hung), and a
dial to a target that never answers costs a thread for the whole poll and a
socket that gRPC keeps for up to 20 s after the call ends. So a poll never
asks "the first N" records. :class:`TargetChooser` orders them:

1. the targets that answered the last poll (newest first), at most
   ``max_targets``, never limited further: they cost one kept channel each;
2. targets never asked yet (newest first: a program just started);
3. targets that answered once but not the last poll;
4. targets that never answered, the least recently asked first (each gets
   its turn).

Groups 2-4 are dials that may hang: a poll makes at most ``dial_budget``
of them less those that hung (timed out) in the last ``window_s`` (gRPC's
connection timeout, the longest an abandoned socket is kept), so neither
the exporter's fds nor its threads grow with the number of dead records,
while new programs that answer cost nothing of the budget. A loopback target whose port no
socket of this host listens on is not dialled at all. Everything not asked
is counted by reason (:data:`REASONS`), which the exporter serves as
``tpu_info_exporter_targets_skipped{reason}``: nothing is dropped silently.

Example:
    >>> chooser = TargetChooser(max_targets=256)
    >>> asked, skipped = chooser.choose([], listening=None)
    >>> asked, dict(skipped)
    ([], {})
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tpu_info.contract.discovery_record import DiscoveredProcess
from tpu_info.net.targets import is_loopback_host

MAX_TARGETS = 256  # targets asked per poll at most (a host runs a few dozen)
DIAL_BUDGET = 64  # dials of targets not known to answer, per window
DIAL_WINDOW_S = 20.0  # gRPC's connection timeout: an abandoned dial's socket lives as long

# Why a target was not asked this poll (the ``reason`` label).
MAX_TARGETS_REASON = "max_targets"  # more answering targets than --max-targets
PORT_CLOSED = "port_closed"  # nothing listens on its (loopback) port
NOT_ANSWERING = "not_answering"  # did not answer lately; asked again in its turn
DIAL_BUDGET_REASON = "dial_budget"  # never asked: waits while recent dials hung
REASONS = (MAX_TARGETS_REASON, PORT_CLOSED, NOT_ANSWERING, DIAL_BUDGET_REASON)

Key = tuple[object, ...]


def key_of(p: DiscoveredProcess) -> Key:
    """Which process a record names: pid, start time and port."""
    return (p.pid, p.start_time, p.port)


@dataclass(slots=True)
class _Known:
    answered_last: bool = False
    answered_ever: bool = False
    asked_at: float = 0.0
    asked: bool = False


class TargetChooser:
    """Chooses each poll's targets (see the module docstring); not locked:
    one caller, the exporter's poll.

    Args:
        max_targets: targets asked per poll at most.
        dial_budget: dials of targets not known to answer per poll, less
            those that hung within ``window_s``.
        window_s: how long a hung dial counts against the budget.
        clock: monotonic seconds.
    """

    def __init__(self, max_targets: int = MAX_TARGETS, dial_budget: int = DIAL_BUDGET,
                 window_s: float = DIAL_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_targets = max_targets
        self.dial_budget = dial_budget
        self.window_s = window_s
        self._clock = clock
        self._known: dict[Key, _Known] = {}
        self._hung: deque[float] = deque()  # when dials hung, oldest first

    def _group(self, p: DiscoveredProcess) -> tuple[int, float]:
        k = self._known.get(key_of(p))
        if k is None:
            return 1, -p.start_time
        if k.answered_last:
            return 0, -p.start_time
        return (2 if k.answered_ever else 3), k.asked_at

    def any_new(self, processes: Iterable[DiscoveredProcess]) -> bool:
        """Whether a record names a process no poll has met yet."""
        return any(key_of(p) not in self._known for p in processes)

    def choose(self, processes: Iterable[DiscoveredProcess],
               listening: Mapping[int, set[int]] | None) -> tuple[
                   list[DiscoveredProcess], Counter[str]]:
        """This poll's targets, in the order to ask them, and how many were
        not asked, by reason.

        Args:
            processes: the live processes discovery found.
            listening: ``{port: uids}`` of the host's listening sockets
                (None: cannot tell, every target is dialled).
        """
        now = self._clock()
        while self._hung and self._hung[0] <= now - self.window_s:
            self._hung.popleft()
        dials = max(0, self.dial_budget - len(self._hung))
        procs = list(processes)
        live = {key_of(p) for p in procs}
        for gone in [k for k in self._known if k not in live]:
            del self._known[gone]
        asked: list[DiscoveredProcess] = []
        skipped: Counter[str] = Counter()
        for p in sorted(procs, key=self._group):
            first = self._group(p)[0] == 0
            if listening is not None and p.port and p.port not in listening \
                    and is_loopback_host(p.host) and not first:
                skipped[PORT_CLOSED] += 1
            elif len(asked) >= self.max_targets:
                skipped[MAX_TARGETS_REASON] += 1
            elif first:
                asked.append(p)
            elif dials > 0:
                dials -= 1
                asked.append(p)
            else:
                k = self._known.get(key_of(p))
                skipped[NOT_ANSWERING if k is not None and k.asked else DIAL_BUDGET_REASON] += 1
        for p in asked:
            k = self._known.setdefault(key_of(p), _Known())
            k.asked_at, k.asked = now, True
        return asked, skipped

    def answered(self, p: DiscoveredProcess, ok: bool, hung: bool = False) -> None:
        """What a target did this poll (``hung``: it timed out, or was never
        reached within the poll)."""
        k = self._known.setdefault(key_of(p), _Known())
        k.answered_last = ok
        k.answered_ever = k.answered_ever or ok
        if hung:
            self._hung.append(self._clock())
