"""Stable, bounded per-graph Prometheus series for one process.

The rule: the first ``named`` graphs a :class:`GraphSeries` sees (in the
ledger's first-seen order) each get a series of their own, labelled by short
hash, name, engine and computation (:func:`computation_hash`), for the life
of the process; they are never replaced, so no series vanishes as graphs
come and go. Every other graph is added into one ``graph="other"`` series,
present from the start at zero. So a process has at most ``named + 1``
series per family, whatever its graphs do.

Each series only grows: when a graph leaves the ledger (evicted as least
recently seen, counted in ``GraphsEvicted``, or cleared) or its counts go
down (cleared and seen again between two scrapes), its last values stay in
its series' retired part and what it counts afterwards is added on top. The
memory kept is one tuple per graph in the current ledger plus one per series.

Example:
    >>> from tpu_info.contract.model import GraphRecord
    >>> s = GraphSeries(named=1)
    >>> g = [GraphRecord("a" * 64, "jit(f)", "jax", 1.0, 1.0, compiles=2),
    ...      GraphRecord("b" * 64, "jit(g)", "jax", 2.0, 2.0, compiles=5)]
    >>> [(row.labels[0], row.compiles) for row in s.rows(g)]
    [('aaaaaaaaaaaa', 2.0), ('other', 5.0)]
    >>> [(row.labels[0], row.compiles) for row in s.rows(g[:1])]  # g evicted: kept
    [('aaaaaaaaaaaa', 2.0), ('other', 5.0)]
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tpu_info.contract.model import GraphRecord

OTHER = ("other", "other graphs", "", "other")  # (graph, name, engine, computation)

# compiles, compile seconds, cache hits, executions (None: not counted)
_Values = tuple[int, float, int, "int | None"]


@dataclass(frozen=True, slots=True)
class SeriesRow:
    """One series' values; ``executions`` None where its graphs' calls are not counted."""

    labels: tuple[str, str, str, str]  # graph (short hash or "other"), name, engine, computation
    compiles: float
    compile_seconds: float
    cache_hits: float
    executions: float | None


def computation_hash(g: GraphRecord) -> str:
    """The ``computation`` label: 12 hex digits of sha256 over the graph's
    engine, name and input signature (argument shapes, dtypes, shardings).

    The same on every rank of an SPMD program, where ``graph`` (the engine's
    cache key) need not be: JAX's key includes the compile options, which
    carry each ``jax.distributed`` process's index. A branch on the rank
    inside the function, with the same arguments, is not told apart.
    """
    text = "\0".join((g.engine, g.name, *g.signature))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]


def _went_down(old: _Values, new: _Values | None) -> bool:
    if new is None:
        return True
    return (new[0] < old[0] or new[1] < old[1] or new[2] < old[2]
            or (new[3] or 0) < (old[3] or 0))


class GraphSeries:
    """The per-graph series of one process, kept between scrapes.

    Args:
        named: how many graphs get a series of their own.
    """

    def __init__(self, named: int) -> None:
        self.named = named
        self._names: dict[str, tuple[str, str, str, str]] = {}  # hash -> labels, first seen first
        self._last: dict[str, _Values] = {}  # graphs of the previous call
        self._retired: dict[str | None, list[float]] = {}  # hash or None (other) -> sums
        self._counted: set[str | None] = set()  # series whose graphs' calls are counted
        self._lock = threading.Lock()

    def rows(self, graphs: Iterable[GraphRecord]) -> list[SeriesRow]:
        """The series for this ledger: the named graphs in the order they got
        their series, then ``other``."""
        graphs = list(graphs)
        current: dict[str, _Values] = {
            g.hash: (g.compiles, g.compile_seconds_total, g.cache_hits, g.executions)
            for g in graphs}
        with self._lock:
            for h, old in self._last.items():
                if _went_down(old, current.get(h)):
                    self._add(self._retired, self._key(h), old)
            if len(self._names) < self.named:
                for g in sorted(graphs, key=lambda g: (g.first_seen_unix, g.hash)):
                    if len(self._names) >= self.named:
                        break
                    self._names.setdefault(g.hash, (g.short_hash, g.name, g.engine,
                                                     computation_hash(g)))
            sums = {k: list(v) for k, v in self._retired.items()}
            for h, values in current.items():
                self._add(sums, self._key(h), values)
            self._last = current
            rows = []
            for key, labels in [*self._names.items(), (None, OTHER)]:
                c, secs, hits, ex = sums.get(key, (0, 0.0, 0, 0))
                rows.append(SeriesRow(labels, float(c), float(secs), float(hits),
                                      float(ex) if key in self._counted or key is None
                                      else None))
            return rows

    def _key(self, graph_hash: str) -> str | None:
        return graph_hash if graph_hash in self._names else None

    def _add(self, sums: dict[str | None, list[float]], key: str | None,
             values: _Values) -> None:
        acc = sums.setdefault(key, [0, 0.0, 0, 0])
        acc[0] += values[0]
        acc[1] += values[1]
        acc[2] += values[2]
        if values[3] is not None:
            acc[3] += values[3]
            self._counted.add(key)
