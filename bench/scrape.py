"""Scrape cost: one GetSnapshot answer (snapshot built now + protobuf bytes)
against prometheus_client's generate_latest over the same recorder, same run.

    python bench/scrape.py [--smoke] [--pure-python]

Data: 1,000 graphs (signature, two causes each), 200 distributions of 2,000
log-normal samples each, 1,000 events, a few counters; between scrapes 10 %
of the distributions and 5 % of the graphs change. "ours" is what the
gRPC server does per request: ``metrics.recording.snapshot.build`` +
``encoder.snapshot_to_bytes`` with the server's ``PartCache``; "prometheus" is
``generate_latest`` over the project's ``SnapshotCollector`` reading the same
recorder. Targets: ours p99 <= 5 ms; ratio (ours p50 / prometheus p50) <= 1.

The server runs inside a JAX or PyTorch program, and both always load numpy,
which the hook then uses for bucket copies and percentiles; so numpy is
loaded here too. ``--pure-python`` measures without it. The garbage
collections that land inside a scrape are counted and timed: they set p99.
Each scrape's CPU time (this thread's) is printed beside its wall time: on
a machine other work loads, the wall p99 is the scheduler's, the CPU p99
what the scrape itself costs.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

from _common import parser, verdict
from prometheus_client import CollectorRegistry, generate_latest

from metrics.export.prometheus import SnapshotCollector
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build as build_snapshot
from tpu_info.contract.model import RecompileCause, Unit
from tpu_info.wire import encoder


def build_recorder(graphs: int, dists: int, samples: int) -> Recorder:
    rng = random.Random(7)
    rec = Recorder()
    for i in range(graphs):
        h = f"{i:064x}"
        for j in range(2):
            rec.ledger.compiled(h, f"jit(step_{i})", "jax", seconds=rng.random(),
                                signature=(f"x: f32[{j + 1},128]", "y: i32[]"),
                                cause=RecompileCause(time.time(), "x changed", f"train.py:{i}",
                                                     "x", "f32[1,128]", "f32[2,128]"))
        rec.ledger.executed(h, f"jit(step_{i})", "jax", n=10)
    for d in range(dists):
        dist = rec.registry.distribution(f"Metric{d}", Unit.TIME_NS, "help text")
        for _ in range(samples):
            dist.observe(rng.lognormvariate(13, 1.5))
    for c in range(20):
        rec.registry.counter(f"Counter{c}").inc(c + 1)
    for e in range(1000):
        rec.events.emit("step", value=float(e))
    return rec


def pct(xs: list[float], q: float) -> float:
    """numpy's default (linear) percentile; q in 0..1."""
    xs = sorted(xs)
    h = (len(xs) - 1) * q
    lo = int(h)
    return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--pure-python", action="store_true",
                   help="do not load numpy (the hook then copies and ranks buckets in Python)")
    args = p.parse_args()
    if not args.pure_python:
        import numpy  # noqa: F401  (as in every JAX or PyTorch program)
    rounds = 20 if args.smoke else 300
    rec = build_recorder(1000, 200, 300 if args.smoke else 2000)

    cache = encoder.PartCache()  # as the server keeps one
    rng = random.Random(3)
    dists = [rec.registry.distribution(f"Metric{d}") for d in range(200)]

    def train_a_little() -> None:
        # Between scrapes the program runs on: 10 % of the distributions and
        # 5 % of the graphs change, so unchanged-part reuse is not free lunch.
        for d in rng.sample(dists, 20):
            d.observe(rng.lognormvariate(13, 1.5))
        for i in rng.sample(range(1000), 50):
            rec.ledger.executed(f"{i:064x}", f"jit(step_{i})", "jax")

    def ours() -> int:
        snap = build_snapshot(rec, (), events_since=0)
        return len(encoder.snapshot_to_bytes(snap, cache))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: build_snapshot(rec, (), events_since=2**62)))

    def prom() -> int:
        return len(generate_latest(registry))

    size_ours, size_prom = ours(), prom()  # warm up
    inside, collections = [False], []  # (generation, ms) of collections inside ours()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if inside[0]:
            if phase == "start":
                collections.append((info["generation"], time.perf_counter()))
            else:
                gen, t = collections[-1]
                collections[-1] = (gen, (time.perf_counter() - t) * 1e3)

    gc.callbacks.append(on_gc)
    t_ours: list[float] = []
    t_prom: list[float] = []
    t_build: list[float] = []
    c_ours: list[float] = []
    c_prom: list[float] = []
    for _ in range(rounds):  # alternate so drift hits both alike
        train_a_little()
        inside[0] = True
        t0, c0 = time.perf_counter(), time.thread_time()
        ours()
        t1, c1 = time.perf_counter(), time.thread_time()
        inside[0] = False
        prom()
        t2, c2 = time.perf_counter(), time.thread_time()
        build_snapshot(rec, (), events_since=0)
        t3 = time.perf_counter()
        t_ours.append((t1 - t0) * 1e3)
        t_prom.append((t2 - t1) * 1e3)
        t_build.append((t3 - t2) * 1e3)
        c_ours.append((c1 - c0) * 1e3)
        c_prom.append((c2 - c1) * 1e3)
    gc.callbacks.remove(on_gc)
    # What a young collection costs when one does land in a scrape (in a real
    # program the training thread allocates too): one forced while a fresh
    # snapshot and its encoding are still alive.
    young: list[float] = []
    gc.collect(0)  # what the loop left young is not the scrape's
    for _ in range(10 if args.smoke else 50):
        train_a_little()
        snap = build_snapshot(rec, (), events_since=0)
        data = encoder.snapshot_to_bytes(snap, cache)
        t = time.perf_counter()
        gc.collect(0)
        young.append((time.perf_counter() - t) * 1e3)
        del snap, data
    p50, p99 = statistics.median(t_ours), pct(t_ours, 0.99)
    q50, q99 = statistics.median(t_prom), pct(t_prom, 0.99)
    print(f"rounds={rounds} graphs=1000 distributions=200 events=1000 "
          f"numpy={'no' if 'numpy' not in sys.modules else 'loaded'}")
    print(f"ours (build+proto+serialize): p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
          f"({size_ours / 1024:.0f} KiB); CPU p50 {statistics.median(c_ours):.2f} ms  "
          f"p99 {pct(c_ours, 0.99):.2f} ms")
    print(f"  of which snapshot.build:    p50 {statistics.median(t_build):.2f} ms  "
          f"p99 {pct(t_build, 0.99):.2f} ms")
    by_gen = {g: [ms for gen, ms in collections if gen == g] for g in (0, 1, 2)}
    print("  garbage collections inside: " + ", ".join(
        f"gen{g} {len(ms)} (max {max(ms):.2f} ms)" if ms else f"gen{g} 0"
        for g, ms in by_gen.items()) + f"; a young one forced in a scrape: median "
        f"{statistics.median(young):.2f} ms, max {max(young):.2f} ms")
    print(f"prometheus generate_latest:   p50 {q50:.2f} ms  p99 {q99:.2f} ms  "
          f"({size_prom / 1024:.0f} KiB); CPU p50 {statistics.median(c_prom):.2f} ms")
    verdict("ours p99 ms", p99, "<= 5", p99 <= 5.0)
    cpu99 = pct(c_ours, 0.99)
    verdict("ours CPU p99 ms (the machine's load aside)", cpu99, "<= 5", cpu99 <= 5.0)
    verdict("ratio ours/prometheus (p50)", p50 / q50, "<= 1", p50 / q50 <= 1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
