"""``tpu-info exporter``: one Prometheus endpoint per host.

It serves the host's chips (TPU sysfs, NVML, libtpu on ``localhost:8431``
when it is there) and every hooked process of this host's user that it
finds through the discovery records, each process's series labelled by
what outlives its restarts: ``host``, ``program`` (``train.py#2`` for a
second one alike), ``rank`` when a job says and, per device, ``device``; its
``pid`` is on ``tpu_info_process_info`` alone; a process in a Kubernetes
pod adds ``namespace``, ``pod``, ``container`` and ``node``
(:mod:`tpu_info.host.pods`: its cgroup, then the kubelet's pod-resources
API or the API server). A background poll every
``--interval`` seconds scans the host,
re-reads the runtime directory and asks every target at once over gRPC
(:func:`tpu_info.net.fanout.fan_out`: the round ends within ``--timeout``
whatever a target does); a scrape gets the last poll's exposition at once,
so no target can stall the endpoint. A process that exits drops out at the
next poll, a new one appears in it; ``tpu_info_target_up`` says per target
whether it answered. A poll costs in proportion to what changed: a
process's histograms are built again only for distribution records that
changed since the last poll, and only the families that changed are
encoded again (:class:`~tpu_info.outputs.prometheus.SeriesState`,
:class:`~tpu_info.outputs.prometheus_host.PartsEncoding`); the exposition is
byte for byte that of building and encoding everything anew.

Bounds: at most :data:`MAX_TARGETS` targets a poll, and of the targets not
known to answer those whose server greets when looked at (all at once, a
fraction of a second) and at most 64 more less those that hung in the last
20 s, least recently asked first, those that keep failing backed off
(:mod:`tpu_info.commands.exporter_targets`; what was not asked is counted in
``tpu_info_exporter_targets_skipped{reason}``); a poll ends within
``--timeout``; the endpoint is the hook's bounded HTTP server
(:mod:`tpu_info.net.bounded_http`: connections, request size, timeouts
and answers per second capped); each reply at most :data:`MAX_REPLY_BYTES`
(16 MiB, half the CLI's: a poll decodes every target's answer, again and
again), cut as the CLI cuts counts (2,000 graphs, ...), what was cut said by
``tpu_info_target_cut{part}``; what is kept per target is its last decoded
snapshot (bounded as the client's), its series state and one channel, and
memory freed by a poll is handed back to the system (glibc's
``malloc_trim``); per-process families are bounded as the hook's are.

Example:
    >>> ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir="/nonexistent",
    ...                                   libtpu_target=None), scan_chips=LocalScan)
    >>> ex.poll()
    >>> b"tpu_info_exporter_targets" in ex.body("", "")[0]
    True
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from tpu_info.commands.exporter_targets import MAX_TARGETS, TargetChooser, key_of
from tpu_info.commands.gather import LIBTPU_TARGET, local_targets
from tpu_info.contract.discovery_record import DiscoveredProcess
from tpu_info.contract.errors import ReplyTooLarge, TimedOut
from tpu_info.contract.model import LocalScan, Snapshot
from tpu_info.host.listeners import ProcNet
from tpu_info.host.pods import DEFAULT_SOCKET, ApiServer, PodResolver
from tpu_info.net import discovery
from tpu_info.net.bounded_http import BoundedHttpServer, landing_page
from tpu_info.net.client import Client
from tpu_info.net.fanout import FAN_OUT_MARGIN_S, Channels, FanOutResult, fan_out
from tpu_info.net.greet import greeters
from tpu_info.net.webconfig import LiveWebConfig, WebConfig
from tpu_info.outputs import prometheus_host as host_fams
from tpu_info.outputs.identity import ProgramLabels, job_rank, program_name
from tpu_info.outputs.prometheus import SeriesState, families
from tpu_info.wire.delta import Follower

log = logging.getLogger("tpu_info.commands.exporter")

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 2.0
MAX_WORKERS = 64
GREET_S = 0.5  # how long a poll waits for servers not answering lately to greet (of --timeout)
MAX_REPLY_BYTES = 16 * 1024 * 1024  # one target's answer (the hook's at its bounds: a few MiB)
POLL_SLACK_S = 0.1  # of --timeout, kept for what follows the fan-out (merging, encoding)
MAX_FORMATS = 4  # (Accept, gzip) pairs whose bodies are kept and encoded by each poll


@dataclass(frozen=True)
class ExporterOptions:
    """What ``tpu-info exporter``'s flags say.

    Attributes:
        host_label: the ``host`` label on every series (default: the hostname).
        job: the ``job`` label on every series, when set.
        runtime_dir: the discovery directory to read (default: this user's).
        interval_s: seconds between polls.
        timeout_s: seconds a poll gives its targets (all at once).
        libtpu_target: where libtpu may serve, one target or several (None: never ask).
        max_targets: hooked processes asked per poll at most.
        kubernetes: name each process's pod (``namespace``, ``pod``,
            ``container``, ``node`` labels) when it runs in one.
        node_name: this node's name (the ``node`` label; the API server's
            pods are asked by it); default ``$NODE_NAME``.
        kubelet_socket: the kubelet's pod-resources socket (``""``: never ask).
    """

    host_label: str = field(default_factory=socket.gethostname)
    job: str | None = None
    runtime_dir: str | os.PathLike[str] | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    libtpu_target: str | Sequence[str] | None = LIBTPU_TARGET
    max_targets: int = MAX_TARGETS
    kubernetes: bool = True
    node_name: str = field(default_factory=lambda: os.environ.get("NODE_NAME", ""))
    kubelet_socket: str = DEFAULT_SOCKET

    @property
    def labels(self) -> dict[str, str]:
        """The constant labels of every series."""
        return {"host": self.host_label, **({"job": self.job} if self.job else {})}


@dataclass(frozen=True, slots=True)
class _Target:
    address: str
    labels: Mapping[str, str]
    key: tuple[object, ...]  # which process: its SeriesState and last known rank
    process: DiscoveredProcess | None = None  # None: libtpu


class HostExporter:
    """Polls this host's chips and hooked processes and serves the result.

    Args:
        options: the flags.
        scan_chips: the host scan (default :func:`tpu_info.host.devices.scan_local`).
        proc_root: where ``/proc`` is (port owners, for discovery and libtpu;
            processes' cgroups, for their pods).
        pods: what names processes' pods (default: from ``options``, the API
            server of the pod it runs in when there is one).
    """

    def __init__(self, options: ExporterOptions,
                 scan_chips: Callable[[], LocalScan] | None = None,
                 proc_root: str = "/proc", pods: PodResolver | None = None) -> None:
        if scan_chips is None:
            from tpu_info.host.devices import scan_local

            scan_chips = scan_local
        self.options = options
        self._scan_chips = scan_chips
        self._net = ProcNet(proc_root)
        self._rescanner = discovery.Rescanner(options.runtime_dir,
                                              port_owners=self._net.owners_by_port)
        self._states: dict[tuple[object, ...], SeriesState] = {}
        self._ranks: dict[tuple[object, ...], str] = {}
        self._programs = ProgramLabels()  # program labels unique per (program, rank, pod)
        if pods is None and options.kubernetes:
            pods = PodResolver(proc_root, node=options.node_name,
                               kubelet_socket=options.kubelet_socket,
                               api=ApiServer.in_cluster())
        self._pods = pods
        # One cursor per process (tpu_info.wire.delta): a poll asks only for
        # what changed since the last one.
        self._followers: dict[tuple[object, ...], Follower] = {}
        self._channels = Channels(options.max_targets + 1)  # kept open between polls
        # Targets not answering lately are looked at all at once before a poll
        # dials any (a live one is asked whatever hung records there are).
        greet_s = min(GREET_S, options.timeout_s / 4)
        self._greet_s = greet_s
        self._chooser = TargetChooser(options.max_targets,
                                      greet=lambda targets: greeters(targets, greet_s))
        # Each target's last try (seconds it took, parts cut): a target skipped
        # while it does not answer (backed off) keeps its up 0 and these, so
        # the series that say why it is down do not flicker.
        self._took: dict[tuple[object, ...], tuple[float, dict[str, int]]] = {}
        self._down: list[_Target] = []  # this poll's skipped targets whose last try failed
        self._not_asked: Counter[str] = Counter()
        self._said_not_asked = 0.0  # when the log last said so (once a minute at most)
        self._families: list[Metric] = []
        self._bodies: dict[tuple[str, bool], bytes] = {}
        # Per format the poll encodes: each part's lines, kept between polls.
        self._encodings: dict[str, host_fams.PartsEncoding] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._httpd: BoundedHttpServer | None = None
        self._warned: set[str] = set()  # directory problems said once
        self.polls = 0
        self.poll_errors = 0
        self.last_poll_s = 0.0

    # One poll ----------------------------------------------------------------

    def _targets(self, scan: discovery.Scan) -> list[_Target]:
        if self._chooser.any_new(scan.processes):
            self._net.refresh()  # a program started since the table was read: its port too
        processes, self._not_asked = self._chooser.choose(scan.processes,
                                                          self._net.owners_by_port())
        if self._not_asked and time.monotonic() - self._said_not_asked > 60.0:
            self._said_not_asked = time.monotonic()
            log.warning("tpu-info exporter: %d of %d hooked processes not asked this poll "
                        "(%s; answering and greeting first, the rest in turn): see "
                        "tpu_info_exporter_targets_skipped", sum(self._not_asked.values()),
                        len(scan.processes), ", ".join(
                            f"{n} {r}" for r, n in sorted(self._not_asked.items())))
        out = [_Target(p.target, {"program": program_name(p.argv)},
                       (p.pid, p.start_time, p.port), p) for p in processes]
        asked = {key_of(p) for p in processes}
        self._down = [_Target(p.target, {"program": program_name(p.argv)}, key_of(p), p)
                      for p in self._chooser.not_answering(
                          p for p in scan.processes if key_of(p) not in asked)]
        libtpus = local_targets(scan, self._net, libtpu_target=self.options.libtpu_target).libtpus
        for libtpu in libtpus:  # 8431 and $TPU_RUNTIME_METRICS_PORTS
            out.append(_Target(libtpu, {"program": "libtpu"},
                               ("libtpu",) if len(libtpus) == 1 else ("libtpu", libtpu)))
        return out

    def _identities(self, targets: list[_Target], snaps: list[Snapshot | None],
                    alive: set[tuple[object, ...]]) -> list[dict[str, str]]:
        """Each target's labels: what outlives a restart (host, job, program,
        rank when a job says; :mod:`tpu_info.outputs.identity`), never its
        pid or port; two processes that would share them get ``program#2``.
        A live process not asked this poll keeps its rank and label. A
        process in a Kubernetes pod adds its pod's labels."""
        for gone in [k for k in self._ranks if k not in alive]:
            del self._ranks[gone]
        hosts: dict[Hashable, str] = {}
        for t, snap in zip(targets, snaps, strict=True):
            if snap is not None and snap.process is not None:
                self._ranks[t.key] = job_rank(snap.process)
                hosts[t.key] = snap.process.host
        pods = self._pods.labels(hosts) if self._pods is not None else {}
        oldest_first = sorted(targets, key=lambda t: (
            t.process.start_time if t.process is not None else 0.0, t.address))
        programs = self._programs.assign(
            ((t.key, t.labels["program"], self._ranks.get(t.key, ""),
              "/".join(pods.get(t.key, {}).values())) for t in oldest_first), alive)
        return [{k: v for k, v in {**self.options.labels, **pods.get(t.key, {}),
                                   "program": programs[t.key],
                                   "rank": self._ranks.get(t.key, "")}.items() if v}
                for t in targets]

    def poll(self) -> None:
        """One round: host scan, discovery, every target; then swaps in the
        new exposition. Raises nothing a target can cause."""
        started = time.monotonic()
        chips = self._scan_chips()
        scan = self._rescanner.scan()
        targets = self._targets(scan)
        if self._pods is not None:  # cgroups read, pod names asked (a quarter at most)
            self._pods.observe([(t.key, t.process.pid) for t in (*targets, *self._down)
                                if t.process is not None],
                               budget_s=self.options.timeout_s / 4)
        followers = {t.address: self._followers.setdefault(t.key, Follower()) for t in targets}
        # The poll, not only its fan-out, ends within --timeout: the scans
        # above and fan_out's guard margin (a quarter at most) come out of it.
        left = self.options.timeout_s * (1 - POLL_SLACK_S) - (time.monotonic() - started)
        self._bounded_clients(targets, followers, left)
        results: list[FanOutResult[tuple[str, Snapshot]]] = fan_out(
            [t.address for t in targets],
            timeout=max(0.05, left - min(FAN_OUT_MARGIN_S, left / 4)),
            call=Client.read_latest, max_workers=MAX_WORKERS, followers=followers,
            channels=self._channels)
        self._channels.keep_only(set(followers))
        fams: list[Iterator[Metric]] = [host_fams.chip_families(chips, self.options.labels)]
        health = []
        snaps = [r.value[1] if r.ok and r.value is not None else None for r in results]
        alive = {t.key for t in targets} | {key_of(p) for p in scan.processes}
        down = self._down
        identities = self._identities([*targets, *down], [*snaps, *(None for _ in down)],
                                      alive)
        for t, r, snap, labels in zip(targets, results, snaps, identities[:len(targets)],
                                      strict=True):
            if t.process is not None:
                self._chooser.answered(t.process, snap is not None,
                                       hung=isinstance(r.error, TimedOut))
            cut = ({"reply": 1} if isinstance(r.error, ReplyTooLarge)
                   else host_fams.cut_parts(snap.left_out if snap is not None else ()))
            self._took[t.key] = (r.seconds, cut)
            health.append(host_fams.TargetHealth(labels, snap is not None, r.seconds, cut))
            if snap is not None:
                state = self._states.setdefault(t.key, SeriesState())
                fams.append(families(snap, labels, state=state))
        # Skipped while it does not answer (backed off, or waiting for the
        # dial budget): still down, with its last try's seconds and cut parts
        # (only looked at: the look's timeout, nothing cut).
        for t, labels in zip(down, identities[len(targets):], strict=True):
            took, cut = self._took.get(t.key, (self._greet_s, {}))
            health.append(host_fams.TargetHealth(labels, False, took, cut, asked=False))
        for gone in [k for k in self._took if k not in alive]:
            del self._took[gone]
        live = {t.key for t in targets}  # a process not asked this poll starts afresh
        for gone in [k for k in self._states if k not in live]:
            del self._states[gone]
        for gone in [k for k in self._followers if k not in live]:
            del self._followers[gone]
        self.polls += 1
        self.last_poll_s = time.monotonic() - started
        skipped = Counter(s.reason for s in scan.skipped if not s.removed)
        for s in scan.skipped:
            if s.reason == discovery.BAD_DIRECTORY and str(s) not in self._warned:
                self._warned.add(str(s))
                log.warning("tpu-info exporter: not reading %s", s)
        fams.append(host_fams.target_families(health, self.options.labels, self.last_poll_s,
                                              self.polls, self.poll_errors, skipped,
                                              self._not_asked))
        grouped = host_fams.groups(itertools.chain.from_iterable(fams))
        merged = [host_fams.joined(g) for g in grouped]
        with self._lock:
            asked = list(self._bodies)
        # The formats scrapers asked for last time are encoded here, on the
        # poll's thread, so a scrape only sends bytes; only the families
        # that changed since the last poll are encoded again.
        self._encodings = {accept: self._encodings.get(accept)
                           or host_fams.PartsEncoding(accept) for accept, _ in asked}
        texts = {accept: enc.encode(grouped) for accept, enc in self._encodings.items()}
        bodies = {(accept, zipped): _zipped(texts[accept], zipped) for accept, zipped in asked}
        with self._lock:
            self._families = merged
            self._bodies = bodies
        _hand_back_memory()

    def _bounded_clients(self, targets: list[_Target], followers: Mapping[str, Follower],
                         timeout: float) -> None:
        """A client with this exporter's reply bound for each target without
        a kept one (fan-out takes the kept one; a failed one is closed)."""
        for t in targets:
            client = self._channels.take(t.address)
            if client is None:
                client = Client(t.address, timeout=max(timeout, 0.05),
                                max_message_bytes=MAX_REPLY_BYTES,
                                follower=followers[t.address])
            self._channels.put(client)

    # Serving -----------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The last poll's families (what prometheus_client's encoders read)."""
        with self._lock:
            current = self._families
        yield from current

    def body(self, accept: str, accept_encoding: str) -> tuple[bytes, str, str]:
        """The exposition of the last poll in the format the scraper asks for:
        encoded once per poll and format (by the poll itself for the formats
        asked before)."""
        _, content_type = choose_encoder(accept)
        zipped = "gzip" in accept_encoding
        key = (accept, zipped)
        with self._lock:
            bodies, current = self._bodies, self._families
        hit = bodies.get(key)
        if hit is None:
            hit = _encode(current, accept, zipped)
            if len(bodies) < MAX_FORMATS:  # a client inventing headers gets no cache
                bodies[key] = hit
        return hit, content_type, "gzip" if zipped else ""

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - the outermost layer: count, go on
                self.poll_errors += 1
                log.warning("tpu-info exporter: poll failed: %r", e)
            self._stop.wait(max(0.0, self.options.interval_s - (time.monotonic() - started)))

    def start(self, address: str, port: int, web: WebConfig | None = None) -> int:
        """Polls once, then serves on ``address:port`` (with ``web``'s TLS and
        basic auth, :mod:`tpu_info.net.webconfig`, its files read again when
        they change) and polls every interval on a daemon thread; returns the
        bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        page = landing_page("tpu-info exporter", (f"Host {self.options.host_label}: its "
                                                  "chips and hooked processes.",))
        live = LiveWebConfig(web) if web else None
        self._httpd = BoundedHttpServer(
            self.body, address, port, thread_name="tpu-info-exporter-http",
            tls=live if web and web.tls else None, authorize=live, landing=page)
        try:
            self.poll()
        except Exception as e:  # noqa: BLE001 - serve what the next poll finds
            self.poll_errors += 1
            log.warning("tpu-info exporter: first poll failed: %r", e)
        self._httpd.start()
        self._thread = threading.Thread(target=self._loop, name="tpu-info-exporter-poll",
                                        daemon=True)
        self._thread.start()
        return int(self._httpd.server_address[1])

    def stop(self) -> None:
        """Stops polling and serving (idempotent)."""
        self._stop.set()
        if self._httpd is not None:
            self._httpd.stop()
        if self._thread is not None:
            self._thread.join(self.options.timeout_s + 5.0)
        self._channels.close()


def _hand_back_memory() -> None:
    """Returns the heap glibc keeps after a poll decoded large answers (a
    32 MB answer each poll took the exporter from 56 to 353 MB without):
    when the RSS grew by :data:`TRIM_GROWTH_BYTES` since the last time (a
    trim of a large heap costs 10-25 ms; reading the RSS, microseconds)."""
    global _TRIM, _TRIMMED_AT
    if _TRIM is None:
        try:
            import ctypes

            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to hand back this way
            _TRIM = False
    if not callable(_TRIM):
        return
    rss = _rss_bytes()
    if rss is None or rss - _TRIMMED_AT > TRIM_GROWTH_BYTES:
        _TRIM(0)
        _TRIMMED_AT = _rss_bytes() or 0


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


TRIM_GROWTH_BYTES = 32 * 1024 * 1024
_TRIM: Callable[[int], int] | bool | None = None
_TRIMMED_AT = 0


def _encode(fams: list[Metric], accept: str, zipped: bool) -> bytes:
    encoder, _ = choose_encoder(accept)
    return _zipped(encoder(host_fams.FamilyList(fams)), zipped)  # type: ignore[arg-type]


def _zipped(body: bytes, zipped: bool) -> bytes:
    return gzip.compress(body, compresslevel=1) if zipped else body


def write_sd_file(path: Path, address: str, labels: Mapping[str, str]) -> None:
    """Writes Prometheus file-based service discovery for this exporter
    (``[{"targets": [address], "labels": {...}}]``), atomically: Prometheus
    never reads half a file.

    Raises:
        OSError: the file cannot be written.
    """
    doc = [{"targets": [address], "labels": dict(labels)}]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
