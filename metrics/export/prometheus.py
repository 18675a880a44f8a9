"""Prometheus ``/metrics`` endpoint: a collector that reads a snapshot when scraped.

:class:`SnapshotCollector` calls an injected ``snapshot_fn() -> Snapshot`` in
``collect()``, on the HTTP server's thread, so the program's hot path never
formats anything. The families, their names and the histogram edges are
:mod:`tpu_info.outputs.prometheus`'s (the host exporter builds the same ones);
this module adds the server, the body cache, the scrape-error counter and
prometheus_client's default ``process_*``, ``python_info`` and
``python_gc_*`` collectors (:func:`make_registry`).

Example:
    >>> import metrics
    >>> from metrics.export import prometheus
    >>> server = prometheus.start_http(metrics.snapshot, port=9400)  # doctest: +SKIP
    >>> server.url                                                   # doctest: +SKIP
    'http://127.0.0.1:9400/metrics'
    >>> server.stop()                                                # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from metrics import config
from metrics.recording import forksafe, whoami
from tpu_info.contract.model import Snapshot
from tpu_info.net import webconfig
from tpu_info.net.bounded_http import BoundedHttpServer, landing_page
from tpu_info.net.targets import is_loopback_host
from tpu_info.outputs.prometheus import (  # noqa: F401 - re-exported: the names are ours too
    EDGES,
    PREFIX,
    TOP_GRAPHS,
    SeriesState,
    cumulative_buckets,
    families,
    metric_name,
    snake_name,
)

log = logging.getLogger("metrics.export.prometheus")

ENV_PORT = config.PROMETHEUS_PORT.name
ENV_BIND = config.PROMETHEUS_BIND.name  # its own: TPU_INFO_BIND is the gRPC server's
ENV_WEB_CONFIG = config.PROMETHEUS_WEB_CONFIG.name
DEFAULT_BIND = "127.0.0.1"
BODY_TTL_S = 1.0  # scrapes within this long of each other share one exposition


class SnapshotCollector:
    """A prometheus_client collector over ``snapshot_fn()``, read at scrape time.

    Args:
        snapshot_fn: returns the current :class:`tpu_info.contract.model.Snapshot`.
        top_graphs: how many graphs get their own labels.
    """

    def __init__(self, snapshot_fn: Callable[[], Snapshot], top_graphs: int = TOP_GRAPHS) -> None:
        self._snapshot_fn = snapshot_fn
        self._state = SeriesState(top_graphs)

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: registering never calls snapshot_fn.
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot_fn()
        except Exception as e:  # noqa: BLE001 - a failing snapshot is a metric, not a 500
            if self._state.failed() == 1:
                log.warning("tpu-info: snapshot for Prometheus failed: %r", e)
            snap = None
        if snap is not None:
            # Built first: a rule failing now is counted in this scrape.
            built = list(families(snap, state=self._state))
        else:
            built = []
        yield CounterMetricFamily(PREFIX + "scrape_errors", "Snapshots that failed "
                                  "while Prometheus scraped.", value=self._state.errors)
        yield from built


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
                 registry: CollectorRegistry, scheme: str = "http") -> None:
        self._httpd = httpd
        self.bind = bind
        self.scheme = scheme
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
        return f"{self.scheme}://{host}:{self.port}/metrics"

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


def make_registry(snapshot_fn: Callable[[], Snapshot],
                  top_graphs: int = TOP_GRAPHS) -> CollectorRegistry:
    """A fresh registry with our collector and prometheus_client's default
    ones (``process_*``: CPU, memory, fds, start time; ``python_info``;
    ``python_gc_*``), which every Prometheus dashboard expects of a process."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(SnapshotCollector(snapshot_fn, top_graphs))
    return registry


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
    web_config: str | os.PathLike[str] | None = None,
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
        web_config: a web configuration file (TLS, basic auth:
            :mod:`tpu_info.net.webconfig`); default
            ``$TPU_INFO_PROMETHEUS_WEB_CONFIG``, else plain HTTP.

    Raises:
        OSError: the port cannot be bound.
        ValueError: ``$TPU_INFO_PROMETHEUS_PORT`` is not a port number.
        tpu_info.net.webconfig.WebConfigError: the web configuration file
            cannot be used (one line; nothing is served).
    """
    env = os.environ if environ is None else environ
    addr = bind or config.text(config.PROMETHEUS_BIND, env) or DEFAULT_BIND
    web_path = web_config or config.text(config.PROMETHEUS_WEB_CONFIG, env)
    web = webconfig.load(web_path) if web_path else None
    if not is_loopback_host(addr) and not (web and web.guarded):
        log.warning("tpu-info: Prometheus endpoint listens on %s (not loopback): anyone "
                    "who can reach this host can read this program's metrics", addr)
    registry = make_registry(snapshot_fn, top_graphs)
    program = whoami.program()
    live = webconfig.LiveWebConfig(web) if web else None  # read again when changed
    httpd = BoundedHttpServer(
        CachedExposition(registry), addr, resolve_port(port, env),
        tls=live if web and web.tls else None, authorize=live,
        landing=landing_page("tpu-info", (f"Metrics of {program} (pid {os.getpid()}).",)))
    httpd.start()
    return PrometheusServer(httpd, addr, registry, web.scheme if web else "http")
