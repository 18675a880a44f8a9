"""A small fleet for tests: four ranks of one JAX job on two ``tpu-info
exporter``s (standing in for two hosts), scraped by a real Prometheus that
runs ``examples/prometheus/prometheus.yml`` (its paths and intervals
changed for the test): it finds the exporters through the file_sd JSON they
write (``--sd-file``) and loads the fleet kit's rules (issue 17, items 1
and 3).

The ranks are started as a launcher starts them (``$RANK``/``$WORLD_SIZE``,
one JAX process each) and step until their stdin closes: each step runs one
jitted computation, reads its result back (``float()``: the per-step sync)
and marks the step. What each rank does differently (:data:`RANKS`):

* hostA rank 1 also compiled a graph of another shape than the rest;
* hostB rank 2 holds 32 MiB of a 34 MiB device (CPU devices report live
  arrays over host RAM, so the rank sets its "host RAM" to 34 MiB: a nearly
  full accelerator we do not have), far more than its neighbour;
* hostB rank 3 steps slowly and re-jits its step every time (a recompile
  storm of one graph), with its hook's event log broken (hook errors).

Beside them: a hooked process on hostB that is stopped (SIGSTOP: its
exporter's ``tpu_info_target_up`` is 0) and a third exporter, hostC, killed
(SIGKILL) once Prometheus scraped it, whose file_sd entry stays (``up`` 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT
from tests.fixtures.sysfs_trees import MACHINES, build_sysfs
from tests.hooked import terminate
from tests.metrics.export.test_prometheus import free_port, query

EXAMPLE_CONFIG = ROOT / "examples" / "prometheus" / "prometheus.yml"
RULES = EXAMPLE_CONFIG.with_name("tpu-info-rules.yml")

RANK = textwrap.dedent("""
    import os, sys, threading
    import jax, jax.numpy as jnp
    import numpy as np
    import metrics
    rec = metrics.install(engines=["jax"], port=0)
    env = os.environ.get
    if env("HBM_LIMIT"):  # CPU: live arrays over host RAM; a small "RAM" is a full device
        import metrics.engines.jax.devices as devices
        devices.host_ram = lambda: int(env("HBM_LIMIT"))
    f = jax.jit(lambda x: (x * 2).sum())  # arrays come from numpy: no other graphs
    f(np.ones(int(env("SHAPE")), np.float32)).block_until_ready()
    keep = jax.device_put(np.zeros(int(env("HOLD")) // 4, np.float32))
    w = jax.device_put(np.ones((384, 384), np.float32))
    step = jax.jit(lambda w: jnp.tanh(w @ w).sum())
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    if env("BREAK_HOOK"):
        def broken(*args, **kwargs):
            raise RuntimeError("injected")
        rec.events.emit = broken
    print("ready", flush=True)
    while not done.wait(float(env("PAUSE"))):
        # STORM: jit inside the loop compiles the same graph every step
        fn = jax.jit(lambda w: jnp.tanh(w @ w).sum()) if env("STORM") else step
        float(fn(w))
        metrics.mark_step()
""")
STOPPED = textwrap.dedent("""
    import sys
    import metrics
    metrics.install(engines=[], port=0)
    print("ready", flush=True)
    sys.stdin.read()
""")
MIB = 1 << 20


@dataclass(frozen=True)
class Rank:
    host: str
    index: int
    shape: int
    hold: int
    extra: dict[str, str] = field(default_factory=dict)


RANKS = [Rank("hostA", 0, 8, 1 * MIB), Rank("hostA", 1, 16, 1 * MIB),
         Rank("hostB", 2, 8, 32 * MIB, {"HBM_LIMIT": str(34 * MIB)}),
         Rank("hostB", 3, 8, 1 * MIB, {"PAUSE": "0.4", "STORM": "1", "BREAK_HOOK": "1"})]


@dataclass
class Fleet:
    """What a test needs of the running fleet."""

    api_port: int
    urls: dict[str, str]  # exporter host label -> its /metrics URL
    prometheus: subprocess.Popen
    log: Path

    def query(self, expr: str) -> list[dict]:
        return query(self.api_port, expr)

    def wait_for(self, expr: str, ok: Callable[[list[dict]], bool],
                 seconds: float = 60.0) -> list[dict]:
        """Queries ``expr`` until ``ok(result)``; fails with Prometheus's log."""
        deadline = time.monotonic() + seconds
        result: list[dict] = []
        while time.monotonic() < deadline:
            assert self.prometheus.poll() is None, self.log.read_text()[-2000:]
            try:
                result = self.query(expr)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                result = []
            if ok(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{expr} never gave what was expected: {result}\n"
                             + self.log.read_text()[-2000:])


def example_config(sd: Path) -> str:
    """``examples/prometheus/prometheus.yml`` as the fleet runs it: its file_sd
    directory, its rules by absolute path, and 1 s intervals."""
    text = EXAMPLE_CONFIG.read_text()
    for old, new in (("/shared/tpu-info-sd", str(sd)), ("15s", "1s"),
                     ("refresh_interval: 1m", "refresh_interval: 1s"),
                     ('"tpu-info-rules.yml"', f'"{RULES}"')):
        assert old in text, old
        text = text.replace(old, new)
    return text


def _exporter(host: str, tmp: Path, sysfs: Path, sd: Path, env: dict[str, str]
              ) -> tuple[subprocess.Popen, str]:
    run = tmp / host
    run.mkdir(mode=0o700, exist_ok=True)
    p = subprocess.Popen(
        [sys.executable, "-m", "tpu_info", "exporter", "--listen", "127.0.0.1:0",
         "--runtime-dir", str(run), "--host-label", host, "--job", "llama",
         "--interval", "1", "--timeout", "0.9", "--no-libtpu", "--sysfs", str(sysfs),
         "--sd-file", str(sd / f"{host}.json")],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    line = p.stderr.readline() if p.stderr else ""
    assert "serving http://" in line, line
    return p, line.split("serving ")[1].split()[0]


@contextmanager
def running_fleet(tmp: Path, prometheus_binary: str) -> Iterator[Fleet]:
    """Starts the fleet, waits until Prometheus sees it whole (every rank
    up, the stopped process down, hostC's exporter down), yields it, and
    stops everything; every process but the killed ones must exit 0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS="",
               WORLD_SIZE="4")
    sd = tmp / "sd"
    sd.mkdir()
    sysfs = build_sysfs(tmp, MACHINES["v5e"])
    ranks: list[subprocess.Popen] = []
    exporters: list[subprocess.Popen] = []
    stopped = killed = prometheus = None
    try:
        for r in RANKS:
            (tmp / r.host).mkdir(mode=0o700, exist_ok=True)
            ranks.append(subprocess.Popen(
                [sys.executable, "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, cwd=ROOT, env={**env, "TPU_INFO_RUNTIME_DIR": str(tmp / r.host),
                                          "RANK": str(r.index), "SHAPE": str(r.shape),
                                          "HOLD": str(r.hold), "PAUSE": "0.1", **r.extra}))
        stopped = subprocess.Popen(
            [sys.executable, "-c", STOPPED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=ROOT, env={**env, "TPU_INFO_RUNTIME_DIR": str(tmp / "hostB")})
        for p in [*ranks, stopped]:
            assert (p.stdout.readline() if p.stdout else "") == "ready\n", p.poll()
        stopped.send_signal(signal.SIGSTOP)
        urls = {}
        for host in ("hostA", "hostB", "hostC"):
            p, urls[host] = _exporter(host, tmp, sysfs, sd, env)
            exporters.append(p)
        killed = exporters.pop()
        config = tmp / "prometheus.yml"
        config.write_text(example_config(sd))
        log = tmp / "prometheus.log"
        api_port = free_port()
        fleet = Fleet(api_port, urls, subprocess.Popen(
            [prometheus_binary, f"--config.file={config}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{api_port}"],
            stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=tmp), log)
        prometheus = fleet.prometheus
        fleet.wait_for('up{host="hostC"} == 1', lambda r: len(r) == 1)
        killed.kill()  # its file_sd entry stays, as a crashed exporter's does
        fleet.wait_for('up{host="hostC"} == 0', lambda r: len(r) == 1)
        fleet.wait_for('tpu_info_target_up{job="llama"} == 1', lambda r: len(r) == 4)
        fleet.wait_for('tpu_info_target_up{job="llama"} == 0', lambda r: len(r) == 1)
        yield fleet
    finally:
        terminate(prometheus)
        if killed is not None and killed.poll() is None:
            killed.kill()
        for p in exporters:
            p.terminate()
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        for p in [*ranks, *([stopped] if stopped else [])]:
            if p.stdin:
                p.stdin.close()
        waited = [*exporters, *ranks, *([stopped] if stopped else [])]
        for p in waited:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert [p.returncode for p in waited] == [0] * len(waited)
