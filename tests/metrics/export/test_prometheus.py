"""The Prometheus collector and endpoint, down to a real Prometheus server
scraping a real hooked JAX program."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics.export import prometheus as prom
from metrics.recording.registry import Distribution
from tests.hooked import terminate
from tpu_info.contract.model import (
    CounterReading,
    DeviceRecord,
    GraphRecord,
    MemoryReading,
    ProcessRecord,
    Snapshot,
    Unit,
)

ROOT = Path(__file__).resolve().parents[3]


def make_snapshot(n_graphs: int = 3) -> Snapshot:
    compile_time = Distribution("CompileTime", Unit.TIME_NS, "Backend compile time.")
    for ns in (2_000_000, 30_000_000, 30_000_000, 4_000_000_000):
        compile_time.observe(ns)
    outbound = Distribution("OutboundData", Unit.BYTES)
    for b in (0, 1024, 4096, 4096, 5000):
        outbound.observe(b)
    graphs = tuple(
        GraphRecord(hash=f"{i:064x}", name=f"jit(f{i})", engine="jax", first_seen_unix=1.0,
                    last_seen_unix=2.0, compiles=i + 1, compile_seconds_total=float(i),
                    cache_hits=i, executions=(i if i % 2 else None))
        for i in range(n_graphs)
    )
    return Snapshot(
        taken_at_unix=100.0,
        process=ProcessRecord(pid=42, name="train.py", argv=("train.py",), host="h1",
                              user="me", engine="jax",
                              versions={"python": "3.11.7", "jax": "0.10.2"},
                              start_time_unix=50.0),
        devices=(
            DeviceRecord(0, "cpu", "cpu", MemoryReading(1000, None, 64_000, "live_arrays"),
                         busy_percent=25.0),
            DeviceRecord(1, "TPU v4", "tpu", MemoryReading(None, source="none",
                                                           reason="not reported")),
        ),
        counters=(CounterReading("UncachedCompile", 7, help="Graphs compiled."),
                  CounterReading("MarkStep", 3)),
        distributions=(compile_time.reading(0.0), outbound.reading(0.0)),
        graphs=graphs,
        last_seq=11,
        uptime_seconds=50.0,
    )


def scrape(snapshot_fn, top_graphs: int = prom.TOP_GRAPHS) -> dict[str, object]:
    reg = CollectorRegistry()
    reg.register(prom.SnapshotCollector(snapshot_fn, top_graphs))
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


# Names ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, unit, expected", [
    ("CompileTime", Unit.TIME_NS, "tpu_info_compile_time_seconds"),
    ("TransferToDeviceTime", Unit.TIME_NS, "tpu_info_transfer_to_device_time_seconds"),
    ("OutboundData", Unit.BYTES, "tpu_info_outbound_data_bytes"),
    ("UncachedCompile", Unit.NUMBER, "tpu_info_uncached_compile"),
    ("HLOExecTime", Unit.TIME_NS, "tpu_info_hlo_exec_time_seconds"),
    ("aten::copy.weird-name", Unit.NUMBER, "tpu_info_aten_copy_weird_name"),
])
def test_metric_names(name: str, unit: Unit, expected: str):
    assert prom.metric_name(name, unit) == expected


def test_edges_are_few_ascending_and_cover_each_units_range():
    # Classic histograms (prometheus_client writes native ones only in a text
    # Prometheus does not read): each edge is a series per histogram and
    # process (issue 30: 55 time edges made 700 of an idle process's 776).
    for unit, edges in prom.EDGES.items():
        assert list(edges) == sorted(edges) and len(edges) <= 25, unit
    assert prom.EDGES[Unit.TIME_NS][0] == 1e-5 and prom.EDGES[Unit.TIME_NS][-1] == 1000.0
    worst = {unit: max(b / a for a, b in itertools.pairwise(edges))
             for unit, edges in prom.EDGES.items()}
    assert worst[Unit.TIME_NS] <= 2.5 and worst[Unit.BYTES] <= 4.0, worst
    assert prom.EDGES[Unit.BYTES][-1] == 2.0 ** 40


# Histogram coarsening ------------------------------------------------------------------

def test_cumulative_buckets_exact_on_edges_and_within_one_fine_bucket_elsewhere():
    rng = random.Random(7)
    d = Distribution("X", Unit.BYTES)
    values = [4.0 ** rng.randint(0, 15) for _ in range(300)]           # exactly on edges
    values += [math.exp(rng.uniform(0, 30)) for _ in range(700)]        # anywhere
    for v in values:
        d.observe(v)
    r = d.reading(0.0)
    edges = prom.EDGES[Unit.BYTES]
    got = prom.cumulative_buckets(r, edges)
    gamma = r.buckets.gamma
    for edge, n in zip(edges, got, strict=True):
        exact_lo = sum(v <= edge / gamma for v in values)   # surely below
        exact_hi = sum(v <= edge * gamma for v in values)   # at most one bucket above
        assert exact_lo <= n <= exact_hi, edge
    assert got == sorted(got) and got[-1] <= r.count
    # Samples exactly on edges, alone: exact counts.
    d2 = Distribution("Y", Unit.BYTES)
    for v in values[:300]:
        d2.observe(v)
    assert prom.cumulative_buckets(d2.reading(0.0), edges) == [
        sum(v <= e for v in values[:300]) for e in edges]


def test_cumulative_buckets_time_scale_and_clamps():
    d = Distribution("T", Unit.TIME_NS)
    for ns in (3_000, 3_000, 7_000_000_000):
        d.observe(ns)
    edges = prom.EDGES[Unit.TIME_NS]
    got = dict(zip(edges, prom.cumulative_buckets(d.reading(0.0), edges, 1e-9), strict=True))
    assert got[1e-5] == 2 and got[2e-5] == 2
    assert got[5.0] == 2 and got[10.0] == 3 and got[1000.0] == 3
    d.observe(20_000_000_000)  # 20 s: on an edge
    got = dict(zip(edges, prom.cumulative_buckets(d.reading(0.0), edges, 1e-9), strict=True))
    assert got[10.0] == 3 and got[20.0] == 4


# The collector ----------------------------------------------------------------------

def test_collector_families():
    fams = scrape(make_snapshot)
    assert samples(fams["tpu_info_uncached_compile"])[("tpu_info_uncached_compile_total", ())] == 7
    assert fams["tpu_info_uncached_compile"].type == "counter"
    assert samples(fams["tpu_info_mark_step"])[("tpu_info_mark_step_total", ())] == 3
    assert samples(fams["tpu_info_events"])[("tpu_info_events_total", ())] == 11

    ct = fams["tpu_info_compile_time_seconds"]
    assert ct.type == "histogram"
    s = samples(ct)
    assert s[("tpu_info_compile_time_seconds_count", ())] == 4
    assert s[("tpu_info_compile_time_seconds_sum", ())] == pytest.approx(4.062)
    assert s[("tpu_info_compile_time_seconds_bucket", (("le", "0.001"),))] == 0
    assert s[("tpu_info_compile_time_seconds_bucket", (("le", "0.002"),))] == 1
    assert s[("tpu_info_compile_time_seconds_bucket", (("le", "0.02"),))] == 1
    assert s[("tpu_info_compile_time_seconds_bucket", (("le", "0.05"),))] == 3
    assert s[("tpu_info_compile_time_seconds_bucket", (("le", "+Inf"),))] == 4
    ob = samples(fams["tpu_info_outbound_data_bytes"])
    assert ob[("tpu_info_outbound_data_bytes_bucket", (("le", "1.0"),))] == 1   # the zero
    assert ob[("tpu_info_outbound_data_bytes_bucket", (("le", "1024.0"),))] == 2
    assert ob[("tpu_info_outbound_data_bytes_bucket", (("le", "4096.0"),))] == 4
    assert ob[("tpu_info_outbound_data_bytes_bucket", (("le", "16384.0"),))] == 5

    gc = samples(fams["tpu_info_graph_compiles"])
    [key] = [k for k in gc if dict(k[1])["name"] == "jit(f2)"]
    assert dict(key[1])["graph"] == f"{2:064x}"[:12] and dict(key[1])["engine"] == "jax"
    assert len(dict(key[1])["computation"]) == 12
    assert gc[key] == 3
    # only graphs whose calls are counted, and "other" (at zero)
    assert len(samples(fams["tpu_info_graph_executions"])) == 2
    assert samples(fams["tpu_info_graphs"])[("tpu_info_graphs", ())] == 3

    used = samples(fams["tpu_info_device_memory_used_bytes"])
    assert used == {("tpu_info_device_memory_used_bytes",
                     (("device", "0"), ("kind", "cpu"), ("platform", "cpu"),
                      ("source", "live_arrays"))): 1000}
    assert len(samples(fams["tpu_info_device_memory_limit_bytes"])) == 1
    assert samples(fams["tpu_info_device_memory_peak_bytes"]) == {}
    assert list(samples(fams["tpu_info_device_busy_ratio"]).values()) == [0.25]

    [(name, labels)] = samples(fams["tpu_info_process_info"]).keys()
    assert name == "tpu_info_process_info"
    assert dict(labels) == {"pid": "42", "name": "train.py", "program": "train.py",
                            "host": "h1", "user": "me", "engine": "jax", "python_version": "3.11.7",
                            "jax_version": "0.10.2"}
    assert samples(fams["tpu_info_process_start_time_seconds"]) == {
        ("tpu_info_process_start_time_seconds", ()): 50.0}


def test_graph_labels_are_bounded_to_the_first_graphs_plus_other():
    fams = scrape(lambda: make_snapshot(n_graphs=500))
    gc = samples(fams["tpu_info_graph_compiles"])
    assert len(gc) == prom.TOP_GRAPHS + 1
    other = gc.pop(("tpu_info_graph_compiles_total",
                    (("computation", "other"), ("engine", ""), ("graph", "other"),
              ("name", "other graphs"))))
    assert sorted(gc.values()) == [i + 1 for i in range(prom.TOP_GRAPHS)]  # the first seen
    assert other == sum(i + 1 for i in range(prom.TOP_GRAPHS, 500))
    assert samples(fams["tpu_info_graphs"])[("tpu_info_graphs", ())] == 500
    assert len(samples(scrape(make_snapshot, top_graphs=2)["tpu_info_graph_compiles"])) == 3


def test_registering_does_not_snapshot_and_failures_are_counted():
    calls = []

    def failing() -> Snapshot:
        calls.append(1)
        raise RuntimeError("boom")

    reg = CollectorRegistry()
    reg.register(prom.SnapshotCollector(failing))
    assert calls == []
    for expected in (1, 2):
        text = generate_latest(reg).decode()
        assert f"tpu_info_scrape_errors_total {float(expected)}" in text
    assert len(calls) == 2


# The HTTP endpoint --------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_http_binds_loopback_by_default_and_stops():
    with prom.start_http(make_snapshot, port=0, environ={}) as server:
        assert server.bind == "127.0.0.1"
        assert server.sockname[0] == "127.0.0.1"
        body = urllib.request.urlopen(server.url, timeout=10).read().decode()
        assert "tpu_info_uncached_compile_total 7.0" in body
        port = server.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_scrapes_share_one_body_a_second_and_bad_requests_get_one_line():
    import gzip

    calls = []

    def counted():
        calls.append(1)
        return make_snapshot()

    with prom.start_http(counted, port=0, environ={}) as server:
        request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert b"tpu_info_uncached_compile_total 7.0" in gzip.decompress(r.read())
        plain = urllib.request.urlopen(server.url, timeout=10).read()
        assert b"tpu_info_uncached_compile_total 7.0" in plain
        assert len(calls) <= 2  # one exposition per format and second, not per scrape
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"garbage\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        with pytest.raises(urllib.error.HTTPError, match="405"):
            urllib.request.urlopen(urllib.request.Request(server.url, data=b"x"), timeout=10)


def test_start_http_port_and_bind_from_environment(caplog):
    port = free_port()
    env = {"TPU_INFO_PROMETHEUS_PORT": str(port), "TPU_INFO_PROMETHEUS_BIND": "0.0.0.0"}
    with prom.start_http(make_snapshot, environ=env) as server:
        assert server.port == port and server.bind == "0.0.0.0"
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert "not loopback" in caplog.text
    with pytest.raises(ValueError, match="TPU_INFO_PROMETHEUS_PORT"):
        prom.start_http(make_snapshot, environ={"TPU_INFO_PROMETHEUS_PORT": "http"})


# A real Prometheus server -----------------------------------------------------------------

@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The ``prometheus`` binary, installed from Debian once if missing."""
    path = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                          if os.path.exists("/usr/bin/prometheus") else None)
    why = "prometheus is not on PATH"
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            subprocess.run(["apt-get", "update"], check=True, capture_output=True,
                           timeout=600, env=env)
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends",
                            "prometheus"], check=True, capture_output=True, timeout=900,
                           env=env)
        except (subprocess.SubprocessError, OSError) as e:
            why = f"apt-get install prometheus failed: {e}"
        path = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                              if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        msg = f"{why}; install the Debian package 'prometheus' to run this test"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


HOOKED_PROGRAM = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    import metrics
    from metrics.export import prometheus
    metrics.install()
    for n in range(3):
        jax.jit(lambda x, n=n: x * n + 1)(jnp.ones(8)).block_until_ready()
    server = prometheus.start_http(lambda: metrics.snapshot(events_since=2**62), port=0)
    print(server.port, metrics.counter_value("UncachedCompile"),
          metrics.snapshot().distribution("CompileTime").count, flush=True)
    sys.stdin.read()
    server.stop()
""")


def query(api_port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{api_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
def test_real_prometheus_scrapes_our_compile_counter(prometheus_binary: str, tmp_path: Path):
    program = subprocess.Popen([sys.executable, "-c", HOOKED_PROGRAM], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    prometheus = None
    try:
        line = program.stdout.readline().split()
        assert len(line) == 3, f"hooked program failed (exit {program.poll()})"
        target_port, compiles, compile_count = (int(x) for x in line)
        assert compiles >= 3
        config = tmp_path / "prometheus.yml"
        config.write_text(textwrap.dedent(f"""
            global:
              scrape_interval: 1s
              evaluation_interval: 1s
            scrape_configs:
              - job_name: tpu-info
                static_configs:
                  - targets: ["127.0.0.1:{target_port}"]
                    labels: {{host: test-host}}
        """))
        api_port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")
        prometheus = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{api_port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 90
        result: list[dict] = []
        while time.monotonic() < deadline:
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                result = query(api_port, "tpu_info_uncached_compile_total")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                result = []
            if result:
                break
            time.sleep(0.5)
        assert result, "Prometheus never returned our counter: " + \
            (tmp_path / "prometheus.log").read_text()[-2000:]
        [series] = result
        assert float(series["value"][1]) == compiles
        assert series["metric"]["job"] == "tpu-info"
        assert series["metric"]["host"] == "test-host"
        [hist] = query(api_port, "tpu_info_compile_time_seconds_count")
        assert float(hist["value"][1]) == compile_count
        [inf] = query(api_port, 'tpu_info_compile_time_seconds_bucket{le="+Inf"}')
        assert float(inf["value"][1]) == compile_count
        graphs = query(api_port, 'tpu_info_graph_compiles_total{graph!="other"}')
        assert 3 <= len(graphs) <= prom.TOP_GRAPHS
        assert all(g["metric"]["name"].startswith("jit(") for g in graphs)
        [up] = query(api_port, 'up{job="tpu-info"}')
        assert up["value"][1] == "1"
        # Present before they count (increase() sees the first one), and the
        # default process collector's series.
        [errors] = query(api_port, "tpu_info_hook_errors_total")
        assert errors["value"][1] == "0"
        assert query(api_port, 'process_cpu_seconds_total{job="tpu-info"}')
    finally:
        terminate(prometheus)
        program.communicate("", timeout=30)
    assert program.returncode == 0
