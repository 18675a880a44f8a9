"""Prometheus metric families from one :class:`~tpu_info.contract.model.Snapshot`.

The pure half of the Prometheus exposition: no server, no cache, no state
beyond what a :class:`SeriesState` carries between scrapes of one process.
The hook's in-process endpoint (``metrics.export.prometheus``) and the host
exporter (one call per hooked process, with ``host``/``program``/``rank``
labels: an identity that outlives a restart, the ``pid`` only on
``tpu_info_process_info``) both call :func:`families`.

Names are ``tpu_info_`` + snake_case + unit suffix: ``CompileTime`` (ns) ->
``tpu_info_compile_time_seconds``, ``OutboundData`` ->
``tpu_info_outbound_data_bytes``, the counter ``UncachedCompile`` ->
``tpu_info_uncached_compile_total``. One family per concept, with labels:
the engines' per-op counters (``lazy::add``, ``xla::mm``, ``aten::nonzero``,
torch._lazy's and torch_xla's ``ns::op`` names) are the one family
``tpu_info_ops_total{op_namespace="lazy",op="add"}`` (``aten``: ops that fell
back to the CPU; not ``namespace``: a Kubernetes pod's). Every counter of the
catalog that the process's engines record is present from the first scrape,
at zero until it counts, so ``increase()`` and alerts see the first event; a
histogram (28 series) appears with its first sample, an engine's record that
mirrors one of the catalog (JAX's ``jax.monitoring`` compile durations) is
left out beside it, and a one-off figure (``catalog.ONE_OFF``) is one gauge.

Distributions are exported as **histograms**, not summaries. A summary's
quantiles cannot be combined across processes or hosts (the mean of p99s is
not a p99), while histogram buckets add up, which is what a fleet needs
(``histogram_quantile(0.99, sum by (le) (rate(..._bucket[5m])))``) and what
our own log-spaced buckets were chosen for. They are classic histograms:
prometheus_client 0.26 writes native (sparse) histograms only in its
experimental OpenMetrics 2.0 text, which Prometheus does not read (it takes
native histograms from the protobuf format only, which prometheus_client
does not write). So our fine buckets (0.5 % relative error, up to thousands
of them) are coarsened to a fixed, small set of ``le`` edges per unit
(:data:`EDGES`): 1-2-5 per decade from 10 us to 1000 s for times (25
edges, neighbours at most 2.5x apart), powers of 4 from 1 B to 1 TiB for
bytes (21), 1-2-5 per decade from 0.01 to 1e6 for plain numbers (25): every
series costs each process and every Prometheus that keeps it, and the exact
percentiles stay in the snapshot (``tpu-info``, ``--json``). A fine bucket ``(g**(k-1), g**k]`` is
counted under the first edge above its lower bound, so a sample exactly on
an edge (4096 bytes) lands in that edge's bucket, every sample <= an edge is
counted under it, and only samples within one fine bucket (about 1 %) above
an edge can be counted with it; the exact min and max clamp the ends.

Per-graph counters (``tpu_info_graph_compiles_total`` and its siblings,
labels ``graph`` = short hash, ``name``, ``engine``, and ``computation``: a
hash of name and input signature that is the same on every rank of one SPMD
program where ``graph`` need not be) follow
:mod:`tpu_info.outputs.graph_series`' rule: the first :data:`TOP_GRAPHS`
graphs the process compiled keep a series each for its life, every later
graph adds into ``graph="other"``; series only grow and never vanish as the
ledger evicts graphs (``tpu_info_graphs_evicted_total`` counts those).

Other families: device memory gauges per device with a ``source`` label, the
busy ratio (a windowed gauge; ``rate(tpu_info_device_busy_time_seconds_total
[1m])`` is the same estimate as a counter), ``tpu_info_process_info`` and the
process start time (the info: ``pid``, ``program``, ``rank`` when a job
says: :mod:`tpu_info.outputs.identity`), and per finding kind (``kind`` label: ``per_step_sync``,
``recompile_short_last_batch``, ...) ``tpu_info_findings``,
``tpu_info_finding_seconds_lost`` and ``tpu_info_finding_share_of_step_ratio``,
from the same rules as the CLI, computed when scraped.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> fams = {f.name: f for f in families(Snapshot(taken_at_unix=0.0), {"host": "h1"})}
    >>> fams["tpu_info_graphs_evicted"].samples[0].value, fams["tpu_info_ops"].type
    (0.0, 'counter')
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from tpu_info.contract import catalog, names, reuse
from tpu_info.contract.model import DistributionReading, Snapshot, Unit
from tpu_info.contract.safe import clean
from tpu_info.outputs.graph_series import GraphSeries
from tpu_info.outputs.identity import job_rank, program_name

log = logging.getLogger("tpu_info.outputs.prometheus")

PREFIX = "tpu_info_"
TOP_GRAPHS = 20  # graphs with a series of their own (tpu_info.outputs.graph_series)
RESERVED_NAME, DUPLICATE = "reserved", "duplicate"  # more reasons (tpu_info.contract.names)


def _decades(lo_exp: int, hi_exp: int, steps: Sequence[float]) -> tuple[float, ...]:
    out = [float(f"{m}e{e}") for e in range(lo_exp, hi_exp) for m in steps]
    return tuple(out) + (float(f"1e{hi_exp}"),)


# Histogram `le` edges in the exported unit (seconds, bytes, plain numbers):
# fixed (a bucket series never comes or goes) and few: each edge is a series
# per histogram and process, and a fleet pays for every one.
EDGES: dict[Unit, tuple[float, ...]] = {
    Unit.TIME_NS: _decades(-5, 3, (1, 2, 5)),              # 10 us .. 1000 s: 25 edges
    Unit.BYTES: tuple(float(4**i) for i in range(21)),     # 1 B .. 1 TiB: 21 edges
    Unit.NUMBER: _decades(-2, 6, (1, 2, 5)),               # 0.01 .. 1e6: 25 edges
}
# Recorded unit -> exported unit.
SCALE = {Unit.TIME_NS: 1e-9, Unit.BYTES: 1.0, Unit.NUMBER: 1.0}
_SUFFIX = {Unit.TIME_NS: "seconds", Unit.BYTES: "bytes", Unit.NUMBER: ""}

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def snake_name(name: str) -> str:
    """``"TransferToDeviceTime"`` -> ``"transfer_to_device_time"`` (valid in Prometheus)."""
    s = _INVALID.sub("_", _CAMEL.sub("_", name)).lower()
    s = re.sub(r"_+", "_", s).strip("_")
    return s if s and not s[0].isdigit() else f"_{s}"


def metric_name(name: str, unit: Unit) -> str:
    """The exported base name (without ``_total``/``_bucket``) of a recorded name."""
    base = PREFIX + snake_name(name)
    suffix = _SUFFIX[unit]
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base


@functools.lru_cache(maxsize=64)
def _edge_keys(gamma: float, edges: tuple[float, ...], scale: float) -> tuple[int, ...]:
    """Each edge's fine-bucket key, computed as the registry keys a sample."""
    inv_log_gamma = 1.0 / math.log(gamma)
    keys = []
    for edge in edges:
        recorded = edge / scale
        nearest = round(recorded)
        if nearest and abs(recorded - nearest) <= 1e-9 * recorded:
            recorded = float(nearest)  # 1e-6 s -> exactly 1000 ns
        keys.append(math.ceil(math.log(recorded) * inv_log_gamma))
    return tuple(keys)


def cumulative_buckets(
    reading: DistributionReading, edges: Sequence[float], scale: float = 1.0
) -> list[int]:
    """Cumulative sample counts at or below each edge (``le``), from the log buckets.

    A fine bucket is counted under an edge when its key is at most the key
    the edge itself would get, so every sample <= edge is counted, samples
    exactly on an edge are placed exactly, and at most one fine bucket above
    the edge is counted with it. Cost: one sort of the bucket keys.

    Args:
        reading: the distribution (its ``buckets`` in the recorded unit).
        edges: ascending positive edges in the exported unit.
        scale: recorded unit -> exported unit (``1e-9`` for ns -> s).
    """
    count = reading.count
    out = [0] * len(edges)
    b = reading.buckets
    if b is not None:
        below_all = b.zero + sum(b.negative.values())
        keys = sorted(b.positive)
        prefix = list(itertools.accumulate(map(b.positive.__getitem__, keys)))
        for i, edge_key in enumerate(_edge_keys(b.gamma, tuple(edges), scale)):
            j = bisect.bisect_right(keys, edge_key)
            out[i] = below_all + (prefix[j - 1] if j else 0)
    lo = reading.min * scale if reading.min is not None else None
    hi = reading.max * scale if reading.max is not None else None
    for i, edge in enumerate(edges):
        if hi is not None and edge >= hi:
            out[i] = count
        elif lo is not None and edge < lo:
            out[i] = 0
        out[i] = min(out[i], count)
    return out


def _fmt_edge(edge: float) -> str:
    return repr(float(edge))


class SeriesState:
    """What :func:`families` keeps between scrapes of one process: create one
    per process and pass it to every call for that process.

    It also makes :func:`families` follow the reuse rule
    (:mod:`tpu_info.contract.reuse`) one level up: a histogram is built only
    for a distribution record that is not the very object of the last call
    (the cursor's follower and the hook's registry hand out unchanged
    records again), and a family equal to the one of its name handed out
    last time is that same object again. So a consumer (the host exporter's
    encoding) may keep what it derives from a family by identity. Only the
    last call's families are kept: memory follows the process's data.

    Args:
        top_graphs: how many graphs get their own ``graph`` label.
    """

    def __init__(self, top_graphs: int = TOP_GRAPHS) -> None:
        self.top_graphs = top_graphs
        self.graphs = GraphSeries(top_graphs)
        self.errors = 0  # rules that failed while building families
        self._lock = threading.Lock()
        # Both valid for the constant labels they were built with, only.
        self._histograms: tuple[tuple[str, ...], tuple[tuple[DistributionReading, ...],
                                                       list[HistogramMetricFamily]]] | None = None
        self._last: tuple[tuple[str, ...], dict[str, Metric]] | None = None

    def histograms(self, f: _Families,
                   records: tuple[DistributionReading, ...]) -> list[HistogramMetricFamily]:
        """One histogram per record, built anew only for records that are
        not the objects of the last call."""
        key = f.key
        held = self._histograms
        last = held[1] if held is not None and held[0] == key else None
        round_ = reuse.each(records, lambda d: _histogram(f, d), last)
        self._histograms = (key, round_)
        return round_[1]

    def same(self, f: _Families, built: Iterator[Metric]) -> Iterator[Metric]:
        """``built``, each family replaced by the one of its name handed out
        last time where the two are equal (an identity test first)."""
        held = self._last
        last = held[1] if held is not None and held[0] == f.key else {}
        now: dict[str, Metric] = {}
        for fam in built:
            prev = last.get(fam.name)
            if prev is not None and (prev is fam or prev == fam):
                fam = prev
            now[fam.name] = fam
            yield fam
        self._last = (f.key, now)

    def failed(self) -> int:
        """Counts one failure; returns how many so far."""
        with self._lock:
            self.errors += 1
            return self.errors


class _Families:
    """Family constructors that add the constant labels to every series."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.names = list(labels)
        self.values = [str(v) for v in labels.values()]
        self.key = (*self.names, "", *self.values)  # what reused families were built with

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=self.names + list(labels))

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=self.names + list(labels))

    def add(self, family: Metric, values: Sequence[str], value: float) -> None:
        family.add_metric(self.values + list(values), value)  # type: ignore[attr-defined]

    def one(self, family: CounterMetricFamily | GaugeMetricFamily, value: float) -> Metric:
        family.add_metric(self.values, value)
        return family

    def histogram(self, name: str, doc: str, buckets: list[tuple[str, float]],
                  sum_value: float) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=self.names)
        fam.add_metric(self.values, buckets, sum_value)
        return fam

    def info(self, name: str, doc: str, info: Mapping[str, str]) -> InfoMetricFamily:
        own = {k: v for k, v in info.items() if k not in self.names}
        fam = InfoMetricFamily(name, doc, labels=self.names)
        fam.add_metric(self.values, own)
        return fam


def families(snapshot: Snapshot, labels: Mapping[str, str] | None = None, *,
             state: SeriesState | None = None) -> Iterator[Metric]:
    """Every Prometheus family of one process's snapshot.

    Args:
        snapshot: the process's snapshot.
        labels: constant labels added to every series (``host``,
            ``program``, ``rank``, ...: what stays the same when the process
            restarts; never the ``pid``); where a family has a label of the
            same name (the process info's ``host``, ``program``), the
            constant one wins.
        state: this process's :class:`SeriesState` (one per process, kept
            between scrapes); default a fresh one. With a state, a family
            that did not change is the object handed out last time: read
            the families, never change them.
    """
    st = state if state is not None else SeriesState()
    f = _Families(labels or {})
    yield from st.same(f, _all(f, snapshot, st))


def _all(f: _Families, snapshot: Snapshot, st: SeriesState) -> Iterator[Metric]:
    seen: set[str] = set()
    dropped: dict[str, int] = {}
    yield from _counters(f, snapshot, seen, dropped)
    yield from _distributions(f, snapshot, st, seen, dropped)
    left = f.gauge(PREFIX + "names_dropped", "The process's metrics left out of this "
                   "exposition, by reason: a name promtool would refuse (unit_abbreviation, "
                   "prefixed_unit, type_in_name, total_suffix, invalid), one of ours "
                   "(reserved) or a second of one name (duplicate).", ["reason"])
    for reason in sorted(dropped):
        f.add(left, [reason], dropped[reason])
    yield left
    yield from _graphs(f, snapshot, st)
    yield from _devices(f, snapshot)
    yield from _process(f, snapshot)
    yield from _findings(f, snapshot, st)


def _split_op(name: str) -> tuple[str, str] | None:
    """``"lazy::add"`` -> ``("lazy", "add")``; None for a name without a namespace."""
    ns, sep, op = name.partition("::")
    return (ns, op) if sep and ns and op else None


def _exported(name: str, unit: Unit, counter: bool, seen: set[str],
              dropped: dict[str, int]) -> str | None:
    """The family name of a recorded metric, or None (counted in ``dropped``)
    when it is one of ours, a second of its name, or one promtool refuses."""
    base = metric_name(name, unit)
    reason = RESERVED_NAME if base in names.RESERVED else DUPLICATE if base in seen else None
    found = None if reason else names.lint(base + ("_total" if counter else ""), counter)
    reason = reason or (found[0] if found else None)
    if reason is None:
        seen.add(base)
        return base
    dropped[reason] = dropped.get(reason, 0) + 1
    return None


def _counters(f: _Families, snap: Snapshot, seen: set[str],
              dropped: dict[str, int]) -> Iterator[Metric]:
    ops = f.counter(PREFIX + "ops", "Ops the engine counted, by op namespace (torch._lazy's "
                    "lazy::, torch_xla's xla::; aten::: ops that fell back to the CPU).",
                    ["op_namespace", "op"])
    seen.add(ops.name)
    for c in snap.counters:
        split = _split_op(c.name)
        if split is not None:
            f.add(ops, split, c.value)
            continue
        name = _exported(c.name, c.unit, True, seen, dropped)
        if name is not None:
            yield f.one(f.counter(name, clean(c.help or c.name, 1000)),
                        c.value * SCALE[c.unit])
    yield ops
    engines = snap.process.engine if snap.process is not None else ""
    for cname, (kind, unit, doc) in catalog.CATALOG.items():
        name = metric_name(cname, unit)
        if (kind == "counter" and name not in seen  # present at zero until it counts
                and catalog.for_engines(cname, engines)):
            seen.add(name)
            yield f.one(f.counter(name, doc), 0.0)
    yield f.one(f.counter(PREFIX + "events", "Events recorded (the last sequence number)."),
                snap.last_seq)


def _histogram(f: _Families, d: DistributionReading) -> HistogramMetricFamily:
    edges = EDGES[d.unit]
    scale = SCALE[d.unit]
    cum = cumulative_buckets(d, edges, scale)
    buckets = [(_fmt_edge(e), float(n)) for e, n in zip(edges, cum, strict=True)]
    buckets.append(("+Inf", float(d.count)))
    return f.histogram(metric_name(d.name, d.unit), clean(d.help or d.name, 1000), buckets,
                       d.total * scale)


def _distributions(f: _Families, snap: Snapshot, st: SeriesState,
                   seen: set[str], dropped: dict[str, int]) -> Iterator[Metric]:
    # A histogram comes with its first sample (an empty one is 28 series of
    # zeros); a mirror of a catalog record (catalog.MIRRORS) is left out; a
    # one-off figure (catalog.ONE_OFF) is one gauge of its total instead.
    counted = {d.name for d in snap.distributions if d.count}
    records = tuple(d for d in snap.distributions if d.count and d.name not in catalog.ONE_OFF
                    and catalog.MIRRORS.get(d.name) not in counted)
    for d in snap.distributions:
        if d.count and d.name in catalog.ONE_OFF:
            yield f.one(f.gauge(catalog.ONE_OFF[d.name], clean(d.help or d.name, 1000)),
                        d.total * SCALE[d.unit])
    for d, fam in zip(records, st.histograms(f, records), strict=True):
        if _exported(d.name, d.unit, False, seen, dropped) is not None:
            yield fam


def _graphs(f: _Families, snap: Snapshot, st: SeriesState) -> Iterator[Metric]:
    labels = ["graph", "name", "engine", "computation"]
    which = (f"the first {st.top_graphs} graphs compiled, then graph=\"other\" for the rest; "
             "tpu_info.outputs.graph_series")
    g_compiles = f.counter(PREFIX + "graph_compiles", f"Compiles of each graph ({which}).",
                           labels)
    g_seconds = f.counter(PREFIX + "graph_compile_seconds",
                          f"Total compile time of each graph ({which}).", labels)
    g_hits = f.counter(PREFIX + "graph_cache_hits",
                       f"Compile-cache hits of each graph ({which}).", labels)
    g_exec = f.counter(PREFIX + "graph_executions", f"Counted executions of each graph "
                       f"({which}; only graphs whose calls are counted).", labels)
    for row in st.graphs.rows(snap.graphs):
        f.add(g_compiles, row.labels, row.compiles)
        f.add(g_seconds, row.labels, row.compile_seconds)
        f.add(g_hits, row.labels, row.cache_hits)
        if row.executions is not None:
            f.add(g_exec, row.labels, row.executions)
    yield from (g_compiles, g_seconds, g_hits, g_exec)
    yield f.one(f.gauge(PREFIX + "graphs", "Distinct graphs in the ledger."), len(snap.graphs))


def _devices(f: _Families, snap: Snapshot) -> Iterator[Metric]:
    labels = ["device", "kind", "platform", "source"]
    fams = {
        "used": f.gauge(PREFIX + "device_memory_used_bytes", "Device memory in use.", labels),
        "peak": f.gauge(PREFIX + "device_memory_peak_bytes", "Peak device memory in use.",
                        labels),
        "limit": f.gauge(PREFIX + "device_memory_limit_bytes",
                         "Device memory the program may use.", labels),
    }
    busy = f.gauge(PREFIX + "device_busy_ratio",
                   "Estimated fraction of time the device was busy.",
                   ["device", "kind", "platform"])
    for dev in snap.devices:
        m = dev.memory
        values = [str(dev.id), dev.kind, dev.platform, m.source]
        for key, v in (("used", m.used_bytes), ("peak", m.peak_bytes),
                       ("limit", m.limit_bytes)):
            if v is not None:
                f.add(fams[key], values, v)
        if dev.busy_percent is not None:
            f.add(busy, values[:3], dev.busy_percent / 100.0)
    yield from fams.values()
    yield busy


def _process(f: _Families, snap: Snapshot) -> Iterator[Metric]:
    p = snap.process
    if p is None:
        return
    info = {"pid": str(p.pid), "name": p.name, "program": program_name(p.argv),
            "host": p.host, "user": p.user, "engine": p.engine}
    rank = job_rank(p)
    if rank:
        info["rank"] = rank
    info.update(_version_labels(p.versions))
    yield f.info(PREFIX + "process", "The hooked process.", info)
    yield f.one(f.gauge(PREFIX + "process_start_time_seconds",
                        "Start time of the hook, Unix seconds."), p.start_time_unix)
    yield f.one(f.gauge(PREFIX + "uptime_seconds", "Seconds since the hook started."),
                snap.uptime_seconds)


def _findings(f: _Families, snap: Snapshot, st: SeriesState) -> Iterator[Metric]:
    """One gauge per finding kind, computed now from the snapshot (the same
    rules as the CLI): how many, the seconds they cost, their share of step time."""
    from tpu_info.views.findings import find  # scrape time only: importing stays cheap

    count = f.gauge(PREFIX + "findings", "Findings of each kind "
                    "(tpu-info's rules over this snapshot).", ["kind"])
    lost = f.gauge(PREFIX + "finding_seconds_lost", "Seconds the findings of "
                   "each kind cost (measured or estimated).", ["kind"])
    share = f.gauge(PREFIX + "finding_share_of_step_ratio", "Share of step time "
                    "the findings of each kind cost (only kinds whose steps are "
                    "known).", ["kind"])
    by_kind: dict[str, list[float]] = {}
    shares: dict[str, float] = {}
    try:
        found = find(snap)
    except Exception as e:  # noqa: BLE001 - a failing rule is a metric, not a 500
        st.failed()
        log.warning("tpu-info: findings for Prometheus failed: %r", e)
        found = []
    for finding in found:
        kind = finding.kind or "other"
        n_lost = by_kind.setdefault(kind, [0.0, 0.0])
        n_lost[0] += 1
        n_lost[1] += finding.seconds_lost
        if finding.share_of_step is not None:
            shares[kind] = min(1.0, shares.get(kind, 0.0) + finding.share_of_step)
    for kind in sorted(by_kind):
        f.add(count, [kind], by_kind[kind][0])
        f.add(lost, [kind], by_kind[kind][1])
        if kind in shares:
            f.add(share, [kind], shares[kind])
    yield from (count, lost, share)


def _version_labels(versions: Mapping[str, str]) -> dict[str, str]:
    out = {f"{snake_name(k)}_version": str(v) for k, v in sorted(versions.items())}
    return {k: v for k, v in out.items() if not k.startswith("__")}  # "__": Prometheus
