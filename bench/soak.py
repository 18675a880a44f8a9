"""Soak: 10 million samples, 10,000 distinct graphs, 1 million events into one
recorder; memory stays within the documented caps and the report and the
snapshot stay fast.

    python bench/soak.py [--smoke]

Targets: RSS growth < 64 MB; snapshot build < 50 ms; metrics_report < 100 ms.
"""

from __future__ import annotations

import random
import time

import numpy  # noqa: F401 - loaded in every JAX/PyTorch program; the fold uses it
import psutil
from _common import parser, verdict

from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from tpu_info.contract.model import RecompileCause, Unit
from tpu_info.outputs.textreport import metrics_report


def main() -> int:
    args = parser(__doc__).parse_args()
    scale = 100 if args.smoke else 1
    samples, graphs, events = 10_000_000 // scale, 10_000 // scale, 1_000_000 // scale
    proc = psutil.Process()
    rec = Recorder()
    rss0 = proc.memory_info().rss
    rng = random.Random(1)
    dists = [rec.registry.distribution(f"Metric{i}", Unit.TIME_NS) for i in range(20)]
    t0 = time.perf_counter()
    values = [rng.lognormvariate(12, 2) for _ in range(4096)]
    for i in range(samples):
        dists[i % 20].observe(values[i & 4095])
    t_samples = time.perf_counter() - t0
    for g in range(graphs):
        rec.ledger.compiled(f"{g:064x}", f"jit(f{g % 50})", "jax", 0.01,
                            (f"x: f32[{g}]",), RecompileCause(time.time(), "shape changed"))
        rec.ledger.executed(f"{g:064x}", f"jit(f{g % 50})", "jax")
    for e in range(events):
        rec.events.emit("step", value=float(e))
    rss1 = proc.memory_info().rss
    t1 = time.perf_counter()
    snap = build(rec)
    t_snap = (time.perf_counter() - t1) * 1e3
    t2 = time.perf_counter()
    text = metrics_report(snap)
    t_report = (time.perf_counter() - t2) * 1e3
    print(f"{samples:,} samples in {t_samples:.1f} s ({t_samples / samples * 1e9:.0f} ns each), "
          f"{graphs:,} graphs (ledger keeps {len(snap.graphs):,}, evicted "
          f"{rec.ledger.evicted:,}), {events:,} events "
          f"(ring keeps {len(rec.events.since(0)[0]):,})")
    widest = max(len(d.buckets.positive) for d in snap.distributions)
    print(f"buckets per distribution: max {widest}; report {len(text):,} chars")
    growth = (rss1 - rss0) / 2**20
    verdict("soak RSS growth MB", growth, "< 64", growth < 64)
    verdict("soak snapshot build ms", t_snap, "< 50", t_snap < 50)
    verdict("soak metrics_report ms", t_report, "< 100", t_report < 100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
