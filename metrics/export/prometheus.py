"""Prometheus ``/metrics`` endpoint: a collector that reads a snapshot when scraped.

:class:`SnapshotCollector` calls an injected ``snapshot_fn() -> Snapshot`` in
``collect()``, on the HTTP server's thread, so the program's hot path never
formats anything. Names are ``tpu_info_`` + snake_case + unit suffix:
``CompileTime`` (ns) -> ``tpu_info_compile_time_seconds``, ``OutboundData``
-> ``tpu_info_outbound_data_bytes``, the counter ``UncachedCompile`` ->
``tpu_info_uncached_compile_total``.

Distributions are exported as **histograms**, not summaries. A summary's
quantiles cannot be combined across processes or hosts (the mean of p99s is
not a p99), while histogram buckets add up, which is what a fleet needs
(``histogram_quantile(0.99, sum by (le) (rate(..._bucket[5m])))``) and what
our own log-spaced buckets were chosen for. Our fine buckets (0.5 % relative
error, up to thousands of them) are coarsened to a fixed, bounded set of
``le`` edges per unit (:data:`EDGES`): 1-2.5-5 per decade from 1 us to
1000 s for times, powers of 4 from 1 B to 1 TiB for bytes, powers of 10 for
plain numbers. A fine bucket ``(g**(k-1), g**k]`` is counted under the first
edge above its lower bound, so a sample exactly on an edge (4096 bytes)
lands in that edge's bucket, every sample <= an edge is counted under it, and
only samples within one fine bucket (about 1 %) above an edge can be counted
with it; the exact min and max clamp the ends.

Other families: per-graph counters for the top :data:`TOP_GRAPHS` graphs by
compile time (labels ``graph`` = short hash, ``name``, ``engine``: bounded),
device memory gauges per device with a ``source`` label, the busy ratio,
``tpu_info_process_info`` and the process start time, and per finding kind
(``kind`` label: ``per_step_sync``, ``recompile_short_last_batch``, ...)
``tpu_info_findings``, ``tpu_info_finding_seconds_lost`` and
``tpu_info_finding_share_of_step_ratio``, from the same rules as the CLI,
computed when scraped.

Example:
    >>> import metrics
    >>> from metrics.export import prometheus
    >>> server = prometheus.start_http(metrics.snapshot, port=9400)  # doctest: +SKIP
    >>> server.url                                                   # doctest: +SKIP
    'http://127.0.0.1:9400/metrics'
    >>> server.stop()                                                # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import functools
import gzip
import itertools
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from metrics.export import config
from metrics.recording import forksafe
from tpu_info.contract.model import DistributionReading, Snapshot, Unit
from tpu_info.net.bounded_http import BoundedHttpServer
from tpu_info.net.targets import is_loopback_host

log = logging.getLogger("metrics.export.prometheus")

PREFIX = "tpu_info_"
TOP_GRAPHS = 20
ENV_PORT = config.PROMETHEUS_PORT.name
ENV_BIND = config.PROMETHEUS_BIND.name  # its own: TPU_INFO_BIND is the gRPC server's
DEFAULT_BIND = "127.0.0.1"
BODY_TTL_S = 1.0  # scrapes within this long of each other share one exposition


def _decades(lo_exp: int, hi_exp: int, steps: Sequence[float]) -> tuple[float, ...]:
    out = [float(f"{m}e{e}") for e in range(lo_exp, hi_exp) for m in steps]
    return tuple(out) + (float(f"1e{hi_exp}"),)


# Histogram `le` edges in the exported unit (seconds, bytes, plain numbers).
EDGES: dict[Unit, tuple[float, ...]] = {
    Unit.TIME_NS: _decades(-6, 3, (1, 2.5, 5)),           # 1 us .. 1000 s: 28 edges
    Unit.BYTES: tuple(float(4**i) for i in range(21)),    # 1 B .. 1 TiB: 21 edges
    Unit.NUMBER: _decades(-3, 9, (1,)),                    # 0.001 .. 1e9: 13 edges
}
# Recorded unit -> exported unit.
_SCALE = {Unit.TIME_NS: 1e-9, Unit.BYTES: 1.0, Unit.NUMBER: 1.0}
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


class SnapshotCollector:
    """A prometheus_client collector over ``snapshot_fn()``, read at scrape time.

    Args:
        snapshot_fn: returns the current :class:`tpu_info.contract.model.Snapshot`.
        top_graphs: how many graphs (by total compile time) get their own labels.
    """

    def __init__(self, snapshot_fn: Callable[[], Snapshot], top_graphs: int = TOP_GRAPHS) -> None:
        self._snapshot_fn = snapshot_fn
        self._top_graphs = top_graphs
        self._errors = 0
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: registering never calls snapshot_fn.
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot_fn()
        except Exception as e:  # noqa: BLE001 - a failing snapshot is a metric, not a 500
            with self._lock:
                self._errors += 1
                first = self._errors == 1
            if first:
                log.warning("tpu-info: snapshot for Prometheus failed: %r", e)
            snap = None
        yield CounterMetricFamily(PREFIX + "scrape_errors", "Snapshots that failed "
                                  "while Prometheus scraped.", value=self._errors)
        if snap is None:
            return
        seen: set[str] = set()
        yield from self._counters(snap, seen)
        yield from self._distributions(snap, seen)
        yield from self._graphs(snap)
        yield from self._devices(snap)
        yield from self._process(snap)
        yield from self._findings(snap)

    def _counters(self, snap: Snapshot, seen: set[str]) -> Iterator[Metric]:
        for c in snap.counters:
            name = metric_name(c.name, c.unit)
            if name in seen:
                continue
            seen.add(name)
            value = c.value * _SCALE[c.unit]
            yield CounterMetricFamily(name, c.help or c.name, value=value)
        yield CounterMetricFamily(PREFIX + "events", "Events recorded (the last sequence "
                                  "number).", value=snap.last_seq)

    def _distributions(self, snap: Snapshot, seen: set[str]) -> Iterator[Metric]:
        for d in snap.distributions:
            name = metric_name(d.name, d.unit)
            if name in seen:
                continue
            seen.add(name)
            edges = EDGES[d.unit]
            scale = _SCALE[d.unit]
            cum = cumulative_buckets(d, edges, scale)
            buckets = [(_fmt_edge(e), float(n)) for e, n in zip(edges, cum, strict=True)]
            buckets.append(("+Inf", float(d.count)))
            yield HistogramMetricFamily(name, d.help or d.name, buckets=buckets,
                                        sum_value=d.total * scale)

    def _graphs(self, snap: Snapshot) -> Iterator[Metric]:
        labels = ["graph", "name", "engine"]
        g_compiles = CounterMetricFamily(
            PREFIX + "graph_compiles", f"Compiles of each graph (top {self._top_graphs} "
            "graphs by compile time).", labels=labels)
        g_seconds = CounterMetricFamily(
            PREFIX + "graph_compile_seconds", "Total compile time of each graph "
            f"(top {self._top_graphs}).", labels=labels)
        g_hits = CounterMetricFamily(
            PREFIX + "graph_cache_hits", f"Compile-cache hits of each graph "
            f"(top {self._top_graphs}).", labels=labels)
        g_exec = CounterMetricFamily(
            PREFIX + "graph_executions", "Counted executions of each graph "
            f"(top {self._top_graphs}; only graphs whose calls are tracked).", labels=labels)
        top = sorted(snap.graphs, key=lambda g: (-g.compile_seconds_total, -g.compiles, g.hash))
        for g in top[: self._top_graphs]:
            values = [g.short_hash, g.name, g.engine]
            g_compiles.add_metric(values, g.compiles)
            g_seconds.add_metric(values, g.compile_seconds_total)
            g_hits.add_metric(values, g.cache_hits)
            if g.executions is not None:
                g_exec.add_metric(values, g.executions)
        yield g_compiles
        yield g_seconds
        yield g_hits
        yield g_exec
        yield GaugeMetricFamily(PREFIX + "graphs", "Distinct graphs in the ledger.",
                                value=len(snap.graphs))

    def _devices(self, snap: Snapshot) -> Iterator[Metric]:
        labels = ["device", "kind", "platform", "source"]
        fams = {
            "used": GaugeMetricFamily(PREFIX + "device_memory_used_bytes",
                                      "Device memory in use.", labels=labels),
            "peak": GaugeMetricFamily(PREFIX + "device_memory_peak_bytes",
                                      "Peak device memory in use.", labels=labels),
            "limit": GaugeMetricFamily(PREFIX + "device_memory_limit_bytes",
                                       "Device memory the program may use.", labels=labels),
        }
        busy = GaugeMetricFamily(PREFIX + "device_busy_ratio",
                                 "Estimated fraction of time the device was busy.",
                                 labels=["device", "kind", "platform"])
        for dev in snap.devices:
            m = dev.memory
            values = [str(dev.id), dev.kind, dev.platform, m.source]
            for key, v in (("used", m.used_bytes), ("peak", m.peak_bytes),
                           ("limit", m.limit_bytes)):
                if v is not None:
                    fams[key].add_metric(values, v)
            if dev.busy_percent is not None:
                busy.add_metric(values[:3], dev.busy_percent / 100.0)
        yield from fams.values()
        yield busy

    def _process(self, snap: Snapshot) -> Iterator[Metric]:
        p = snap.process
        if p is None:
            return
        info = {"pid": str(p.pid), "name": p.name, "host": p.host, "user": p.user,
                "engine": p.engine}
        info.update(_version_labels(p.versions))
        yield InfoMetricFamily(PREFIX + "process", "The hooked process.", value=info)
        yield GaugeMetricFamily(PREFIX + "process_start_time_seconds",
                                "Start time of the hook, Unix seconds.", value=p.start_time_unix)
        yield GaugeMetricFamily(PREFIX + "uptime_seconds", "Seconds since the hook started.",
                                value=snap.uptime_seconds)


    def _findings(self, snap: Snapshot) -> Iterator[Metric]:
        """One gauge per finding kind, computed now from the snapshot (the same
        rules as the CLI): how many, the seconds they cost, their share of step time."""
        from tpu_info.views.findings import find  # scrape time only: import metrics stays cheap

        count = GaugeMetricFamily(PREFIX + "findings", "Findings of each kind "
                                  "(tpu-info's rules over this snapshot).", labels=["kind"])
        lost = GaugeMetricFamily(PREFIX + "finding_seconds_lost", "Seconds the findings of "
                                 "each kind cost (measured or estimated).", labels=["kind"])
        share = GaugeMetricFamily(PREFIX + "finding_share_of_step_ratio", "Share of step time "
                                  "the findings of each kind cost (only kinds whose steps are "
                                  "known).", labels=["kind"])
        by_kind: dict[str, list[float]] = {}
        shares: dict[str, float] = {}
        try:
            found = find(snap)
        except Exception as e:  # noqa: BLE001 - a failing rule is a metric, not a 500
            with self._lock:
                self._errors += 1
            log.warning("tpu-info: findings for Prometheus failed: %r", e)
            found = []
        for f in found:
            kind = f.kind or "other"
            n_lost = by_kind.setdefault(kind, [0.0, 0.0])
            n_lost[0] += 1
            n_lost[1] += f.seconds_lost
            if f.share_of_step is not None:
                shares[kind] = min(1.0, shares.get(kind, 0.0) + f.share_of_step)
        for kind in sorted(by_kind):
            count.add_metric([kind], by_kind[kind][0])
            lost.add_metric([kind], by_kind[kind][1])
            if kind in shares:
                share.add_metric([kind], shares[kind])
        yield count
        yield lost
        yield share


def _version_labels(versions: Mapping[str, str]) -> dict[str, str]:
    return {f"{snake_name(k)}_version": str(v) for k, v in sorted(versions.items())}


class CachedExposition:
    """prometheus_client's exposition of ``registry``, rebuilt at most every
    :data:`BODY_TTL_S` per format (text or OpenMetrics, gzipped or not):
    however often it is scraped, the program builds one snapshot a second."""

    def __init__(self, registry: CollectorRegistry, ttl_s: float = BODY_TTL_S) -> None:
        self._registry = registry
        self._ttl = ttl_s
        self._bodies: dict[tuple[str, bool], tuple[float, bytes]] = {}
        self._lock = threading.Lock()

    def __call__(self, accept: str, accept_encoding: str) -> tuple[bytes, str, str]:
        encoder, content_type = choose_encoder(accept)
        zipped = "gzip" in accept_encoding
        key = (content_type, zipped)
        now = time.monotonic()
        with self._lock:
            hit = self._bodies.get(key)
            if hit is None or hit[0] <= now:
                body = encoder(self._registry)
                if zipped:
                    body = gzip.compress(body, compresslevel=1)
                self._bodies = {k: v for k, v in self._bodies.items() if v[0] > now}
                hit = self._bodies[key] = (now + self._ttl, body)
        return hit[1], content_type, "gzip" if zipped else ""


class PrometheusServer:
    """A running ``/metrics`` endpoint (a :class:`~tpu_info.net.bounded_http.
    BoundedHttpServer`); :meth:`stop` shuts it down."""

    def __init__(self, httpd: BoundedHttpServer, bind: str,
                 registry: CollectorRegistry) -> None:
        self._httpd = httpd
        self.bind = bind
        self.registry = registry
        self.port: int = httpd.server_address[1]
        self.sockname = httpd.server_address
        self._stopped = False
        self._owner = forksafe.owned(self)

    def let_go_after_fork(self) -> None:
        """In a fork child: closes its copies of the endpoint's sockets (only
        the parent serves; the port is freed when the parent exits)."""
        if not self._stopped:  # a stopped one's port may be someone else's now
            self._stopped = True
            # The server knows every socket it holds: no need to scan /proc/self/fd.
            self._httpd.close_in_fork_child()

    @property
    def url(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        """Stops serving and closes the socket (idempotent). In a forked child
        it does nothing: the serving thread is the parent's (waiting for it
        would hang)."""
        if self._stopped or os.getpid() != self._owner:
            return
        self._stopped = True
        self._httpd.stop(timeout)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()




def resolve_port(port: int | None, environ: Mapping[str, str] | None = None) -> int:
    """``port``, else ``$TPU_INFO_PROMETHEUS_PORT``, else 0 (ephemeral).

    Raises:
        ValueError: the environment variable is not a port number.
    """
    if port is not None:
        return int(port)
    value = config.port(config.PROMETHEUS_PORT, environ)
    return 0 if value is None else value


def start_http(
    snapshot_fn: Callable[[], Snapshot],
    port: int | None = None,
    bind: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    top_graphs: int = TOP_GRAPHS,
) -> PrometheusServer:
    """Serves ``/metrics`` from a fresh registry on one daemon thread, with
    bounded connections, timeouts and rate (:mod:`tpu_info.net.bounded_http`)
    and the body cached for :data:`BODY_TTL_S`.

    Args:
        snapshot_fn: called at each scrape.
        port: the port; default ``$TPU_INFO_PROMETHEUS_PORT``, else ephemeral.
        bind: the address; default ``$TPU_INFO_PROMETHEUS_BIND``, else
            ``127.0.0.1`` (prometheus_client's own default is every interface;
            ours is not). ``$TPU_INFO_BIND`` (the gRPC server's) does not open it.
        environ: the environment to read (default ``os.environ``).
        top_graphs: graphs that get their own labels.

    Raises:
        OSError: the port cannot be bound.
        ValueError: ``$TPU_INFO_PROMETHEUS_PORT`` is not a port number.
    """
    env = os.environ if environ is None else environ
    addr = bind or config.text(config.PROMETHEUS_BIND, env) or DEFAULT_BIND
    if not is_loopback_host(addr):
        log.warning("tpu-info: Prometheus endpoint listens on %s (not loopback): anyone "
                    "who can reach this host can read this program's metrics", addr)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot_fn, top_graphs))
    httpd = BoundedHttpServer(CachedExposition(registry), addr, resolve_port(port, env))
    httpd.start()
    return PrometheusServer(httpd, addr, registry)
