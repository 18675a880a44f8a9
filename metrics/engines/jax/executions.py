"""Executions per graph: the calls journal that every counting wrapper writes
(``jax.jit``'s, ``jax.pmap``'s, AOT-compiled calls', ``metrics.track``'s)
folded into ``ExecuteComputation``/``ExecuteTime``, the executions of each
graph in the ledger, and the call times steps and busy % are inferred from
(:mod:`metrics.engines.jax.steps`).

A record is ``CALL_FIELDS`` items: (owner, key, start, end, compiled graph
or None); ``owner`` is a :class:`metrics.engines.jax.calls.Owner`, ``key``
the shapes and dtypes that pick its graph once it has more than one.

Example:
    >>> from metrics.recording.recorder import Recorder              # doctest: +SKIP
    >>> runs = Executions(Recorder())                      # doctest: +SKIP
    >>> runs.queue.extend((owner, None, 0, 10, None)); runs.journal.flush()  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import operator
import time
from typing import TYPE_CHECKING, Any

from metrics.engines.jax.context import CALL_FIELDS, ENGINE
from metrics.recording import sampling
from metrics.recording.callstats import CallTimes
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names

if TYPE_CHECKING:
    from metrics.engines.jax.calls import Owner


class Executions:
    """Counted calls of one engine: the journal and what its fold fills in."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self._exec_count = recorder.counter(names.EXECUTE_COUNT)
        self._exec_time = recorder.distribution(names.EXECUTE_TIME)
        self._busy_time = recorder.counter(names.DEVICE_BUSY_TIME)
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        # For the inferred step (and the step loop's bounds, in unix time).
        self.call_times = CallTimes("jitted function", to_unix=recorder.mono_to_unix)
        self.tracked_ns = 0  # time inside tracked calls, for the busy % estimate
        self.inferred_ns = 0  # inside the other counted calls: used without tracked ones

    def forget(self) -> None:
        """Forgets call times (the counters and the ledger are the recorder's)."""
        self.call_times.clear()
        self.tracked_ns = self.inferred_ns = 0

    def _fold(self, flat: list[Any]) -> None:
        """Counted calls -> ExecuteTime and executions of the graph each ran."""
        owners, keys = flat[0::CALL_FIELDS], flat[1::CALL_FIELDS]
        starts, ends, compiled = flat[2::CALL_FIELDS], flat[3::CALL_FIELDS], flat[4::CALL_FIELDS]
        self._exec_count.inc(len(owners))
        uniq = set(owners)
        if 0 in ends:  # calls counted untimed (metrics.recording.sampling)
            tracked_ns, other_ns = self._fold_sampled(owners, starts, ends, compiled, uniq)
        else:
            durations = list(map(operator.sub, ends, starts))
            self._exec_time.observe_many(durations, ends)
            if len(uniq) == 1 and not any(compiled):  # the usual batch
                owners[0].usual_ns = sum(durations) // len(durations)
            tracked_ns, other_ns = self.call_times.fold(owners, starts, ends, durations, uniq)
        self.tracked_ns += tracked_ns
        self.inferred_ns += other_ns
        # The busy-% basis as a counter (rate() of it is the busy ratio):
        # tracked time once there is any, counted jitted calls before.
        self._busy_time.inc(tracked_ns if self.tracked_ns else other_ns)
        executed = self.rec.ledger.executed
        if not any(compiled) and keys.count(None) == len(keys):
            # The usual batch: no call compiled and none carries a key, so
            # each ran its function's last graph; counted per function in C
            # (one function, the usual case, needs no count: Counter costs
            # ~60 ns a record).
            per_owner = ({owners[0]: len(owners)} if len(uniq) == 1
                         else collections.Counter(owners))
            for owner, n in per_owner.items():
                if owner.last_hash:
                    executed(owner.last_hash, owner.name, ENGINE, n)
            return
        runs: dict[tuple[Owner, str], int] = {}  # (counted function, graph) -> calls
        for owner, key, graph in zip(owners, keys, compiled, strict=True):
            known = owner.graphs
            if graph:
                if key is not None:
                    known[key] = graph
                graph_hash = graph
            else:
                graph_hash = (known.get(key) if key is not None else None) or owner.last_hash
            if graph_hash:
                owner.last_hash = graph_hash
                runs[(owner, graph_hash)] = runs.get((owner, graph_hash), 0) + 1
        for (owner, graph_hash), n in runs.items():
            executed(graph_hash, owner.name, ENGINE, n)

    def _fold_sampled(self, owners: list[Owner], starts: list[int], ends: list[int],
                      compiled: list[str | None], uniq: set[Owner]) -> tuple[int, int]:
        """ExecuteTime and call times of a batch where some calls were
        counted untimed: each timed call stands for its function's untimed
        ones; a function with none timed here is taken at its mean so far."""
        if any(compiled):  # a call that compiled stands apart: its time is mostly the compile
            groups = [o if c is None else (o, "compiled") for o, c in zip(owners, compiled,
                                                                          strict=True)]
            t = sampling.timed(owners, starts, ends, uniq, groups)
            usual = [c is None for e, c in zip(ends, compiled, strict=True) if e]
        else:
            t = sampling.timed(owners, starts, ends, uniq)
            usual = None
        if t.durations:
            self._exec_time.observe_weighted(t.durations, t.weights, t.ends)
            _note_usual_means(t.owners, t.durations, usual)
        tracked_ns, other_ns = self.call_times.fold(t.owners, t.starts, t.ends, t.durations,
                                                    set(t.owners), t.weights, t.trailing)
        if t.untimed_only:
            at = t.ends[-1] if t.ends else time.monotonic_ns()
            for owner, n in t.untimed_only.items():
                mean = self.call_times.mean_ns(owner)
                if mean is not None:
                    self._exec_time.observe_weighted([mean], [n], [at])
            more_tracked, more_other = self.call_times.fold_untimed(t.untimed_only)
            tracked_ns += more_tracked
            other_ns += more_other
        return tracked_ns, other_ns


def _note_usual_means(owners: list[Owner], durations: list[int],
                      usual: list[bool] | None) -> None:
    """Each owner's mean over its timed calls that did not compile (``usual``:
    which did not; None: none did): what its untimed calls are taken at when
    a batch holds none of its timed ones."""
    acc: dict[Owner, list[int]] = {}
    for i, (o, d) in enumerate(zip(owners, durations, strict=True)):
        if usual is None or usual[i]:
            a = acc.setdefault(o, [0, 0])
            a[0] += d
            a[1] += 1
    for o, (total, n) in acc.items():
        o.usual_ns = total // n
