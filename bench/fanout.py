"""Fan-out: one round of snapshots from 32 monitored processes against one
target alone, same run.

    python bench/fanout.py [--smoke]

Starts N server processes (32; 8 with --smoke), each serving the real
``metrics.export`` server over a recorder holding 100 graphs and 20
distributions, into which a thread keeps recording as a training program
would (10 times a second: a sample into one distribution, an execution of
one graph, a step event), so each answer is built fresh and part of it
changed since the previous round. Then alternates ``fan_out(all N)`` with ``fan_out([one])`` and
prints the median of both and their ratio. Target: ratio <= 2.

It also prints two floors under that ratio, from what it measures: the CPU
a round needs spread over this machine's cores, and the decoding of each
answer, which a one-process Python client does holding the GIL, one answer
at a time, however many cores there are.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import psutil
from _common import ROOT, parser, verdict

from tpu_info.net.client import Client, fan_out
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire

SERVER = r"""
import json, random, sys, threading, time
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from metrics import export
from tpu_info.contract.model import Unit
rng = random.Random(1)
rec = Recorder()
for i in range(100):
    rec.ledger.compiled(f"{i:064x}", f"jit(f{i})", "jax", seconds=rng.random(),
                        signature=("x: f32[8,128]",))
for d in range(20):
    dist = rec.registry.distribution(f"Metric{d}", Unit.TIME_NS)
    for _ in range(500):
        dist.observe(rng.lognormvariate(13, 1.0))
ex = export.start(lambda since: build(rec, (), since), port=0, workers=2)
dists = [rec.registry.distribution(f"Metric{d}") for d in range(20)]
def train():
    while True:
        time.sleep(0.1)
        rng.choice(dists).observe(rng.lognormvariate(13, 1.0))
        i = rng.randrange(100)
        rec.ledger.executed(f"{i:064x}", f"jit(f{i})", "jax")
        rec.events.emit("step", value=1.0)
threading.Thread(target=train, daemon=True).start()
print(json.dumps({"address": ex.address}), flush=True)
sys.stdin.read()
ex.stop(grace=0)
"""


def start_servers(n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(n)]
    addresses = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("a server process did not start")
        addresses.append(json.loads(line)["address"])
    return procs, addresses


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def _decode_seconds(target: str, times: int = 30) -> tuple[float, float]:
    """Median seconds to turn one answer of ``target`` into model records:
    from scratch, and as a client that decoded the previous answer does."""
    cold, warm = [], []
    cache = wire.DecodeCache()
    with Client(target, timeout=10) as client:
        for _ in range(times):
            msg = client._monitor.GetSnapshot(pb.SnapshotRequest(), timeout=10)
            t = time.perf_counter()
            wire.snapshot_from_proto(msg)
            t1 = time.perf_counter()
            wire.snapshot_from_proto(msg, cache)
            warm.append(time.perf_counter() - t1)
            cold.append(t1 - t)
            time.sleep(0.05)  # the server records on meanwhile, as between rounds
    return statistics.median(cold), statistics.median(warm)


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 8 if args.smoke else 32
    rounds = 5 if args.smoke else 30
    t0 = time.perf_counter()
    procs, targets = start_servers(n)
    print(f"started {n} server processes in {time.perf_counter() - t0:.1f}s")
    try:
        for _ in range(2):  # warm up (first connections, imports)
            fan_out(targets, timeout=10)
        me = psutil.Process()
        servers = [psutil.Process(p.pid) for p in procs]
        cpu_client = cpu_servers = 0.0  # CPU seconds spent in the all-N rounds
        alone: list[float] = []
        all_: list[float] = []
        for _ in range(rounds):
            t = time.perf_counter()
            one = fan_out(targets[:1], timeout=10)
            alone.append(time.perf_counter() - t)
            c0, s0 = _cpu([me]), _cpu(servers)
            t = time.perf_counter()
            many = fan_out(targets, timeout=10)
            all_.append(time.perf_counter() - t)
            cpu_client += _cpu([me]) - c0
            cpu_servers += _cpu(servers) - s0
            failed = [r for r in one + many if not r.ok]
            if failed:
                print(f"failed: {failed[0].target}: {failed[0].error}")
                return 1
        a, m = statistics.median(alone), statistics.median(all_)
        print(f"one target alone: median {a * 1e3:.1f} ms; all {n}: median {m * 1e3:.1f} ms "
              f"({rounds} rounds)")
        cores = len(os.sched_getaffinity(0))
        per_round = (cpu_client + cpu_servers) / rounds
        print(f"CPU per all-{n} round: client {cpu_client / rounds * 1e3:.1f} ms "
              f"({cpu_client / rounds / n * 1e3:.2f} ms per target: channel, call, decode), "
              f"servers {cpu_servers / rounds * 1e3:.1f} ms; on {cores} cores no schedule "
              f"ends a round under {per_round / cores * 1e3:.1f} ms = "
              f"{per_round / cores / a:.1f}x one target alone")
        cold, warm = _decode_seconds(targets[0])
        print(f"decoding one answer holds the GIL {warm * 1e3:.2f} ms ({cold * 1e3:.2f} ms "
              f"for a first answer): a one-process Python client ends no round under one "
              f"target alone + {n - 1} decodes = {1 + (n - 1) * warm / a:.1f}x, on any "
              "number of cores")
        verdict(f"ratio fan-out({n}) / one", m / a, "<= 2", m / a <= 2.0)
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
