"""Attack: what one unprivileged local process can do to a hooked JAX
training program, serving in the program and from the helper process.

    python bench/attack.py [--seconds 10] [--smoke] [--modes thread,process]

For each way of serving (``thread``: ``install(serve=True)``, in the
program; ``process``: ``install(serve="process")``, the helper) one trainer
(bench/load.py's step, pinned to one core, soft limit of 1024 open files,
Prometheus on) is attacked from the other core, attack after attack:

- floods, 8 threads each: GetSnapshot with a different ``events_since``
  every call, ListMetrics, Prometheus scrapes, HTTP/1 garbage on the gRPC
  port, HTTP/2 pings. Step rate during the flood against the quiet windows
  just before and after it (side by side, same trainer);
- 40 StreamSnapshots calls that never read (zero window): does a real
  watcher still get a snapshot?
- 20,000 GetSnapshot calls over 10 zero-window connections: the program's
  RSS during and after;
- 1,100 idle TCP connections (half send the HTTP/2 preface) to the gRPC
  port, then 1,100 header-less HTTP/1 connections to /metrics: the
  program's peak fds and threads, and whether it survived.

The machine is shared: besides the step rate, each window reports steps
per CPU second of the whole program (all its threads), which other
processes on the machine do not move but serving inside the program does.

Targets: step-rate ratio >= 0.9 under every flood; the program never runs
out of file descriptors; RSS growth under the stalled calls < 100 MB.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
from _common import ROOT, parser, verdict

# the attack clients, shared with tests/system/test_hostile_clients.py
from tests import hostile_clients as hostile

TRAINER = r"""
import json, os, resource, sys, threading, time
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
import jax, jax.numpy as jnp, numpy as np, metrics
metrics.install(serve="process" if sys.argv[1] == "process" else True)
@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
w = jnp.ones((64, 64)); x = jnp.ones((32, 64))
for _ in range(50): w = step(w, x)
steps = [0]
train_cpu = [0.0]
failures = []
def train():
    global w
    while True:
        w = step(w, jax.device_put(np.ones((32, 64), np.float32))); metrics.mark_step()
        steps[0] += 1
        if steps[0] % 64 == 0:
            train_cpu[0] = time.thread_time()
            try:  # the program's own files: they must always open
                open(os.devnull).close()
            except OSError as e:
                failures.append(repr(e))
threading.Thread(target=train, daemon=True).start()
prom = metrics.prometheus_endpoint()
print(json.dumps({"address": metrics.exporter().address, "prometheus": prom.port}), flush=True)
for line in sys.stdin:  # each line: steps so far, the time, files that failed to open
    cpu = os.times()
    print(json.dumps({"steps": steps[0], "t": time.perf_counter(), "cpu": cpu[0] + cpu[1],
                      "train_cpu": train_cpu[0], "open_failures": len(failures)}), flush=True)
"""

FLOOD = r"""
import itertools, sys, time
sys.path.insert(0, sys.argv[4])
import grpc
from tests import hostile_clients as hostile
from tpu_info.proto import tpu_info_v1_pb2 as pb, tpu_info_v1_pb2_grpc as pb_grpc
kind, address, prom, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[5])
host, port = address.rsplit(":", 1)
port = int(port)
since = itertools.count(0, 7)
channels = {}
def stub():
    import threading
    me = threading.get_ident()
    if me not in channels:
        channels[me] = pb_grpc.MonitorStub(grpc.insecure_channel(address))
    return channels[me]
def snapshot():
    stub().GetSnapshot(pb.SnapshotRequest(events_since=next(since) % 5000), timeout=5)
def list_metrics():
    stub().ListMetrics(pb.ListMetricsRequest(), timeout=5)
def scrape():
    hostile.http_get("127.0.0.1", prom, timeout=5)
def garbage():
    with hostile.socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
        while s.recv(65536):
            pass
def pings():
    c = hostile.RawH2(host, port, window=None)
    for _ in range(1000):
        if not c.ping(100):
            break
    c.close()
def spin():  # the control: burns the attacker's core, never touches the program
    x = 0
    for i in range(20_000):
        x += i
work = {"snapshot": snapshot, "list": list_metrics, "scrape": scrape, "garbage": garbage,
        "ping": pings, "spin": spin}[kind]
print(hostile.flood(work, 8, seconds), flush=True)
"""

# "spin" is the control: a process that only burns the other core. What it
# costs the trainer (the two vCPUs of this VM share a physical core's caches
# and often its pipeline) is the machine's floor, not the hook's doing.
FLOODS = ["spin", "snapshot", "list", "scrape", "garbage", "ping"]
CPUS = sorted(os.sched_getaffinity(0))  # before this process pins itself to the attacker's core


def _pin(cpu: int) -> None:
    """As bench/load.py: the trainer on one core, the attack on the other."""
    os.sched_setaffinity(0, {CPUS[cpu % len(CPUS)]})


class Trainer:
    """The attacked program: ``.rate(seconds)``, ``.proc`` (psutil), ``.helpers``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_PORT="0", JAX_PLATFORMS="cpu",
                   TPU_INFO_PROMETHEUS_PORT=str(_free_port()),
                   TPU_INFO_RUNTIME_DIR=os.path.join("/tmp", f"tpu-info-attack-{os.getpid()}"))
        self.popen = subprocess.Popen([sys.executable, "-c", TRAINER, mode],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env=env, cwd=ROOT, preexec_fn=lambda: _pin(0))
        assert self.popen.stdout is not None
        info = json.loads(self.popen.stdout.readline())
        self.address: str = info["address"]
        self.host, port = self.address.rsplit(":", 1)
        self.host = "127.0.0.1" if self.host == "localhost" else self.host
        self.port = int(port)
        self.prometheus: int = info["prometheus"]
        self.proc = psutil.Process(self.popen.pid)
        self.helpers = self.proc.children() if mode == "process" else []
        for child in self.helpers:  # as bench/load.py: the helper gets the other core
            for thread in child.threads():
                os.sched_setaffinity(thread.id, {CPUS[1 % len(CPUS)]})

    def alive(self) -> bool:
        return self.popen.poll() is None

    def probe(self) -> dict:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write("?\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError("the trainer died")
        return json.loads(line)

    def rate(self, seconds: float) -> tuple[float, float, float]:
        """Steps per second; steps per CPU second of the whole program; and
        CPU seconds per second the program spent outside its training
        thread (serving, mostly: what other processes on this shared
        machine move least)."""
        a = self.probe()
        time.sleep(seconds)
        b = self.probe()
        steps, wall = b["steps"] - a["steps"], b["t"] - a["t"]
        cpu = b["cpu"] - a["cpu"]
        outside = cpu - (b["train_cpu"] - a["train_cpu"])
        return steps / wall, steps / max(1e-6, cpu), outside / wall

    def fds(self) -> int:
        return self.proc.num_fds()

    def threads(self) -> int:
        return self.proc.num_threads()

    def rss_mb(self) -> float:
        return self.proc.memory_info().rss / 2**20

    def helper_rss_mb(self) -> float:
        return sum(h.memory_info().rss for h in self.helpers if h.is_running()) / 2**20

    def stop(self) -> None:
        if self.alive():
            self.popen.kill()
        self.popen.wait(30)
        for h in self.helpers:
            try:
                h.wait(10)
            except psutil.Error:
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flood_ratio(t: Trainer, kind: str, seconds: float) -> dict:
    """Under ``kind`` against the quiet windows just before and after it:
    the step-rate ratio, the steps-per-program-CPU-second ratio, the
    program's CPU outside training (per second, quiet and under the flood);
    steps/s under it and the calls the flood made."""
    before = t.rate(seconds)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, kind, t.address, str(t.prometheus),
                              str(ROOT), str(seconds + 1.5)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                             preexec_fn=lambda: _pin(1))
    time.sleep(1.0)  # the flood's threads and connections start
    under = t.rate(seconds)
    calls = int(flood.communicate(timeout=seconds + 120)[0].strip() or 0)
    time.sleep(1.0)
    after = t.rate(seconds)
    quiet = [(x + y) / 2 for x, y in zip(before, after, strict=True)]
    return {"ratio": under[0] / quiet[0], "cpu_ratio": under[1] / quiet[1],
            "serving_quiet": quiet[2], "serving": under[2], "steps": under[0], "calls": calls}


def lockout(t: Trainer) -> str:
    """Whether a real watcher gets a snapshot while 40 streams never read."""
    from tpu_info.contract.errors import TpuInfoError
    from tpu_info.net.client import Client
    from tpu_info.proto import tpu_info_v1_pb2 as pb

    request = pb.StreamRequest(interval_ms=50).SerializeToString()
    conns = [hostile.RawH2(t.host, t.port, window=0) for _ in range(5)]
    try:
        for i in range(40):
            conns[i % 5].call("/tpu_info.v1.Monitor/StreamSnapshots", request)
        time.sleep(2.0)
        with Client(t.address, timeout=10) as c:
            next(iter(c.stream(interval_s=0.1, duration_s=10)))
        return "served"
    except (TpuInfoError, StopIteration) as e:
        return f"refused ({str(e).split(': ', 1)[-1][:60]})"
    finally:
        for c in conns:
            c.close()


def stalled_calls(t: Trainer, calls: int) -> tuple[float, float, float]:
    """RSS (MB) before, at the peak of, and 3 s after ``calls`` zero-window calls."""
    from tpu_info.proto import tpu_info_v1_pb2 as pb

    request = pb.SnapshotRequest().SerializeToString()
    rss = t.helper_rss_mb if t.helpers else t.rss_mb
    base = rss()
    conns = [hostile.RawH2(t.host, t.port, window=0) for _ in range(10)]
    peak = base
    for i in range(calls // 10):
        for c in conns:
            try:
                c.call("/tpu_info.v1.Monitor/GetSnapshot", request)
            except OSError:
                pass
        if i % 100 == 0:
            peak = max(peak, rss())
    for _ in range(20):
        time.sleep(0.1)
        peak = max(peak, rss())
    for c in conns:
        c.close()
    time.sleep(3.0)
    return base, peak, rss()


def connections(t: Trainer, port: int, kind: str) -> tuple[int, int, int, bool, int]:
    """Fds and threads before and at the peak of 1,100 connections of ``kind``;
    whether the program survived; its failed opens."""
    fds0, threads0 = t.fds(), t.threads()
    if kind == "idle":
        socks = hostile.idle_connections(t.host, port, 550)
        socks += hostile.idle_connections(t.host, port, 550, preface=True)
    else:
        socks = hostile.slowloris(t.host, port, 1100)
    peak_fds, peak_threads = fds0, threads0
    stop = time.monotonic() + 3.0
    try:
        while time.monotonic() < stop and t.alive():
            peak_fds, peak_threads = max(peak_fds, t.fds()), max(peak_threads, t.threads())
            time.sleep(0.1)
    except psutil.Error:
        pass
    hostile.close_all(socks)
    time.sleep(0.5)
    alive = t.alive()
    failures = t.probe()["open_failures"] if alive else -1
    return fds0, peak_fds, peak_threads - threads0, alive, failures


def run_mode(mode: str, seconds: float, stalled: int) -> dict:
    t = Trainer(mode)
    out: dict = {"mode": mode}
    quiet = t.rate(min(seconds, 3.0))
    print(f"[{mode}] quiet: {quiet[0]:.0f} steps/s, program CPU outside training "
          f"{quiet[2] * 1000:.0f} ms/s", flush=True)
    try:
        for kind in FLOODS:
            f = out[kind] = flood_ratio(t, kind, seconds)
            print(f"[{mode}] flood {kind:<8}: step-rate ratio {f['ratio']:.2f}, steps per "
                  f"program CPU second {f['cpu_ratio']:.2f}, program CPU outside training "
                  f"{f['serving_quiet'] * 1000:.0f} -> {f['serving'] * 1000:.0f} ms/s "
                  f"({f['steps']:.0f} steps/s under it; the flood made {f['calls']} calls)",
                  flush=True)
        out["lockout"] = lockout(t)
        print(f"[{mode}] 40 never-reading streams: a new watcher is {out['lockout']}", flush=True)
        base, peak, after = stalled_calls(t, stalled)
        who = "helper" if t.helpers else "program"
        out["stalled"] = (base, peak, after, t.rss_mb())
        print(f"[{mode}] {stalled} zero-window GetSnapshot calls: {who} RSS {base:.0f} MB -> "
              f"{peak:.0f} MB during, {after:.0f} MB after; program RSS {t.rss_mb():.0f} MB",
              flush=True)
        for kind, port in (("idle", t.port), ("slowloris", t.prometheus)):
            fds0, fds, threads, alive, failures = connections(t, port, kind)
            out[kind] = (fds0, fds, threads, alive, failures)
            print(f"[{mode}] 1,100 {kind} connections: program fds {fds0} -> {fds} "
                  f"(limit 1024), threads +{threads}, "
                  f"{'alive' if alive else 'DEAD'}, {failures} failed opens", flush=True)
            if not alive:
                break
    finally:
        t.stop()
    return out


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--modes", default="thread,process")
    args = ap.parse_args()
    seconds = 2.0 if args.smoke else args.seconds
    stalled = 2_000 if args.smoke else 20_000
    _pin(1)  # the attacker's core
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = [run_mode(m, seconds, stalled) for m in args.modes.split(",")]
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in results:
        mode = r["mode"]
        for kind in FLOODS:
            if kind in r:
                f = r[kind]
                verdict(f"attack step-rate ratio, {kind} flood, serve={mode}", f["ratio"],
                        ">= 0.9", f["ratio"] >= 0.9)
                verdict(f"attack steps/CPU-s ratio, {kind} flood, serve={mode}",
                        f["cpu_ratio"], ">= 0.9", f["cpu_ratio"] >= 0.9)
                extra = f["serving"] - f["serving_quiet"]
                verdict(f"attack serving CPU s/s added, {kind} flood, serve={mode}", extra,
                        "<= 0.1", extra <= 0.1)
        if "stalled" in r:
            base, peak, after, _ = r["stalled"]
            verdict(f"attack RSS growth MB, stalled calls, serve={mode}", peak - base, "< 100",
                    peak - base < 100)
        for kind in ("idle", "slowloris"):
            if kind in r:
                fds0, fds, threads, alive, failures = r[kind]
                verdict(f"attack peak fds, {kind} connections, serve={mode}", fds,
                        "< 1024, alive", fds < 1024 and alive and failures == 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
