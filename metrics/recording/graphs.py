"""Ledger of compiled graphs: one entry per graph hash.

Each entry holds the function's name, engine, first and last time seen,
compiles, compile time (total and last), cache hits, executions (where the
engine tells), the latest input signature, the last few distinct signatures,
and the recompile causes with the user's source line.

Bounds (eviction rule): at most ``max_graphs`` entries; when full, the entry
seen least recently is dropped (LRU: every compile, hit or execution counts as
a sighting) and ``evicted`` grows by one. Per entry, the last
``max_causes`` causes and ``max_signatures`` distinct signatures are kept.
Executions are appended to a journal without a lock and folded in before
the next change or snapshot (:mod:`metrics.recording.journal`'s policy), so
``last_seen`` of a graph that only executes has the resolution of the
scrape interval.

Example:
    >>> ledger = GraphLedger()
    >>> ledger.compiled("ab12", "jit(f)", "jax", seconds=0.5, signature=("f32[2]",))
    >>> ledger.snapshot()[0].compiles
    1
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import replace

from metrics.recording.journal import FOLD_AT, Journal
from tpu_info.contract.model import GraphRecord, RecompileCause
from tpu_info.contract.reuse import Kept

# Graph names a compile gets from JAX's own wrapper, not the user's function:
# JAX 0.10 compiles every jax.pmap as jit(_fun) (a jit of shard_map); the
# counted function that ran the graph names it (``pmap(eval_step)``), so two
# pmaps' graphs are never one function's (flax's imagenet: the evaluation's
# first compile in the loop was merged into the train step's).
WRAPPER_NAMES = frozenset({"jit(_fun)"})


class _Entry:
    __slots__ = (
        "hash", "name", "engine", "first_seen", "last_seen", "compiles",
        "compile_total", "compile_last", "cache_hits", "executions",
        "signature", "signatures", "causes", "changes", "kept", "history",
        "device_ns", "device_samples", "cause_edits", "loop", "const_bytes",
    )

    def __init__(self, graph_hash: str, name: str, engine: str, now: float,
                 max_causes: int, max_signatures: int) -> None:
        self.hash = graph_hash
        self.name = name
        self.engine = engine
        self.first_seen = now
        self.last_seen = now
        self.compiles = 0
        self.compile_total = 0.0
        self.compile_last = 0.0
        self.cache_hits = 0
        self.executions: int | None = None
        self.device_ns: int | None = None  # median device ns of one execution (engine-measured)
        self.device_samples = 0
        self.loop: tuple[str, int] = ("", 0)  # (the user's line, its operations): compiles.py
        self.const_bytes = 0  # arrays compiled into it as constants (the last compile's)
        self.signature: tuple[str, ...] = ()
        self.signatures: deque[tuple[str, ...]] = deque(maxlen=max_signatures)
        self.causes: deque[RecompileCause] = deque(maxlen=max_causes)
        # Versions for tpu_info.contract.reuse's rule: every change counts in
        # ``changes`` (the record), only a compile in ``compiles`` (the
        # (signatures, causes) tuples: records of execution-only changes
        # share them, so encoders can reuse their bytes).
        self.changes = 0
        self.cause_edits = 0  # causes changed in place (a compile's time added later)
        self.kept: Kept[GraphRecord] = Kept()
        self.history: Kept[tuple[tuple[tuple[str, ...], ...], tuple[RecompileCause, ...]]] = (
            Kept())

    def record(self) -> GraphRecord:
        kept = self.kept  # read in place: this runs for every entry of a snapshot
        return kept.value if kept.version == self.changes else kept.put(self.changes, self._build())

    def _build(self) -> GraphRecord:
        signatures, causes = self.history.get(
            (self.compiles, self.cause_edits), lambda: (tuple(self.signatures), tuple(self.causes)))
        return GraphRecord(
            hash=self.hash, name=self.name, engine=self.engine,
            first_seen_unix=self.first_seen, last_seen_unix=self.last_seen,
            compiles=self.compiles, compile_seconds_total=self.compile_total,
            compile_seconds_last=self.compile_last, cache_hits=self.cache_hits,
            executions=self.executions, signature=self.signature,
            signatures=signatures, causes=causes,
            device_seconds=None if self.device_ns is None else self.device_ns / 1e9,
            device_samples=self.device_samples,
            loop_line=self.loop[0], loop_ops=self.loop[1], const_bytes=self.const_bytes,
        )


class GraphLedger:
    """Thread-safe, bounded ledger of compiled graphs (see module docstring)."""

    def __init__(
        self,
        max_graphs: int = 2000,
        max_causes: int = 32,
        max_signatures: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_graphs = max_graphs
        self._max_causes = max_causes
        self._max_signatures = max_signatures
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently seen first
        self._first_seen: dict[str, _Entry] = {}  # the same entries, in the order first seen
        # (hash, name, engine, n) of executions, folded under the ledger's lock.
        self._executions = Journal(self._fold_executions, lock=self._lock)
        self._queue = self._executions.queue
        # Called before every read: folds hot-path journals in (the recorder's).
        self.before_read: Callable[[], None] = lambda: None
        self.evicted = 0
        # The last snapshot, made again only where entries changed (the reuse
        # rule of tpu_info.contract.reuse): positions hold while no entry comes or goes.
        self._members = 0  # entries added, evicted or cleared
        self._dirty: set[_Entry] = set()  # entries changed since the last snapshot
        self._last: tuple[int, tuple[GraphRecord, ...], dict[str, int]] | None = None

    def _touch(self, graph_hash: str, name: str, engine: str) -> _Entry:
        # Caller holds the lock.
        now = self._clock()
        e = self._entries.get(graph_hash)
        if e is None:
            self._members += 1
            e = _Entry(graph_hash, name, engine, now, self._max_causes, self._max_signatures)
            self._entries[graph_hash] = e
            self._first_seen[graph_hash] = e
            while len(self._entries) > self.max_graphs:
                gone, _ = self._entries.popitem(last=False)
                del self._first_seen[gone]
                self.evicted += 1
        else:
            e.last_seen = now
            self._entries.move_to_end(graph_hash)
        e.changes += 1
        self._dirty.add(e)
        return e

    def compiled(
        self,
        graph_hash: str,
        name: str,
        engine: str,
        seconds: float,
        signature: tuple[str, ...] = (),
        cause: RecompileCause | None = None,
        loop: tuple[str, int] | None = None,
        const_bytes: int = 0,
    ) -> None:
        """Records one real compile of ``graph_hash`` (``loop``: the user's
        line that put most of its operations into it, and how many;
        ``const_bytes``: arrays compiled into it as constants)."""
        with self._lock:
            self._executions.flush_held()
            e = self._touch(graph_hash, name, engine)
            e.compiles += 1
            if loop is not None:
                e.loop = loop
            if const_bytes:
                e.const_bytes = const_bytes
            e.compile_total += seconds
            e.compile_last = seconds
            if signature:
                e.signature = signature
                if not e.signatures or e.signatures[-1] != signature:
                    e.signatures.append(signature)
            if cause is not None:
                e.causes.append(cause)

    def compile_time_added(self, graph_hash: str, seconds: float) -> None:
        """More compile time for the last compile of a known graph (a part the
        engine compiles later, such as torch.compile's lazy backward); not a
        compile of its own: the last cause's own time (where it has one) grows
        by it. A graph no longer in the ledger is left alone."""
        with self._lock:
            if graph_hash not in self._entries:
                return
            self._executions.flush_held()
            e = self._touch(graph_hash, "", "")
            e.compile_total += seconds
            e.compile_last += seconds
            if e.causes and e.causes[-1].seconds is not None:
                last = e.causes[-1]
                e.causes[-1] = replace(last, seconds=(last.seconds or 0.0) + seconds)
                e.cause_edits += 1

    def cache_hit(self, graph_hash: str, name: str, engine: str,
                  signature: tuple[str, ...] = ()) -> None:
        """Records a compile avoided by a cache (persistent or in-memory)."""
        with self._lock:
            self._executions.flush_held()
            e = self._touch(graph_hash, name, engine)
            e.cache_hits += 1
            if signature and not e.signature:
                e.signature = signature

    def executed(self, graph_hash: str, name: str, engine: str, n: int = 1) -> None:
        """Records ``n`` executions of a graph: one lock-free append, folded in
        before the next change or snapshot (this runs on every training step)."""
        q = self._queue
        q.append((graph_hash, name, engine, n))
        if len(q) >= FOLD_AT:
            self._executions.flush()

    def _fold_executions(self, batch: list[tuple[str, str, str, int]]) -> None:
        # The journal's fold: the caller holds the lock.
        touch = self._touch
        for graph_hash, name, engine, n in batch:
            e = touch(graph_hash, name, engine)
            e.executions = (e.executions or 0) + n
            if e.name in WRAPPER_NAMES and name != e.name:  # (touch marked it changed)
                e.name = name  # the function that ran it: pmap(train_step), not jit(_fun)

    def device_time(self, graph_hash: str, median_ns: int, samples: int) -> None:
        """The device's time for one execution of a known graph (the median of
        ``samples`` executions the engine observed complete); a graph no
        longer in the ledger is left alone."""
        with self._lock:
            e = self._entries.get(graph_hash)
            if e is None or (e.device_ns, e.device_samples) == (median_ns, samples):
                return
            e.device_ns, e.device_samples = median_ns, samples
            e.changes += 1
            self._dirty.add(e)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
            self._entries.clear()
            self._first_seen.clear()
            self.evicted = 0
            self._members += 1
            self._dirty.clear()
            self._last = None

    def snapshot(self) -> tuple[GraphRecord, ...]:
        """Copies of all entries, in the order they were first seen (stable
        from one snapshot to the next, so encoders can reuse what did not
        change)."""
        self.before_read()
        with self._lock:
            self._executions.flush_held()
            last, dirty = self._last, self._dirty
            if last is not None and last[0] == self._members:
                if not dirty:
                    return last[1]
                records = list(last[1])
                at = last[2]
                for e in dirty:
                    records[at[e.hash]] = e.record()
                index = at
            else:
                records = [e.record() for e in self._first_seen.values()]
                index = {h: i for i, h in enumerate(self._first_seen)}
            dirty.clear()
            snap = tuple(records)
            self._last = (self._members, snap, index)
            return snap
