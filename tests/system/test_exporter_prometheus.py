"""A real Prometheus scrapes two ``tpu-info exporter``s standing in for two
hosts, each with two ranks of one 4-process JAX job (issue 17, item 1).

The ranks are started as a launcher starts them (``$RANK``/``$WORLD_SIZE``,
one JAX process each): the ranks of one ``jax.distributed`` job compile
with their own process index in XLA's options, so JAX's cache keys (our
graph hashes) differ between them even for one SPMD program (measured
here: 2 CPU processes, one global jit, two hashes). That path's
``process_index`` is tested in ``tests/metrics/test_ranks.py``.

Rank 1 compiles a graph of another shape than the rest; host B's rank 2
holds far more device memory than its neighbour. PromQL over what the
exporters serve must name that rank and that host. Prometheus finds the
exporters through the file_sd JSON they write (``--sd-file``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.sysfs_trees import MACHINES, build_sysfs
from tests.metrics.test_prometheus import free_port, prometheus_binary, query  # noqa: F401

RANK = textwrap.dedent("""
    import os, sys
    import jax
    import numpy as np
    import metrics
    metrics.install(engines=["jax"], port=0)
    f = jax.jit(lambda x: (x * 2).sum())  # the only graph: arrays come from numpy
    f(np.ones(int(os.environ["SHAPE"]), np.float32)).block_until_ready()
    keep = jax.device_put(np.zeros(int(os.environ["HOLD"]) // 4, np.float32))
    print("ready", flush=True)
    sys.stdin.read()
""")
MIB = 1 << 20
# (host, process index, shape, bytes held)
RANKS = [("hostA", 0, 8, 1 * MIB), ("hostA", 1, 16, 1 * MIB),
         ("hostB", 2, 8, 32 * MIB), ("hostB", 3, 8, 1 * MIB)]


def _wait_for(api_port: int, expr: str, ok, prometheus, log: Path, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    result: list[dict] = []
    while time.monotonic() < deadline:
        assert prometheus.poll() is None, log.read_text()[-2000:]
        try:
            result = query(api_port, expr)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            result = []
        if ok(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{expr} never gave what was expected: {result}\n"
                         + log.read_text()[-2000:])


@pytest.mark.slow
def test_prometheus_finds_the_odd_rank_and_the_uneven_host(prometheus_binary: str,  # noqa: F811
                                                           tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS="",
               WORLD_SIZE="4")
    sd = tmp_path / "sd"
    sd.mkdir()
    sysfs = build_sysfs(tmp_path, MACHINES["v5e"])
    procs: list[subprocess.Popen] = []
    urls: list[str] = []
    prometheus = None
    try:
        for host, index, shape, hold in RANKS:
            run = tmp_path / host
            run.mkdir(mode=0o700, exist_ok=True)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, cwd=ROOT, env=dict(env, TPU_INFO_RUNTIME_DIR=str(run),
                                              RANK=str(index), SHAPE=str(shape),
                                              HOLD=str(hold))))
        for p in procs:
            assert (p.stdout.readline() if p.stdout else "") == "ready\n", p.poll()
        for host in ("hostA", "hostB"):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tpu_info", "exporter", "--listen", "127.0.0.1:0",
                 "--runtime-dir", str(tmp_path / host), "--host-label", host,
                 "--job", "llama", "--interval", "1", "--timeout", "0.9", "--no-libtpu",
                 "--sysfs", str(sysfs), "--sd-file", str(sd / f"{host}.json")],
                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                env=env))
            line = procs[-1].stderr.readline() if procs[-1].stderr else ""
            assert "serving http://" in line, line
            urls.append(line.split("serving ")[1].split()[0])
        config = tmp_path / "prometheus.yml"
        config.write_text(textwrap.dedent(f"""
            global:
              scrape_interval: 1s
              evaluation_interval: 1s
            scrape_configs:
              - job_name: tpu-info
                honor_labels: true
                file_sd_configs:
                  - files: ["{sd}/*.json"]
                    refresh_interval: 1s
        """))
        api_port = free_port()
        log = tmp_path / "prometheus.log"
        prometheus = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{api_port}"],
            stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
        up = _wait_for(api_port, 'tpu_info_target_up{job="llama"} == 1',
                       lambda r: len(r) == 4, prometheus, log)
        assert {(s["metric"]["host"], s["metric"]["process_index"]) for s in up} == {
            (h, str(i)) for h, i, _, _ in RANKS}
        chips = query(api_port, "tpu_info_chip_hbm_total_bytes")
        assert {(s["metric"]["host"], s["metric"]["device"]) for s in chips} == {
            (h, f"tpu{i}") for h in ("hostA", "hostB") for i in range(4)}

        # The rank whose graph no other rank compiled.
        odd = query(api_port, "tpu_info_graph_compiles_total and on (graph) "
                    "(count by (graph) (tpu_info_graph_compiles_total) == 1)")
        assert {(s["metric"]["host"], s["metric"]["process_index"]) for s in odd} == {
            ("hostA", "1")}, query(api_port, "tpu_info_graph_compiles_total")
        # The host whose processes hold uneven device memory.
        per_process = "sum by (host, pid) (tpu_info_device_memory_used_bytes)"
        uneven = query(api_port, f"max by (host) ({per_process}) / "
                       f"min by (host) ({per_process}) > 4")
        assert [s["metric"]["host"] for s in uneven] == ["hostB"], uneven

        promtool = shutil.which("promtool")
        if promtool is not None:  # the Debian package ships it beside prometheus
            body = urllib.request.urlopen(urls[1], timeout=10).read()
            lint = subprocess.run([promtool, "check", "metrics"], input=body,
                                  capture_output=True, timeout=60)
            assert lint.returncode == 0, lint.stdout + lint.stderr
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(timeout=30)
            except subprocess.TimeoutExpired:
                prometheus.kill()
        for p in procs[4:]:
            p.terminate()
        for p in procs[:4]:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert [p.returncode for p in procs] == [0] * 6
