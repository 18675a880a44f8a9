"""Which hooked processes a ``tpu-info exporter`` poll asks, and why not the others.

A host may hold many more discovery records than programs that answer (a
thousand records of live processes whose servers are gone or hung), and a
dial to a target that never answers costs a thread for the whole poll and a
socket that gRPC keeps for up to 20 s after the call ends. So a poll never
asks "the first N" records, and no record's place in any order can keep a
live program waiting (issue 42 item 4: 500 hung records newer than a live
program kept it unasked for 130-140 s). :class:`TargetChooser`:

1. asks the targets that answered the last poll (newest first), at most
   ``max_targets``, never limited further: they cost one kept channel each;
2. of the others, looks at every one whose turn it is at once
   (:func:`tpu_info.net.greet.greeters`: one thread, one socket each for a
   fraction of a second, closed before the poll dials): those whose server
   greets are asked this poll whatever the others do;
3. of those that did not greet, dials at most ``dial_budget`` less those
   that hung (timed out) in the last ``window_s`` (gRPC's connection
   timeout), least recently asked first (each gets its turn, oldest and
   newest records alike), so neither the exporter's fds nor its threads
   grow with the number of dead records.

A target that did not answer ``n`` polls in a row has its turn again only
after ``min(2 ** (n - 1), MAX_BACKOFF_POLLS)`` polls: hung records cost
little, and none waits longer than that. A loopback target whose port no
socket of this host listens on is not dialled at all. Everything not asked
is counted by reason (:data:`REASONS`), which the exporter serves as
``tpu_info_exporter_targets_skipped{reason}``: nothing is dropped silently.
A target skipped whose last try failed (:meth:`TargetChooser.not_answering`)
keeps its ``tpu_info_target_up 0`` while it waits: it is still down.

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
MAX_BACKOFF_POLLS = 16  # a target that keeps failing has its turn at least this often

# Why a target was not asked this poll (the ``reason`` label).
MAX_TARGETS_REASON = "max_targets"  # more answering targets than --max-targets
PORT_CLOSED = "port_closed"  # nothing listens on its (loopback) port
NOT_ANSWERING = "not_answering"  # did not answer lately; asked again in its turn (backed off)
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
    fails: int = 0  # polls in a row it was tried and did not answer
    turn: int = 0  # the poll from which it may be tried again


class TargetChooser:
    """Chooses each poll's targets (see the module docstring); not locked:
    one caller, the exporter's poll.

    Args:
        max_targets: targets asked per poll at most.
        dial_budget: dials of targets not known to answer per poll, less
            those that hung within ``window_s``.
        window_s: how long a hung dial counts against the budget.
        clock: monotonic seconds.
        greet: ``greet(targets) -> those whose server greets`` (step 2;
            :func:`tpu_info.net.greet.greeters` with a short timeout); None:
            every target not answering waits for the dial budget.
    """

    def __init__(self, max_targets: int = MAX_TARGETS, dial_budget: int = DIAL_BUDGET,
                 window_s: float = DIAL_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 greet: Callable[[list[str]], set[str]] | None = None) -> None:
        self.max_targets = max_targets
        self.dial_budget = dial_budget
        self.window_s = window_s
        self._clock = clock
        self._greet = greet
        self._known: dict[Key, _Known] = {}
        self._hung: deque[float] = deque()  # when dials hung, oldest first
        self._polls = 0

    def any_new(self, processes: Iterable[DiscoveredProcess]) -> bool:
        """Whether a record names a process no poll has met yet."""
        return any(key_of(p) not in self._known for p in processes)

    def _turn(self, p: DiscoveredProcess) -> tuple[float, float]:
        """Least recently asked first (never asked: first), newest first among equals."""
        k = self._known.get(key_of(p))
        return (k.asked_at if k is not None and k.asked else 0.0), -p.start_time

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
        self._polls += 1
        while self._hung and self._hung[0] <= now - self.window_s:
            self._hung.popleft()
        dials = max(0, self.dial_budget - len(self._hung))
        procs = list(processes)
        live = {key_of(p) for p in procs}
        for gone in [k for k in self._known if k not in live]:
            del self._known[gone]
        asked: list[DiscoveredProcess] = []
        skipped: Counter[str] = Counter()
        answering, due = [], []
        for p in procs:
            k = self._known.get(key_of(p))
            if k is not None and k.answered_last:
                answering.append(p)
            elif listening is not None and p.port and p.port not in listening \
                    and is_loopback_host(p.host):
                skipped[PORT_CLOSED] += 1
            elif k is not None and k.turn > self._polls:
                skipped[NOT_ANSWERING] += 1  # backed off: its turn comes
            else:
                due.append(p)
        for p in sorted(answering, key=lambda p: -p.start_time):
            if len(asked) >= self.max_targets:
                skipped[MAX_TARGETS_REASON] += 1
            else:
                asked.append(p)
        greeted = self._greet([p.target for p in due if p.target]) \
            if self._greet is not None and due else set()
        due.sort(key=self._turn)
        # Those that greeted go first: a poll's workers are not all taken by dials that hang.
        due.sort(key=lambda p: p.target not in greeted)
        for p in due:
            k = self._known.get(key_of(p))
            if len(asked) >= self.max_targets:
                skipped[MAX_TARGETS_REASON] += 1
            elif p.target in greeted:
                asked.append(p)
            elif dials > 0:
                dials -= 1
                asked.append(p)
            else:
                skipped[NOT_ANSWERING if k is not None and k.asked else DIAL_BUDGET_REASON] += 1
                if self._greet is not None:  # looked at, silent: it waits its turn
                    self._failed(self._known.setdefault(key_of(p), _Known()))
        for p in asked:
            k = self._known.setdefault(key_of(p), _Known())
            k.asked_at, k.asked = now, True
        return asked, skipped

    def not_answering(self, processes: Iterable[DiscoveredProcess]) -> list[DiscoveredProcess]:
        """Of ``processes``, those whose last try failed (asked and did not
        answer, or looked at and silent), in the order given: a poll that
        skips one (backed off, waiting for the dial budget) still says it
        is down."""
        out = []
        for p in processes:
            k = self._known.get(key_of(p))
            if k is not None and k.fails > 0:
                out.append(p)
        return out

    def _failed(self, k: _Known) -> None:
        k.fails += 1
        k.turn = self._polls + min(2 ** (k.fails - 1), MAX_BACKOFF_POLLS)

    def answered(self, p: DiscoveredProcess, ok: bool, hung: bool = False) -> None:
        """What a target did this poll (``hung``: it timed out, or was never
        reached within the poll)."""
        k = self._known.setdefault(key_of(p), _Known())
        k.answered_last = ok
        k.answered_ever = k.answered_ever or ok
        if ok:
            k.fails, k.turn = 0, 0
        else:
            self._failed(k)
        if hung:
            self._hung.append(self._clock())
